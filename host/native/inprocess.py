"""The Python side of the bridge's in-process server API: what a native backend reaches through
`TRITONSERVER_ServerInferAsync`, `TRITONSERVER_ServerModelIsReady`, `TRITONSERVER_ServerLoadModel`
and the other server calls (host/native/src/infer.c and control.c call these functions, with
the GIL held).

A backend's request becomes a host request sent through `Host.submit` (host.bls), so it passes
the same checks, cache, scheduler and statistics as a client's. Its input buffers become numpy
arrays over the backend's memory, without a copy: as Triton's API says, they must stay valid
until the request's release callback, which the bridge calls after the final response.

Errors: every function raises `RuntimeError(code, message)` with a TRITONSERVER_Error_Code, which
the bridge returns to the backend as a TRITONSERVER_Error.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Callable, TypeVar

from host import bls, datatypes
from host.errors import HostError, InternalError, UnsupportedError
from host.inference import InferenceRequest, InferenceResponse, RequestedOutput, Tensor
from host.native.bridge import CODES

F = TypeVar("F", bound=Callable[..., Any])
_INTERNAL = CODES.index(InternalError.code)


def _api(fn: F) -> F:
    """Host errors leave as RuntimeError(code, message) for the bridge."""

    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        try:
            return fn(*args)
        except HostError as exc:
            raise RuntimeError(CODES.index(exc.code), exc.message) from None
        except Exception as exc:
            raise RuntimeError(_INTERNAL, f"{type(exc).__name__}: {exc}") from None

    return wrapper  # type: ignore[return-value]


# Respond(outputs, parameters, error, final): a bound C function of the bridge's request.
Respond = Callable[[Any, Any, Any, bool], None]


@_api
def infer(model: str, version: int, request_id: str, correlation_id: int | str, flags: int,
          timeout_us: int, priority: int, inputs: list[tuple[str, str, tuple[int, ...], Any]],
          outputs: list[str], parameters: dict[str, Any], respond: Respond) -> InferenceRequest:
    """TRITONSERVER_ServerInferAsync: submit; `respond` gets every response. Returns the host
    request (the bridge keeps it to cancel it)."""
    host = bls.server()
    host.manager.get(model, version)  # an unknown model is the caller's error, as in Triton
    request = InferenceRequest(
        model_name=model, model_version=version, id=request_id,
        inputs={name: Tensor(name, datatype, list(shape),
                             datatypes.array_from_buffer(datatype, shape, data))
                for name, datatype, shape, data in inputs},
        outputs=[RequestedOutput(name) for name in outputs], parameters=parameters,
        sequence_id=correlation_id, sequence_start=bool(flags & 1), sequence_end=bool(flags & 2),
        priority=priority, timeout_us=timeout_us, held=bls.HELD.get())

    def on_response(response: InferenceResponse | None, final: bool) -> None:
        if response is None:
            respond(None, None, None, final)
        elif response.error is not None:
            respond(None, None, (CODES.index(response.error.code), response.error.message), final)
        else:
            respond([(t.name, t.datatype, tuple(int(d) for d in t.data.shape),
                      datatypes.array_to_bytes(t.datatype, t.data)) for t in response.outputs],
                    response.parameters or None, None, final)

    host.submit(request, on_response)
    return request


@_api
def model_ready(model: str, version: int) -> bool:
    return bls.model_ready(model, version)


@_api
def model_properties(model: str, version: int) -> tuple[bool, bool]:
    """(decoupled, batches) of a ready model version: TRITONSERVER_ServerModel*Properties."""
    mv = bls.server().manager.get(model, version)
    return mv.decoupled, mv.config.max_batch_size > 0


@_api
def load_model(model: str, parameters: dict[str, Any]) -> None:
    """TRITONSERVER_ServerLoadModel(WithParameters): "config" (JSON) and file contents."""
    config = parameters.pop("config", None)
    files = {k: v for k, v in parameters.items() if k.startswith("file:")}
    bls.load_model(model, config, files or None)


@_api
def unload_model(model: str, dependents: bool) -> None:
    bls.unload_model(model, dependents)


@_api
def document(what: str, model: str, version: int) -> str:
    """The JSON documents of TRITONSERVER_ServerMetadata, ServerModelMetadata, ServerModelConfig,
    ServerModelStatistics and ServerModelIndex: what the HTTP endpoints return."""
    host = bls.server()
    v = "" if version < 0 else str(version)
    if what == "server":
        doc: Any = host.server_metadata()
    elif what == "metadata":
        doc = host.model_metadata(model, v)
    elif what == "config":
        doc = host.model_config_json(model, v)
    elif what == "statistics":
        doc = host.statistics(model, v)
    elif what == "index":
        doc = host.repository_index(ready_only=bool(version & 1))
    else:
        raise UnsupportedError(f"unknown server document '{what}'")
    return json.dumps(doc)


@_api
def cancel(request: InferenceRequest) -> None:
    request.cancel()


@_api
def live() -> tuple[bool, bool]:
    host = bls.server()
    return host.live(), host.ready()
