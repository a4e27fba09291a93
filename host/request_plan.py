"""Plans of requests whose header repeats, for both codecs.

A client sends the same request again and again but for its tensors' bytes (and, on a stream, its
id): the same model, inputs, shapes, parameters and outputs. What such a header decodes to is
kept as a `RequestPlan`, keyed by the header's bytes in the codec's own terms (host.http.codec:
the JSON header of a binary request; host.grpc.codec: the fields before the raw contents, but the
id). The same header again builds its request from the plan: no JSON or protobuf parse, no
field-by-field checks. Every rule about the request still runs in the core (`Stages.admit`).

A plan is made only where the header alone decides the request: it decoded without an error,
every input is shared memory or fixed-size data of the size the header says, and every parameter
value is a scalar (each request gets shallow copies). Data that does not fit the plan (another
size or number of tensors) builds nothing: the codec then decodes in full and gives its errors.
"""

from __future__ import annotations

from typing import Any, Callable, Generic, Hashable, TypeVar

import numpy as np

from host import datatypes
from host.inference import InferenceRequest, RequestedOutput, Tensor

_SCALARS = (str, int, float, bool, type(None))
LIMIT = 1024  # plans, and keys seen once, kept by a cache (emptied when full)


class RequestPlan:
    """What a header decodes to, without the data (see the module docstring)."""

    __slots__ = ("inputs", "sizes", "outputs", "parameters", "uses_shm")

    def __init__(self, request: InferenceRequest, sizes: list[int]) -> None:
        # (name, datatype, shape, numpy dtype or None for shared memory, element count, parameters)
        self.inputs = tuple(
            (t.name, t.datatype, tuple(t.shape), None if t.data is None else t.data.dtype,
             0 if t.data is None else t.data.size, dict(t.parameters))
            for t in request.inputs.values())
        self.sizes = tuple(sizes)  # the byte size of each input with data, in order
        self.outputs = tuple((o.name, dict(o.parameters)) for o in request.outputs)
        self.parameters = dict(request.parameters)
        self.uses_shm = request.uses_shm

    @classmethod
    def of(cls, request: InferenceRequest, sizes: list[int]) -> RequestPlan | None:
        """The plan of a request that decoded from a header and its data, `sizes` being the
        byte size of each tensor the data held, in order; None where the header alone does not
        decide the request."""
        if request.data_errors:
            return None
        with_data = [t for t in request.inputs.values() if t.data is not None]
        if len(with_data) != len(sizes):  # JSON data, typed contents: in the header
            return None
        for t in with_data:
            if t.datatype == "BYTES" or t.datatype == datatypes.INVALID or type(t.data) is not np.ndarray:
                return None
        for params in [request.parameters, *(t.parameters for t in request.inputs.values()),
                       *(o.parameters for o in request.outputs)]:
            for value in params.values():
                if not isinstance(value, _SCALARS):
                    return None
        return cls(request, sizes)

    def build(self, model_name: str, model_version: int, request_id: str, protocol: str,
              buffer: Any, spans: list[tuple[int, int]] | None, start: int = 0) -> InferenceRequest | None:
        """The request, its tensors numpy views of `buffer`: at `spans` (gRPC's raw contents), or,
        with `spans` None, one after another from `start` to the buffer's end (HTTP's binary data).
        None when the tensors do not fit the plan. Every object the request holds is its own (the
        host writes to them)."""
        sizes = self.sizes
        if spans is not None and len(spans) != len(sizes):
            return None
        inputs: dict[str, Tensor] = {}
        k = 0
        for name, datatype, shape, dtype, count, params in self.inputs:
            if dtype is None:
                inputs[name] = Tensor(name, datatype, list(shape), None, dict(params))
                continue
            if spans is None:
                offset = start
                start += sizes[k]
                if start > len(buffer):
                    return None
            else:
                offset, end = spans[k]
                if end - offset != sizes[k]:
                    return None
            k += 1
            data = np.frombuffer(buffer, dtype, count, offset)
            if len(shape) != 1:  # numpy's reshape costs more than the rest of this loop
                data = data.reshape(shape)
            inputs[name] = Tensor(name, datatype, list(shape), data, dict(params) if params else {})
        if spans is None and start != len(buffer):
            return None
        outputs = [RequestedOutput(name, dict(params) if params else {}) for name, params in self.outputs]
        request = InferenceRequest(model_name, model_version, request_id, inputs, outputs,
                                   dict(self.parameters) if self.parameters else {}, protocol)
        request.uses_shm = self.uses_shm
        return request


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class PlanCache(Generic[K, V]):
    """A codec's plans by key (`plans`, read directly: once per request). A plan is made the
    second time its key comes, so that headers which never repeat (an id of their own, say) cost
    a set insertion each, not a plan. Bounded: emptied when full, so that ever new headers never
    cost memory."""

    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self.plans: dict[K, V] = {}
        self.seen: set[K] = set()

    def offer(self, key: K, make: Callable[[], V | None]) -> V | None:
        """The plan `make` gives, kept, if `key` came once before; else note the key."""
        if key not in self.seen:
            if len(self.seen) >= self.limit:
                self.seen.clear()
            self.seen.add(key)
            return None
        plan = make()
        if plan is not None:
            if len(self.plans) >= self.limit:
                self.plans.clear()
            self.plans[key] = plan
        return plan

    def clear(self) -> None:
        self.plans.clear()
        self.seen.clear()
