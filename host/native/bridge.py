"""Loading the bridge, and the two ways back from native code into the host: responses and logs.

The bridge is loaded once per process, with RTLD_GLOBAL, before any backend or cache library:
its soname is `libtritonserver.so`, so a library that names it as a dependency (as Triton's own
builds do) finds it already loaded, and every Triton symbol resolves against it.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import importlib.util
import logging
import os
from types import ModuleType
from typing import Any, Callable, TypeVar

import numpy as np

from host import datatypes
from host.errors import Code, HostError, UnsupportedError, error_for
from host.inference import InferenceRequest, InferenceResponse, Tensor

log = logging.getLogger("host.native")

MODULE = "host.native.libtritonserver"

# TRITONSERVER_Error_Code, in the order of Triton's enum.
CODES = (Code.UNKNOWN, Code.INTERNAL, Code.NOT_FOUND, Code.INVALID_ARG, Code.UNAVAILABLE,
         Code.UNSUPPORTED, Code.ALREADY_EXISTS, Code.CANCELLED)

# TRITONSERVER_LogLevel -> logging level.
_LEVELS = (logging.INFO, logging.WARNING, logging.ERROR, logging.DEBUG)

T = TypeVar("T")


@functools.cache
def lib() -> ModuleType:
    """The bridge module, loaded and configured on first use."""
    spec = importlib.util.find_spec(MODULE)
    if spec is None or spec.origin is None:
        raise UnsupportedError(
            "native Triton backends and caches need modelhost's native bridge "
            f"({MODULE}), which this installation lacks: it was installed without a C compiler. "
            "Install one with Python's headers (Debian/Ubuntu: apt-get install gcc python3-dev), "
            "then reinstall modelhost")
    ctypes.CDLL(spec.origin, mode=os.RTLD_GLOBAL | os.RTLD_NOW)
    module = importlib.import_module(MODULE)
    enabled = tuple(int(log.isEnabledFor(level)) for level in _LEVELS)
    module.configure(_deliver, _log, _serialize_bytes, np.ascontiguousarray, enabled)
    return module


def call(fn: Callable[..., T], *args: Any) -> T:
    """Call a bridge function; a TRITONSERVER_Error becomes the host error of the same code."""
    try:
        return fn(*args)
    except lib().BridgeError as exc:
        code, message = exc.args
        raise to_host_error(code, message) from None


def to_host_error(code: int, message: str) -> HostError:
    return error_for(CODES[code] if 0 <= code < len(CODES) else Code.UNKNOWN, message)


# --- called from native code (GIL held) ------------------------------------------------------------

def _deliver(request: InferenceRequest, outputs: list[tuple[str, str, tuple[int, ...], Any]] | None,
             parameters: dict[str, Any] | None, error: tuple[int, str] | None, final: bool) -> None:
    """One response a backend sent (TRITONBACKEND_ResponseSend / ResponseFactorySendFlags)."""
    try:
        if error is not None:
            response: InferenceResponse | None = InferenceResponse(error=to_host_error(*error))
        elif outputs is None:  # flags only
            if not final:
                return
            response = None
        else:
            response = InferenceResponse(
                outputs=[_tensor(name, datatype, shape, buf) for name, datatype, shape, buf in outputs],
                parameters=parameters or {})
        request.respond(response, final)
    except Exception:
        log.exception("could not deliver a response of a native backend")
        if final and not request.completed:
            request.respond(InferenceResponse(error=error_for(
                Code.INTERNAL, "native backend sent a malformed response")), True)


def _tensor(name: str, datatype: str, shape: tuple[int, ...], buf: Any) -> Tensor:
    dtype = _FIXED.get(datatype)
    count = 1
    for d in shape:  # inline: this runs for every output
        count *= d
    if dtype is not None and buf is not None and len(memoryview(buf)) == dtype.itemsize * count:
        # the common case, kept short: a zero-copy view of what the backend wrote
        data = np.frombuffer(buf, dtype)
        if len(shape) != 1:  # numpy's reshape costs more than the rest of this function
            data = data.reshape(shape)
    else:  # BYTES, no buffer, or a size that does not match: the general path and its errors
        data = datatypes.array_from_buffer(datatype, shape, memoryview(buf) if buf is not None else b"")
    return Tensor(name, datatype, list(shape), data)


_FIXED = {name: datatypes.to_numpy(name) for name in datatypes.DATATYPES
          if name != "BYTES" and datatypes.element_size(name) and
          (name != "BF16" or datatypes.BF16_DTYPE is not None)}


def _serialize_bytes(array: np.ndarray) -> bytes:
    """A BYTES input in Triton's length-prefixed form, as backends expect it."""
    return datatypes.serialize_bytes(np.asarray(array, dtype=object).reshape(-1))


def _log(level: int, filename: str, line: int, message: str) -> None:
    log.log(_LEVELS[level] if 0 <= level < len(_LEVELS) else logging.INFO,
            "%s:%d] %s", filename, line, message)
