"""Helpers for backends that run a batch of requests as one tensor per input.

The dynamic batcher hands an instance several requests at once (`host.scheduler`); a framework
backend (onnxruntime, pytorch) runs them as one call by concatenating each input along the batch
dimension, then cuts every output back into one piece per request. Requests whose inputs cannot
be concatenated (different shapes past the batch dimension, or a model that does not batch) run
one by one; `groups` decides that.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from host.errors import HostError, InternalError
from host.inference import InferenceRequest, InferenceResponse, Tensor

__all__ = ["groups", "gather", "scatter", "run_batched", "shape_key", "batch_key"]


def _signature(request: InferenceRequest) -> tuple:
    """What must agree for two requests to share one execution: names, types, inner shapes.

    A request with data outside host memory (a GPU array) runs on its own: it is not copied.
    """
    if not all(isinstance(t.data, np.ndarray) for t in request.inputs.values()):
        return (id(request),)
    return tuple(sorted((n, t.datatype, tuple(t.shape[1:])) for n, t in request.inputs.items()))


def shape_key(config: Any) -> Callable[[InferenceRequest], tuple] | None:
    """What must agree for requests to share one execute (Triton's core rule, for every backend):

    - each variable-size input (a -1 in its dims) without `allow_ragged_batch`: its shape past
      the batch dimension;
    - each shape tensor (`is_shape_tensor`): its shape and its values;
    - with optional inputs in the model: which inputs the request has.

    None when nothing can differ (every input fixed-size or ragged, none optional): any requests
    may share, and the batcher computes no key.
    """
    checks = []
    for i in config.input:
        if i.is_shape_tensor:
            checks.append((i.name, True))
        elif not i.allow_ragged_batch and -1 in i.dims:
            checks.append((i.name, False))
    optional = any(i.optional for i in config.input)
    if not checks and not optional:
        return None

    def key(request: InferenceRequest) -> tuple:
        inputs = request.inputs
        parts: list[Any] = []
        for name, values in checks:
            t = inputs.get(name)
            if t is None:
                parts.append(None)
            elif values and isinstance(t.data, np.ndarray):
                parts.append((tuple(t.shape[1:]), t.data.tobytes()))
            else:
                parts.append(tuple(t.shape[1:]))
        if optional:
            parts.append(frozenset(inputs))
        return tuple(parts)

    return key


def batch_key(config: Any, equal_shapes: bool) -> Callable[[InferenceRequest], tuple] | None:
    """The dynamic batcher's `compatible` key: `shape_key` (Triton's core rule) for a backend
    that keeps equal shapes (every backend but those that opt out); for one that opts out, still
    the inputs a request gives when the model has optional inputs (Triton's core batches only
    requests that give the same inputs, whatever the backend)."""
    if equal_shapes:
        return shape_key(config)
    if not any(i.optional for i in config.input):
        return None
    return lambda request: (frozenset(request.inputs),)


def groups(requests: Sequence[InferenceRequest], batching: bool) -> list[list[InferenceRequest]]:
    """Requests split into runs that can execute together (order kept within each run)."""
    if not batching or len(requests) == 1:
        return [[r] for r in requests]
    by_signature: dict[tuple, list[InferenceRequest]] = {}
    for request in requests:
        by_signature.setdefault(_signature(request), []).append(request)
    return list(by_signature.values())


def gather(requests: Sequence[InferenceRequest]) -> dict[str, Any]:
    """One array per input name: the request's own data, or all rows of the group concatenated."""
    if len(requests) == 1:
        return {name: t.data for name, t in requests[0].inputs.items()}
    return {name: np.concatenate([r.inputs[name].data for r in requests])
            for name in requests[0].inputs}


def scatter(requests: Sequence[InferenceRequest], outputs: dict[str, tuple[str, np.ndarray]],
            batching: bool) -> list[InferenceResponse]:
    """One response per request from whole-batch outputs {name: (datatype, array)}.

    Without batching (or with one request) the arrays are the response's as they are; otherwise
    each request takes the next `batch_size` rows of every output, as views.
    """
    if not batching or len(requests) == 1:
        return [InferenceResponse(outputs=[Tensor(n, dt, list(a.shape), a)
                                           for n, (dt, a) in outputs.items()])]
    total = sum(r.batch_size for r in requests)
    for name, (_, array) in outputs.items():
        if array.ndim == 0 or array.shape[0] != total:
            raise InternalError(
                f"output '{name}' has shape {list(array.shape)}: its first dimension should be "
                f"the batch size {total}")
    responses, start = [], 0
    for request in requests:
        end = start + request.batch_size
        responses.append(InferenceResponse(outputs=[
            Tensor(n, dt, list(a[start:end].shape), a[start:end]) for n, (dt, a) in outputs.items()]))
        start = end
    return responses


def run_batched(requests: Sequence[InferenceRequest], batching: bool,
                run: Callable[[Sequence[InferenceRequest]], dict[str, tuple[str, np.ndarray]]],
                ) -> list[InferenceResponse]:
    """Execute `run` once per group and answer every request; a group's failure is its error.

    `run(group)` returns {output name: (datatype, array)} for the whole group.
    """
    by_request: dict[int, InferenceResponse] = {}
    for group in groups(requests, batching):
        try:
            responses = scatter(group, run(group), batching)
        except HostError as exc:
            responses = [InferenceResponse(error=exc) for _ in group]
        for request, response in zip(group, responses):
            by_request[id(request)] = response
    return [by_request[id(r)] for r in requests]

