"""Version policy: its default, and which versions on disk it selects."""

from __future__ import annotations

from typing import Iterable

from host.errors import InvalidArgumentError
from host.proto.model_config_pb2 import ModelConfig, ModelVersionPolicy


def default_policy(cfg: ModelConfig) -> None:
    """Triton's default when a config names none: the latest version."""
    if not cfg.HasField("version_policy"):
        cfg.version_policy.latest.num_versions = 1


def select_versions(policy: ModelVersionPolicy, available: Iterable[int]) -> list[int]:
    """Apply a ModelVersionPolicy (latest N / all / specific) to the versions on disk."""
    available = sorted(available)
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        return available
    if which == "specific":
        wanted = sorted(set(policy.specific.versions))
        missing = [v for v in wanted if v not in available]
        if missing:
            raise InvalidArgumentError(
                f"version policy names version(s) {missing} that have no folder on disk")
        return wanted
    n = policy.latest.num_versions if which == "latest" else 1
    if n < 1:
        raise InvalidArgumentError("version policy 'latest' needs num_versions >= 1")
    return available[-n:]
