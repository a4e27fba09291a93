"""Version policy: its default, and which versions on disk it selects."""

from __future__ import annotations

import logging
from typing import Iterable

from host.errors import InvalidArgumentError
from host.proto.model_config_pb2 import ModelConfig, ModelVersionPolicy

log = logging.getLogger(__name__)


def default_policy(cfg: ModelConfig) -> None:
    """Triton's default when a config names none: the latest version."""
    if not cfg.HasField("version_policy"):
        cfg.version_policy.latest.num_versions = 1


def select_versions(policy: ModelVersionPolicy, available: Iterable[int], model: str) -> list[int]:
    """Apply a ModelVersionPolicy (latest N / all / specific) to the versions on disk, as
    Triton's VersionsToLoad: a specific version without a folder is logged and skipped; none
    at all fails the load."""
    available = sorted(available)
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        chosen = available
    elif which == "specific":
        chosen = []
        for version in sorted(set(policy.specific.versions)):
            if version in available:
                chosen.append(version)
            else:
                log.error("version %d is specified for model '%s', but the version directory is "
                          "not present", version, model)
    else:
        n = policy.latest.num_versions if which == "latest" else 1
        chosen = available[-n:] if n > 0 else []
    if not chosen:
        raise InvalidArgumentError(
            f"at least one version must be available under the version policy of model '{model}'")
    return chosen
