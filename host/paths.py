"""The one rule for files a model configuration names: they live inside the model's directory.

A configuration can arrive with a load request (explicit mode), so every file name in it is
client input: `default_model_filename`, label files, `initial_state` data files, native backend
libraries, the python backend's `EXECUTION_ENV_PATH`. Without this rule a load request could make
the server import or dlopen any file on disk. `resolve_inside` is the single check every loader
calls before it opens such a file.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from host.errors import InvalidArgumentError

# Triton's python backend expands this in EXECUTION_ENV_PATH to the model's directory.
MODEL_DIRECTORY_VARIABLE = "$$TRITON_MODEL_DIRECTORY"


def resolve_inside(directory: str | os.PathLike[str], name: str | os.PathLike[str], what: str,
                   under: str = "") -> Path:
    """`directory / under / name` once it is known to stay inside `directory`, symlinks resolved.

    `directory` is the model's directory; `under` a folder of it the name is relative to (the
    version folder for model files, `initial_state` for state data files).

    Refused (InvalidArgumentError, naming `what`): an empty name, an absolute path, a `..`
    component, or a path whose real location (after following every symlink) is outside the
    real location of `directory`. The file need not exist: callers check that themselves, with
    their own messages. Returns the path as named (under `directory`), not the resolved one, so
    messages show the name the configuration used.
    """
    text = os.fspath(name)
    if not text or "\x00" in text:
        raise InvalidArgumentError(f"{what} '{text}' is not a valid file name")
    if os.path.isabs(text) or text.startswith("~"):
        raise InvalidArgumentError(
            f"{what} '{text}' must be a path relative to the model directory, not an absolute path")
    if ".." in PurePosixPath(text.replace(os.sep, "/")).parts:
        raise InvalidArgumentError(
            f"{what} '{text}' must stay inside the model directory: '..' is not allowed")
    path = Path(directory) / under / text
    if not is_inside(directory, path):
        raise InvalidArgumentError(
            f"{what} '{text}' resolves to '{os.path.realpath(path)}', outside the model directory "
            f"'{os.path.realpath(directory)}' (a symbolic link that leaves the model directory is "
            "not allowed)")
    return path


def is_inside(directory: str | os.PathLike[str], path: str | os.PathLike[str]) -> bool:
    """Whether `path`, symlinks resolved, is `directory` or lies under it."""
    root = os.path.realpath(directory)
    real = os.path.realpath(path)
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def check_config_files(model_dir: str | os.PathLike[str], version: int, config) -> None:
    """Every file a model configuration names, checked before any backend sees the config."""
    if config.default_model_filename:
        resolve_inside(model_dir, config.default_model_filename, "default_model_filename",
                       under=str(version))
    # label_filename: host.classification.load_labels applies this rule (is_inside) with
    # Triton's own message, when the model version is created.
    if config.WhichOneof("scheduling_choice") == "sequence_batching":
        for state in config.sequence_batching.state:
            for initial in state.initial_state:
                if initial.data_file:
                    resolve_inside(model_dir, initial.data_file,
                                   f"initial_state data_file of state '{state.input_name}'",
                                   under="initial_state")
    env = config.parameters.get("EXECUTION_ENV_PATH")
    if env is not None and env.string_value:
        execution_env_path(model_dir, env.string_value)
    if config.backend:
        check_backend_name(config.backend)


def execution_env_path(model_dir: str | os.PathLike[str], value: str) -> Path:
    """The python backend's EXECUTION_ENV_PATH: `$$TRITON_MODEL_DIRECTORY/<name>` or a relative
    name, inside the model directory (an archive or folder elsewhere on disk is refused)."""
    name = value
    if name.startswith(MODEL_DIRECTORY_VARIABLE):
        name = name[len(MODEL_DIRECTORY_VARIABLE):].lstrip("/")
    return resolve_inside(model_dir, name, "EXECUTION_ENV_PATH")


def check_backend_name(name: str) -> None:
    """A backend name becomes part of a library path (`libtriton_<name>.so`): no separators."""
    if not name or "/" in name or "\\" in name or "\x00" in name or name in (".", ".."):
        raise InvalidArgumentError(f"invalid backend name '{name}'")
