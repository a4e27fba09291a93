"""Model file overrides: a load request that carries the model's files (`file:<path>` parameters).

As in Triton, the files form the whole model folder: they are written to a private temporary
directory (never outside it), the model loads from there with the load's `config` (required),
and the directory is removed when the model unloads or is loaded again. Unlike Triton, the total
size is bounded (by the server's input limit), and errors name their cause (see
docs/triton_compat.md). Texts: Triton core, model_repository_manager.cc (LocalizeRepoAgent).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from host.errors import InternalError, InvalidArgumentError

log = logging.getLogger(__name__)

PREFIX = "file:"
CONFIG_REQUIRED = "Load parameter 'config' must be specified for model file override"


def check_model_name(name: str) -> None:
    """Triton's ValidateModelName, run on every load."""
    if not name.strip():
        raise InvalidArgumentError("Model name cannot be empty. Please enter a valid name to deploy.")
    # Triton refuses ".." and "/" only; a NUL cannot be in a file name at all.
    if name.strip() == ".." or "/" in name or "\x00" in name:
        raise InvalidArgumentError(
            f"invalid model name '{name}', model name must not contain path traversal characters")


def write(name: str, files: dict[str, bytes], limit: int) -> Path:
    """Write `files` (relative path -> content) into a new private directory and return it."""
    total = sum(len(content) for content in files.values())
    if total > limit:
        raise InvalidArgumentError(
            f"the override files of model '{name}' total {total} bytes, more than the {limit} "
            "bytes allowed. Use --http-max-input-size to increase the limit.")
    root = Path(tempfile.mkdtemp(prefix="modelhost-override-"))  # mode 0700: this user's only
    relpath = ""
    try:
        for relpath, content in files.items():
            _write_one(root, relpath, content)
    except OSError as exc:
        remove(root)
        # A name longer than NAME_MAX, a full disk (the load answers it as Triton does).
        raise InternalError(f"cannot write '{PREFIX}{relpath}': {exc.strerror}") from None
    except BaseException:
        remove(root)
        raise
    return root


def _write_one(root: Path, relpath: str, content: bytes) -> None:
    key = PREFIX + relpath
    # Triton joins the name to the model's directory with its JoinPath, which drops a leading
    # '/': 'file:/1/model.py' is 1/model.py (Triton's model-control QA loads models so).
    relpath = relpath.lstrip("/")
    parts = relpath.replace("\\", "/").split("/")
    if (not relpath or "\x00" in relpath or ".." in parts
            or not parts[-1] or parts[-1] == "."):
        target = os.path.normpath(os.path.join(root, relpath.replace("\x00", "")))
        raise InvalidArgumentError(
            f"Invalid file parameter '{key}' with normalized path '{target}' must stay within "
            "model directory.")
    path = root.joinpath(*[p for p in parts if p not in ("", ".")])
    # An OSError here (a name longer than NAME_MAX...) is answered by write().
    if path.parent.exists() and not path.parent.is_dir():
        raise InvalidArgumentError(
            f"Invalid file parameter '{key}', directory has been created as a file")
    if path.is_dir():
        raise InvalidArgumentError(f"Invalid file parameter '{key}', a directory of that name exists")
    path.parent.mkdir(parents=True, exist_ok=True)
    # O_NOFOLLOW | O_EXCL: nothing in the fresh directory can redirect the write elsewhere.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(content)


def remove(root: Path | None) -> None:
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)
        log.debug("removed the override directory %s", root)
