"""Requests a model sends to other models while it executes (BLS), and the rule that keeps
them from deadlocking.

A BLS call is an ordinary request the host issues to itself: it goes through `Host.submit`,
with its admission checks, response cache, scheduler and statistics, exactly as a client's
request does, and its tensors are the caller's arrays (no copy). Two users send such requests:
the python backend (`pb_utils.InferenceRequest.exec`) and native backends through the
in-process server API of the C bridge (`TRITONSERVER_ServerInferAsync`).

**The host they go to.** Triton's server API names one server per process; so does this module:
`attach(host)` (done by `Host.start`) makes a host the one BLS calls reach.

**The deadlock rule.** An instance runs one execute at a time, and a model that makes a BLS call
holds its instance until the call returns. So a model calling itself, or A calling B calling A,
would wait forever for an instance that its own caller holds. The host tracks, per call chain,
the instances the callers hold (`HELD`, set around every execute by the schedulers; a BLS
request carries it in `InferenceRequest.held`, so that an execute on another thread, a batcher's,
knows the chain it serves; a request the host derives from another, an ensemble step, should copy
its `held`). When a request arrives for a model whose every
instance is held by the request's own callers, none can ever come free for it, so it runs at once
on the innermost caller's instance, as a recursive call would (that caller is suspended in its
BLS call meanwhile). In every other case a request waits for a free instance as usual: instances
held by other requests come free when those finish.

Not covered: a cycle between *different* clients' requests (client 1 holds A's only instance and
calls B while client 2 holds B's only instance and calls A). Give one of the models a second
instance, or a BLS timeout, when such a pattern is possible.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from typing import TYPE_CHECKING, Any, Sequence

from host.errors import UnavailableError

if TYPE_CHECKING:
    from host.core import Host

# The instances (host.scheduler.InstanceSlot) held by the executes on this call chain, outermost
# first. Set by host.scheduler.execute_batch around each execute.
HELD: contextvars.ContextVar[tuple[Any, ...]] = contextvars.ContextVar("modelhost_held_instances",
                                                                        default=())

log = logging.getLogger(__name__)
_lock = threading.Lock()
_host: Host | None = None


def attach(host: Host) -> None:
    """Make `host` the one BLS calls in this process go to."""
    global _host
    with _lock:
        _host = host


def detach(host: Host) -> None:
    global _host
    with _lock:
        if _host is host:
            _host = None


def server() -> Host:
    """The host BLS calls go to; UNAVAILABLE when none is serving in this process."""
    host = _host
    if host is None:
        raise UnavailableError("no model server is running in this process")
    return host


def reentrant_slot(slots: Sequence[Any], held: tuple[Any, ...]) -> Any | None:
    """The instance a request must run on at once because every instance of its model is held
    by its own callers (see the module docstring); None when it may wait for a free one."""
    if not held or not slots:
        return None
    for slot in slots:
        if slot not in held:
            return None
    for slot in reversed(held):  # the innermost caller of this model
        if slot in slots:
            return slot
    return None


# --- model control on behalf of a model (Triton's TRITONSERVER_ServerLoadModel & co.) ------------

def model_ready(name: str, version: int = -1) -> bool:
    return server().model_ready(name, "" if version < 0 else str(version))


def load_model(name: str, config: str | None = None, files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) a model in explicit mode; returns once it is loaded, as Triton does.
    `files` maps Triton's `file:<path in the model folder>` keys to contents."""
    if files:
        files = {k[len("file:"):] if k.startswith("file:") else k: v for k, v in files.items()}
    server().load_model(name, config=config or None, files=files or None)


def unload_model(name: str, unload_dependents: bool = False) -> None:
    """Start unloading a model, as TRITONSERVER_ServerUnloadModel does: an unknown model is no
    error. Returns once the unload is done, except when the calling chain holds an instance of
    the model (it unloads itself): the unload then waits for the caller's request to finish, so
    this returns at once and the unload completes after it."""
    host = server()
    host.manager.check_control_allowed()
    entry = host.manager.entry(name)
    if entry is None or not entry.versions:
        return
    held = HELD.get()
    if not any(slot in held for mv in entry.versions.values() for slot in mv.slots):
        # On this thread: a model's `initialize` runs inside its own load, which holds the
        # repository lock on this thread (another thread would wait for it forever).
        host.unload_model(name, unload_dependents=unload_dependents)
        return
    threading.Thread(target=_unload, args=(host, name, unload_dependents), daemon=True,
                     name=f"unload-{name}").start()


def _unload(host: Host, name: str, unload_dependents: bool) -> None:
    try:
        host.unload_model(name, unload_dependents=unload_dependents)
    except Exception:
        log.exception("unloading model '%s' for a BLS call failed", name)
