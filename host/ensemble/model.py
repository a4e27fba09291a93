"""An ensemble's loaded version: no backend and no instances, its scheduler runs the steps."""

from __future__ import annotations

from typing import TYPE_CHECKING

from host import config_support
from host.ensemble.plan import ConfigLookup, Plan, build_plan
from host.ensemble.scheduler import EnsembleScheduler, StepRunner
from host.model import READY, ModelVersion

if TYPE_CHECKING:
    from host.backend import ModelSpec


class EnsembleVersion(ModelVersion):
    def __init__(self, spec: ModelSpec, runner: StepRunner, lookup: ConfigLookup) -> None:
        super().__init__(spec)
        self.stats.ensemble = True  # its failures are counted as OTHER, as Triton counts them
        self.runner, self.lookup = runner, lookup
        self.plan: Plan | None = None

    def load(self, backend: object = None) -> None:
        """Check the steps against the loaded composing models, then serve."""
        config_support.check(self.config)  # an ensemble ignores no field silently either
        self.plan = plan = build_plan(self.config, self.lookup)
        # As Triton, the loaded config says whether the ensemble is decoupled (any step is).
        self.config.model_transaction_policy.decoupled = plan.decoupled
        self.decoupled = plan.decoupled
        self.scheduler = EnsembleScheduler(self, plan, self.runner)  # type: ignore[assignment]
        self.state = READY

    @property
    def composing(self) -> list[str]:
        return sorted({s.model_name for s in self.plan.steps}) if self.plan is not None else []
