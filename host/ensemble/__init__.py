"""Ensembles (`platform: "ensemble"`): load-time checks, the step graph, and its scheduler."""

from host.ensemble.model import EnsembleVersion
from host.ensemble.plan import Plan, build_plan
from host.ensemble.runtime import EnsembleRuntime

__all__ = ["EnsembleRuntime", "EnsembleVersion", "Plan", "build_plan"]
