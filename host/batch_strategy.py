"""Which custom batching strategy library a model uses (Triton's rules, backend_model.cc).

- The model configuration parameter `TRITON_BATCH_STRATEGY_PATH` names it; the path (relative
  to the server's working directory, as in Triton) must stay inside the model's directory and
  exist.
- Otherwise the first `batchstrategy.so` in the version directory, the model directory, then
  the backend's directory (<backend directory>/<backend name>).
- A model with `sequence_batching` may not name one (and a found `batchstrategy.so` is not used).

The library itself is loaded by the backend model (`host.backend.Model.load_batch_strategy`: only
native backends can, see host.native.batching) and consulted by `host.scheduler.DynamicBatcher`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from host.backend import ModelSpec
from host.errors import InvalidArgumentError, NotFoundError

log = logging.getLogger(__name__)

PARAMETER = "TRITON_BATCH_STRATEGY_PATH"
LIBRARY_NAME = "batchstrategy.so"


def find(spec: ModelSpec, backend_directory: Path | None) -> Path | None:
    """The strategy library for the model, or None; raises Triton's load errors."""
    config = spec.config
    named = PARAMETER in config.parameters
    if config.WhichOneof("scheduling_choice") == "sequence_batching":
        if named:
            raise InvalidArgumentError(
                f"{PARAMETER} cannot be specified with sequence batcher, using default batching "
                "strategy")
        return None
    if named:
        path = config.parameters[PARAMETER].string_value
        if not path:
            raise InvalidArgumentError("Parent path and child path must be non-empty")
        if _escapes(path, spec.path):
            raise InvalidArgumentError("Batching library path escapes model repository.")
        if not os.path.exists(path):
            raise NotFoundError(f"Batching library path not found: {path}")
        return Path(path)
    for directory in (spec.version_path, spec.path, backend_directory):
        if directory is not None and (directory / LIBRARY_NAME).exists():
            return directory / LIBRARY_NAME
    return None


def _escapes(child: str, parent: Path) -> bool:
    """Triton's IsChildPathEscapingParentPath: both made canonical (links resolved), the child
    must be the parent or lie under it."""
    canonical_child = os.path.realpath(child)
    canonical_parent = os.path.realpath(parent)
    return not (canonical_child == canonical_parent
                or canonical_child.startswith(canonical_parent.rstrip("/") + "/"))
