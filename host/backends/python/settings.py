"""--backend-config settings of the python backend, checked as Triton's python backend checks them.

Triton's settings size the shared memory between the server and each model's stub process, the
stub's start-up timeout and a thread pool. Models run inside the server process by default, so
there is no stub: the settings are accepted, an invalid value still fails the load with Triton's
message (so a command line that Triton refuses is refused here too), and the log says that they
change nothing. In process mode (`execution-mode`, below) `shm-default-byte-size` sizes each
instance's shared-memory arenas.
"""

from __future__ import annotations

import logging
from typing import Any

from host.errors import InvalidArgumentError

log = logging.getLogger(__name__)

# setting -> (smallest value, Triton's message when smaller); None: any integer
_INTEGERS = {
    "shm-growth-byte-size": (1, "shm-growth-byte-size can't be smaller than or equal to zero."),
    "shm-default-byte-size": (1024 * 1024, "shm-default-byte-size can't be smaller than 4 MiBs"),
    "thread-pool-size": (1, "thread-pool-size can't be less than 1."),
    "stub-timeout-seconds": (1, "stub-timeout-seconds can't be smaller than or equal to zero."),
    "shm_message_queue_size": None,
}
# Settings every backend gets from the server (or from a global --backend-config).
_GENERAL = {"auto-complete-config", "backend-directory", "min-compute-capability",
            "default-max-batch-size"}

# Where a python model's instances run (docs/process_model.md): "thread" (in the server process,
# the default) or "process" (a stub process each). Per model: the EXECUTION_MODE parameter of its
# config; for every python model: --backend-config=python,execution-mode=process.
EXECUTION_MODES = ("thread", "process")
EXECUTION_MODE_PARAMETER = "EXECUTION_MODE"
EXECUTION_MODE_SETTING = "execution-mode"
DEFAULT_ARENA_BYTES = 64 * 1024 * 1024


def execution_mode(spec: Any, settings: dict[str, str]) -> str:
    """The execution mode of a model: its config parameter, else the backend setting."""
    value = spec.parameter(EXECUTION_MODE_PARAMETER)
    source = f"parameter {EXECUTION_MODE_PARAMETER} of model '{spec.name}'"
    if value is None:
        value = settings.get(EXECUTION_MODE_SETTING, "thread")
        source = f"python backend setting {EXECUTION_MODE_SETTING}"
    mode = value.strip().lower()
    if mode not in EXECUTION_MODES:
        raise InvalidArgumentError(
            f"{source}: '{value}' is not an execution mode; expected 'thread' or 'process'")
    return mode


def arena_bytes(settings: dict[str, str]) -> int:
    """Size of each shared-memory arena of a process-mode instance (shm-default-byte-size)."""
    value = settings.get("shm-default-byte-size")
    return max(int(value), DEFAULT_ARENA_BYTES) if value else DEFAULT_ARENA_BYTES


def check(settings: dict[str, str]) -> None:
    """Refuse values Triton refuses; log that the stub settings have no effect here."""
    for key, value in settings.items():
        if key in _INTEGERS:
            try:
                number = int(value.strip())
            except ValueError:
                raise InvalidArgumentError(
                    f"python backend setting '{key}': '{value}' is not an integer") from None
            rule = _INTEGERS[key]
            if rule is not None and number < rule[0]:
                raise InvalidArgumentError(rule[1])
        elif key == EXECUTION_MODE_SETTING:
            if value.strip().lower() not in EXECUTION_MODES:
                raise InvalidArgumentError(
                    f"python backend setting {key}: '{value}' is not an execution mode; "
                    "expected 'thread' or 'process'")
            continue
        elif key == "shm-region-prefix-name":
            if not value:
                raise InvalidArgumentError(
                    "shm-region-prefix-name must at least contain one character.")
        elif key not in _GENERAL:
            log.warning("python backend: unknown --backend-config setting '%s' ignored", key)
            continue
        if key == "shm-default-byte-size":
            log.info("python backend: --backend-config %s=%s sizes the shared-memory arenas of "
                     "process-mode instances; no effect on models in thread mode", key, value)
        elif key not in _GENERAL:
            log.info("python backend: --backend-config %s=%s accepted; it has no effect here "
                     "(models run in the server process, without stub processes)", key, value)
