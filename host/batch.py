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
    """What must agree for requests to share one execute of a backend that concatenates them:
    the shape past the batch dimension of each input without `allow_ragged_batch` (Triton's
    dynamic batcher rule). None when every input is ragged: any requests may share."""
    fixed = tuple(i.name for i in config.input if not i.allow_ragged_batch)
    if not fixed:
        return None

    def key(request: InferenceRequest) -> tuple:
        inputs = request.inputs
        return tuple(tuple(inputs[n].shape[1:]) if n in inputs else None for n in fixed)

    return key


def batch_key(config: Any, equal_shapes: bool) -> Callable[[InferenceRequest], tuple] | None:
    """The dynamic batcher's `compatible` key: `shape_key` for a backend that concatenates a
    batch's inputs, and, for every backend of a model with optional inputs, the names of the inputs
    a request gives (Triton's core batches only requests that give the same inputs)."""
    shapes = shape_key(config) if equal_shapes else None
    if not any(i.optional for i in config.input):
        return shapes
    if shapes is None:
        return lambda request: tuple(sorted(request.inputs))
    return lambda request: (tuple(sorted(request.inputs)), shapes(request))


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

