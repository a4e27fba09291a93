"""--backend-config settings of the python backend, checked as Triton's python backend checks them.

Triton's settings size the shared memory between the server and each model's stub process, the
stub's start-up timeout and a thread pool. Models run inside the server process here, so there is
no stub and no such memory: the settings are accepted, an invalid value still fails the load with
Triton's message (so a command line that Triton refuses is refused here too), and the log says
that they change nothing.
"""

from __future__ import annotations

import logging

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
        elif key == "shm-region-prefix-name":
            if not value:
                raise InvalidArgumentError(
                    "shm-region-prefix-name must at least contain one character.")
        elif key not in _GENERAL:
            log.warning("python backend: unknown --backend-config setting '%s' ignored", key)
            continue
        if key not in _GENERAL:
            log.info("python backend: --backend-config %s=%s accepted; it has no effect here "
                     "(models run in the server process, without stub processes)", key, value)
