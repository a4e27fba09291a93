"""Checks of a request against its model's configuration, with Triton's messages.

Built once per loaded model version (`RequestRules`), run on every request before scheduling,
so both front ends reject the same requests with the same words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from host import datatypes
from host.errors import InternalError, InvalidArgumentError
from host.proto import model_config_pb2

if TYPE_CHECKING:
    from host.inference import InferenceRequest, InferenceResponse, Tensor


@dataclass(frozen=True)
class _TensorRule:
    datatype: str
    dims: tuple[int, ...]  # without the batch dimension
    optional: bool


class RequestRules:
    def __init__(self, config: model_config_pb2.ModelConfig) -> None:
        self.model = config.name
        self.max_batch_size = config.max_batch_size
        self.inputs = {
            i.name: _TensorRule(datatypes.from_config(model_config_pb2.DataType.Name(i.data_type)),
                                tuple(i.dims), i.optional)
            for i in config.input
        }
        self.outputs = {o.name for o in config.output}
        self.required = [n for n, r in self.inputs.items() if not r.optional]
        # `reshape`: the backend sees inputs in their reshape shape and produces outputs in theirs,
        # while clients use dims (name -> (what the tensor has, what it becomes)).
        self.input_reshapes = {i.name: (tuple(i.dims), tuple(i.reshape.shape))
                               for i in config.input if i.HasField("reshape")}
        self.output_reshapes = {o.name: (tuple(o.reshape.shape), tuple(o.dims))
                                for o in config.output if o.HasField("reshape")}

    def check(self, request: InferenceRequest) -> None:
        """Raise InvalidArgumentError for the first rule the request breaks; set its batch size.

        Triton's order: the input count first (against required and total), then each input.
        """
        inputs = request.inputs
        if len(inputs) > len(self.inputs) or len(inputs) < len(self.required):
            raise self._count_error(request)
        for name, tensor in inputs.items():
            rule = self.inputs.get(name)
            if rule is None:
                raise InvalidArgumentError(
                    f"unexpected inference input '{name}' for model '{self.model}'")
            if tensor.datatype != rule.datatype:
                raise InvalidArgumentError(
                    f"inference input '{name}' data-type is '{tensor.datatype}', but model "
                    f"'{self.model}' expects '{rule.datatype}'")
        if len(inputs) < len(self.inputs) and any(n not in inputs for n in self.required):
            raise self._count_error(request)  # an optional input given in place of a required one
        batch = self._check_shapes(request)
        request.batch_size = batch
        if self.input_reshapes:
            for name, (dims, shape) in self.input_reshapes.items():
                if name in inputs:
                    try:
                        self._reshape(inputs[name], dims, shape)
                    except ValueError:
                        raise InvalidArgumentError(
                            f"input '{name}' of shape {_shape(inputs[name].shape)} cannot take "
                            f"the reshape {_shape(shape)} of model '{self.model}'") from None
        for out in request.outputs:
            if out.name not in self.outputs:
                raise InvalidArgumentError(
                    f"unexpected inference output '{out.name}' for model '{self.model}'")

    def _count_error(self, request: InferenceRequest) -> InvalidArgumentError:
        """Triton's words (core InferenceRequest::ValidateRequestInputs), lists included."""
        inputs = request.inputs
        missing = _names([n for n in self.required if n not in inputs])
        got = _names(inputs) if inputs else "[]"
        if len(self.required) == len(self.inputs):
            expected = f"expected {len(self.inputs)} inputs"
        else:
            expected = f"expected number of inputs between {len(self.required)} and {len(self.inputs)}"
        return InvalidArgumentError(
            f"{request_tag(request)}{expected} but got {len(inputs)} inputs for model "
            f"'{self.model}'. Got input(s) {got}, but missing required input(s) {missing}. "
            "Please provide all required input(s).")

    def _check_shapes(self, request: InferenceRequest) -> int:
        batch = None
        for name, tensor in request.inputs.items():
            dims = self.inputs[name].dims
            shape = tensor.shape
            if self.max_batch_size > 0:
                if not shape:
                    raise InvalidArgumentError(
                        f"input '{name}' has no batch dimension, but model '{self.model}' "
                        f"batches (max_batch_size {self.max_batch_size})")
                rows, shape = shape[0], shape[1:]
                if batch is None:
                    batch = rows
                elif rows != batch:
                    raise InvalidArgumentError(
                        f"input '{name}' batch size {rows} does not match the batch size {batch} "
                        f"of the other inputs of model '{self.model}'")
                if rows < 1 or rows > self.max_batch_size:
                    raise InvalidArgumentError(
                        f"inference request batch-size must be <= {self.max_batch_size} for "
                        f"'{self.model}'")
            if not _matches(dims, shape):
                full = ([-1] if self.max_batch_size > 0 else []) + list(dims)
                raise InvalidArgumentError(
                    f"unexpected shape for input '{name}' for model '{self.model}'. Expected "
                    f"{_shape(full)}, got {_shape(tensor.shape)}")
        return batch or 1


    def reshape_outputs(self, response: InferenceResponse) -> None:
        """Give outputs with a `reshape` the shape of their dims (run on every response)."""
        for tensor in response.outputs:
            pair = self.output_reshapes.get(tensor.name)
            if pair is None:
                continue
            try:
                self._reshape(tensor, *pair)
            except ValueError:
                response.outputs, response.error = [], InternalError(
                    f"output '{tensor.name}' of model '{self.model}' has shape "
                    f"{_shape(tensor.shape)}, which does not match its reshape "
                    f"{_shape(pair[0])}")
                return

    def _reshape(self, tensor: Tensor, given: tuple[int, ...], target: tuple[int, ...]) -> None:
        """`tensor` (shaped `given`, after any batch dimension) reshaped to `target`: each
        variable-size dimension of `target` takes the size of the matching one of `given`."""
        batch = tensor.shape[:1] if self.max_batch_size > 0 else []
        rest = tensor.shape[len(batch):]
        sizes = iter([size for size, dim in zip(rest, given) if dim == -1])
        shape = batch + [next(sizes, 1) if dim == -1 else dim for dim in target]
        if shape != tensor.shape and tensor.data is not None:
            tensor.data = tensor.data.reshape(shape)
            tensor.shape = shape


def _matches(dims: tuple[int, ...], shape: list[int]) -> bool:
    if len(dims) != len(shape):
        return False
    return all(d == -1 or d == s for d, s in zip(dims, shape))


def _shape(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def request_tag(request: InferenceRequest) -> str:
    """Triton's prefix of a request's errors: `[request id: <id>] `."""
    return f"[request id: {request.id or '<id_unknown>'}] "


def _names(names) -> str:
    """Triton's list: `['a','b']`; an empty list of missing inputs reads `]`, as in Triton."""
    text = ",".join(f"'{n}'" for n in names)
    return "[" + text + "]" if text else "]"
