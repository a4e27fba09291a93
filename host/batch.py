"""Helpers for backends that run a batch of requests as one tensor per input.

The dynamic batcher hands an instance several requests at once (`host.scheduler`); a framework
backend (onnxruntime, pytorch) runs them as one call by concatenating each input along the batch
dimension, then cuts every output back into one piece per request. Requests whose inputs cannot
be concatenated (different shapes past the batch dimension, or a model that does not batch) run
one by one; `groups` decides that.

Ragged batching (`BatchLayout`, as Triton's backend utilities `BackendInputCollector` and
`BackendOutputResponder`, used by its onnxruntime, pytorch and TensorRT backends): an input with
`allow_ragged_batch` reaches the model as one flat vector of every request's elements; each
`batch_input` is an extra model input computed from the batch (element counts, accumulated counts,
the largest count as a shape, item shapes); a `batch_output` is cut into one piece per request with
that request's input shape, instead of along the batch dimension. The python backend and native
backends do their own (Triton's python backend ignores batch inputs and outputs).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from host.errors import HostError, InternalError
from host.inference import InferenceRequest, InferenceResponse, Tensor

__all__ = ["groups", "gather", "scatter", "run_batched", "shape_key", "batch_key", "BatchLayout"]


def _signature(request: InferenceRequest, ragged: frozenset[str] = frozenset()) -> tuple:
    """What must agree for two requests to share one execution: names, types, inner shapes (not
    those of ragged inputs, which are flattened).

    A request with data outside host memory (a GPU array) runs on its own: it is not copied.
    """
    if not all(isinstance(t.data, np.ndarray) for t in request.inputs.values()):
        return (id(request),)
    return tuple(sorted((n, t.datatype, None if n in ragged else tuple(t.shape[1:]))
                        for n, t in request.inputs.items()))


def _elements(request: InferenceRequest, name: str) -> int:
    return int(np.prod(request.inputs[name].shape, dtype=np.int64))


class BatchLayout:
    """A model's ragged inputs, batch inputs and batch outputs (Triton's backend utilities).

    `of(config)` is None for a model that has none of them: the plain concatenation applies.
    """

    __slots__ = ("ragged", "batch_inputs", "batch_outputs")

    def __init__(self, config: Any) -> None:
        self.ragged = frozenset(i.name for i in config.input if i.allow_ragged_batch)
        self.batch_inputs = [(b.kind, b.target_name[0], b.data_type, b.source_input[0])
                             for b in config.batch_input if b.target_name and b.source_input]
        # BATCH_SCATTER_WITH_INPUT_SHAPE: output name -> (source input, the output's shape with
        # the batch dimension, its -1s taken from the request's input shape)
        outputs = {o.name: o for o in config.output}
        self.batch_outputs: dict[str, tuple[str, list[int]]] = {}
        for b in config.batch_output:
            for target in b.target_name:
                o = outputs.get(target)
                if o is None or not b.source_input:
                    continue
                dims = list(o.reshape.shape if o.HasField("reshape") else o.dims)
                self.batch_outputs[target] = (
                    b.source_input[0], ([-1] if config.max_batch_size > 0 else []) + dims)

    @staticmethod
    def of(config: Any) -> BatchLayout | None:
        if not (len(config.batch_input) or len(config.batch_output)
                or any(i.allow_ragged_batch for i in config.input)):
            return None
        return BatchLayout(config)

    def batch_input_types(self) -> dict[str, str]:
        """The model inputs the batch inputs add: {name: datatype}."""
        return {target: ("FP32" if dtype == _TYPE_FP32 else "INT32")
                for _, target, dtype, _ in self.batch_inputs}

    def gather(self, requests: Sequence[InferenceRequest]) -> dict[str, Any]:
        arrays: dict[str, Any] = {}
        for name in requests[0].inputs:
            if name in self.ragged:  # one flat vector of every request's elements
                arrays[name] = np.concatenate([np.asarray(r.inputs[name].data).reshape(-1)
                                               for r in requests])
            elif len(requests) == 1:
                arrays[name] = requests[0].inputs[name].data
            else:
                arrays[name] = np.concatenate([r.inputs[name].data for r in requests])
        for kind, target, dtype, source in self.batch_inputs:
            arrays[target] = _batch_input(kind, dtype, source, requests)
        return arrays

    def scatter(self, requests: Sequence[InferenceRequest], outputs: dict[str, tuple[str, np.ndarray]],
                batching: bool) -> list[InferenceResponse]:
        plain = {n: v for n, v in outputs.items() if n not in self.batch_outputs}
        responses = scatter(requests, plain, batching)
        for name, (datatype, array) in outputs.items():
            if name not in self.batch_outputs:
                continue
            source, shape = self.batch_outputs[name]
            flat = np.asarray(array).reshape(-1)
            offset = 0
            for request, response in zip(requests, responses):
                in_shape = request.inputs[source].shape
                want = [in_shape[i] if d == -1 and i < len(in_shape) else d
                        for i, d in enumerate(shape)]
                count = int(np.prod(want, dtype=np.int64))
                if offset + count > flat.size:
                    raise InternalError(
                        f"output '{name}' has {flat.size} elements, fewer than the inputs "
                        f"'{source}' of the batch need")
                piece = flat[offset:offset + count].reshape(want)
                offset += count
                response.outputs.append(Tensor(name, datatype, want, piece))
        return responses


_TYPE_FP32 = 11  # model_config.proto DataType.TYPE_FP32 (TYPE_INT32 is 8)


def _batch_input(kind: int, dtype: int, source: str, requests: Sequence[InferenceRequest]) -> np.ndarray:
    """One batch input's tensor (BackendInputCollector::BatchInputShape and ProcessBatchInput)."""
    from host.proto.model_config_pb2 import BatchInput

    np_type = np.float32 if dtype == _TYPE_FP32 else np.int32
    counts = [_elements(r, source) for r in requests]
    if kind == BatchInput.BATCH_ELEMENT_COUNT:
        return np.asarray(counts, dtype=np_type)
    if kind == BatchInput.BATCH_ACCUMULATED_ELEMENT_COUNT:
        return np.cumsum(counts).astype(np_type)
    if kind == BatchInput.BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO:
        return np.concatenate([[0], np.cumsum(counts)]).astype(np_type)
    if kind == BatchInput.BATCH_MAX_ELEMENT_COUNT_AS_SHAPE:  # only its shape says something
        return np.zeros([max(counts)], dtype=np_type)
    # BATCH_ITEM_SHAPE ([items, rank - 1]) and BATCH_ITEM_SHAPE_FLATTEN (the same, flat): the
    # shape past the batch dimension of each batch item (a request of batch size 2 gives 2 rows)
    rows: list[list[int]] = []
    for r in requests:
        shape = list(r.inputs[source].shape)
        rows += [shape[1:]] * (shape[0] if shape else 1)
    width = max((len(row) for row in rows), default=0)
    items = np.asarray(rows, dtype=np_type).reshape(len(rows), width)
    return items if kind == BatchInput.BATCH_ITEM_SHAPE else items.reshape(-1)


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


def groups(requests: Sequence[InferenceRequest], batching: bool,
           layout: BatchLayout | None = None) -> list[list[InferenceRequest]]:
    """Requests split into runs that can execute together (order kept within each run)."""
    if not batching or len(requests) == 1:
        return [[r] for r in requests]
    ragged = layout.ragged if layout is not None else frozenset()
    by_signature: dict[tuple, list[InferenceRequest]] = {}
    for request in requests:
        by_signature.setdefault(_signature(request, ragged), []).append(request)
    return list(by_signature.values())


def gather(requests: Sequence[InferenceRequest], layout: BatchLayout | None = None) -> dict[str, Any]:
    """One array per input name: the request's own data, or all rows of the group concatenated
    (with a `layout`: ragged inputs flattened, and the batch inputs added)."""
    if layout is not None:
        return layout.gather(requests)
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
                layout: BatchLayout | None = None) -> list[InferenceResponse]:
    """Execute `run` once per group and answer every request; a group's failure is its error.

    `run(group)` returns {output name: (datatype, array)} for the whole group; with a `layout`,
    its batch outputs are cut by the requests' input shapes.
    """
    by_request: dict[int, InferenceResponse] = {}
    for group in groups(requests, batching, layout):
        try:
            outputs = run(group)
            responses = (scatter(group, outputs, batching) if layout is None
                         else layout.scatter(group, outputs, batching))
        except HostError as exc:
            responses = [InferenceResponse(error=exc) for _ in group]
        for request, response in zip(group, responses):
            by_request[id(request)] = response
    return [by_request[id(r)] for r in requests]

