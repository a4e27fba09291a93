"""The model manager's side of ensembles: composing models loaded first, dependents stopped and
brought back, `unload_dependents`.

As Triton: loading an ensemble loads the composing models that are not loaded yet (recursively);
a composing model that goes away takes the ensembles over it down with a reason, and brings them
back when it loads again; a composing model that reloads makes the ensembles over it re-check
their steps; `unload_dependents` unloads what was loaded only for ensembles and is no longer
used. Everything here runs under the manager's lock, from its load and unload paths.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from host.ensemble.model import EnsembleVersion
from host.ensemble.plan import ConfigLookup
from host.errors import HostError, InvalidArgumentError
from host.model import READY

if TYPE_CHECKING:
    from host.manager import ModelEntry, ModelManager
    from host.proto import model_config_pb2

log = logging.getLogger(__name__)


class CycleError(InvalidArgumentError):
    """Ensembles that need each other: reported as it is, not as a composing model's failure."""


class Dependencies:
    def __init__(self, manager: ModelManager) -> None:
        self.manager = manager
        self._chains = threading.local()

    @property
    def loading(self) -> list[str]:
        """The models this thread is loading, outermost first (cycles). Per thread: loads of
        different models run in parallel (host.manager), each with its own chain."""
        chain = getattr(self._chains, "names", None)
        if chain is None:
            chain = self._chains.names = []
        return chain

    def load_composing(self, name: str, cfg: model_config_pb2.ModelConfig) -> None:
        """Load what ensemble `name` needs that is not loaded yet, with Triton's errors."""
        wanted = list(dict.fromkeys(self.step_key(name, step) for step in cfg.ensemble_scheduling.step))
        for dep in wanted:
            if dep in self.loading:
                raise CycleError(f"circular dependency between ensembles: {dep} -> ... -> "
                                 f"{name} -> {dep}")
        models = self.manager._models
        missing = [d for d in wanted if (e := models.get(d)) is None or e.location is None]
        if missing:
            raise InvalidArgumentError(f"ensemble {name} contains models that are not available "
                                       f"or ambiguous: {', '.join(sorted(missing))}")
        for dep in wanted:
            if models[dep].default_version() is not None:
                continue
            try:
                self.manager._load(dep, None, None, explicit=False)
            except CycleError:
                raise
            except HostError as exc:
                raise InvalidArgumentError(
                    f"ensemble '{name}' depends on '{dep}' which has no loaded version. Model "
                    f"'{dep}' loading failed with error: {exc}") from None

    def step_key(self, ensemble: str, step: model_config_pb2.ModelEnsembling.Step) -> str:
        """The key of the model that a step of `ensemble` uses: its name. As Triton, the step's
        `model_namespace` is set to the namespace its model was found in, which is none without
        namespacing (host.namespacing finds it by repository)."""
        step.ClearField("model_namespace")
        return step.model_name

    def config_lookup(self, ensemble: str) -> ConfigLookup:
        """How `ensemble`'s plan finds a composing model's loaded configuration."""
        def lookup(name: str, version: int) -> model_config_pb2.ModelConfig:
            entry = self.manager._models.get(name)
            mv = None if entry is None else (
                entry.default_version() if version < 0 else entry.versions.get(version))
            if mv is None or mv.state != READY:
                raise InvalidArgumentError(
                    f"ensemble '{ensemble}' depends on '{name}' which has no loaded version."
                    if version < 0 else
                    f"ensemble '{ensemble}' depends on '{name}' whose required version {version} "
                    "is not loaded.")
            return mv.config
        return lookup

    def users(self, name: str) -> list[ModelEntry]:
        """Entries with a loaded ensemble version that has `name` as a step."""
        return [e for e in self.manager._models.values()
                if any(isinstance(v, EnsembleVersion) and name in v.composing
                       for v in e.versions.values())]

    def model_loaded(self, name: str) -> None:
        """`name` loaded: ensembles that went down with it come back, and those over it re-check
        their steps against its new configuration."""
        users = {e.name for e in self.users(name)}
        for entry in list(self.manager._models.values()):
            if entry.name in self.loading or entry.name == name:
                continue
            back = name in entry.waiting_on
            entry.waiting_on.discard(name)
            if (back and not entry.waiting_on) or entry.name in users:
                try:
                    self.manager._load(entry.name, None, None, explicit=False)  # re-checked
                except HostError as exc:
                    log.error("ensemble '%s' did not load again after '%s' loaded: %s",
                              entry.name, name, exc)

    def model_unloaded(self, name: str) -> None:
        """A model went away: the ensembles that use it stop serving, saying why."""
        for entry in self.users(name):
            reason = f"unloaded: its composing model '{name}' was unloaded"
            for mv in list(entry.versions.values()):
                self.manager._unload_version(mv, reason)
                entry.failed[mv.version] = reason
            entry.versions = {}
            entry.waiting_on.add(name)
            self.model_unloaded(entry.name)

    def unload_unused(self, names: list[str]) -> list[threading.Thread]:
        """`unload_dependents`: composing models loaded only for ensembles that no loaded
        ensemble uses any more are unloaded too (their own composing models with them). Called
        with the repository lock held: returns the versions' finishers, for the outermost
        unload to wait for once it has let go of the lock (a finisher takes the lock to end)."""
        pending: list[threading.Thread] = []
        for name in names:
            entry = self.manager._models.get(name)
            if entry is None or entry.explicit or not entry.versions or self.users(name):
                continue
            pending += self.manager._unload_entry(name, unload_dependents=True)
        return pending


def composing_of(entry: ModelEntry) -> list[str]:
    """The composing models of an entry's loaded ensemble versions (none for other models)."""
    return sorted({m for v in entry.versions.values() if isinstance(v, EnsembleVersion)
                   for m in v.composing})
