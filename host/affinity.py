"""One CPU for the threads that take turns running the server's Python code.

The interpreter runs one thread at a time (the GIL). On the request path the front end's threads
(one per HTTP connection, the gRPC pollers) and the threads that run python models hand the GIL
to one another several times per request. When they sit on different CPUs, each hand-off wakes a
thread on another CPU (an inter-processor interrupt, a cold cache; in a virtual machine an exit
to the hypervisor), which costs more than a small request itself: on the project's 2-core VM,
perf_analyzer at concurrency 8 over HTTP measured 165 us of server CPU per python-identity
request with the threads free and 96 us with them on one CPU (throughput 5.8k -> 10.4k infer/s,
p99 5.9 -> 1.9 ms; docs/performance.md). Python code gains nothing from a second CPU anyway.

So those threads share one CPU (`pin`), and what computes outside the GIL stays free: a model's
execute widens its thread to every CPU for the call (`widen`) when the model's last execute took
LONG_EXECUTE_NS (1 ms) or more (native code, ONNX Runtime, torch, a python model calling torch: they may
use other cores; at that length a move between CPUs costs little) and for its first execute (so
that a pool started lazily, as torch starts its own, gets every CPU); model loads run wide
(threads a load starts, such as ONNX Runtime's pools, inherit that); python stub processes,
other worker processes and clients are not touched.

`--python-cpu` chooses: `auto` (the default: one of the CPUs the process may use, picked by
process id so that replicas spread, when it may use at least two), `off`, or a CPU number.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger(__name__)

# An execute that took at least this long widens its thread next time: for a shorter one, moving
# the thread to another CPU and back costs more than it can win (measured with the native
# identity, a few us per call: 89 us of server CPU per request pinned, 110 us widened). Not
# lower: on a slower VM (AMD EPYC, 2026-11-27) a python model that answers at once took 150-240 us
# of wall time, and once widened it stayed above 200 us (moved between CPUs, caches cold, the
# GIL handed across), so at a 200 us threshold it could stay wide for good. An execute of 1 ms
# or more pays for a move between CPUs (tens of us) with a few percent.
LONG_EXECUTE_NS = 1_000_000

_cpu: frozenset[int] | None = None  # where pinned threads run; None: pinning is off
_wide: frozenset[int] = frozenset()  # the CPUs the process could use when configured
# .pinned: this thread is on _cpu. Unset in a thread that never called pin() or widen(): it may
# still be pinned, having inherited the mask of the thread that started it (a pool started from
# a request's thread), so widen() looks once.
_local = threading.local()


def parse(setting: str) -> str:
    """The `--python-cpu` value, normalized: 'auto', 'off' or a CPU number (as text). ValueError
    when it is none of those (whether the CPU is one this process may use is configure's check)."""
    value = setting.strip().lower()
    if value in ("auto", "off") or (value.isascii() and value.isdigit()):
        return value
    raise ValueError(f"expected 'auto', 'off' or a CPU number, got '{setting}'")


def configure(setting: str) -> None:
    """Apply `--python-cpu`: 'auto', 'off' or a CPU number. Raises ValueError on a bad value."""
    global _cpu, _wide
    try:
        value = parse(setting)
    except ValueError as exc:
        raise ValueError(f"--python-cpu: {exc}") from None
    if value == "off":
        _cpu = None
        return
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux: leave scheduling to the system
        _cpu = None
        return
    _wide = frozenset(allowed)
    if value == "auto":
        _cpu = frozenset({allowed[os.getpid() % len(allowed)]}) if len(allowed) > 1 else None
        return
    cpu = int(value)
    if cpu not in _wide:
        raise ValueError(f"--python-cpu: CPU {cpu} is not one this process may run on "
                         f"({', '.join(map(str, allowed))})")
    _cpu = frozenset({cpu})


def cpu() -> int | None:
    """The CPU pinned threads run on, or None when pinning is off."""
    return next(iter(_cpu)) if _cpu else None


def pin() -> None:
    """Put the calling thread on the Python CPU (nothing when pinning is off)."""
    if _cpu is None:
        return
    try:
        os.sched_setaffinity(0, _cpu)  # 0: the calling thread (Linux sets it per thread)
    except OSError as exc:  # e.g. the CPU went away from our cpuset: run unpinned
        log.debug("could not pin thread to CPU %s: %s", cpu(), exc)
        return
    _local.pinned = True


def widen() -> bool:
    """Let the calling thread, if pinned, run on every CPU; True when it was pinned (then call
    `pin` when done). A cheap no-op for threads that are not pinned."""
    pinned = getattr(_local, "pinned", None)
    if pinned is None:  # first call on this thread: pinned by inheritance?
        pinned = _local.pinned = _cpu is not None and os.sched_getaffinity(0) == _cpu
    if not pinned:
        return False
    try:
        os.sched_setaffinity(0, _wide)
    except OSError:
        return False
    _local.pinned = False
    return True
