"""Raw binary requests: an HTTP body that is nothing but the bytes of the model's one input.

Triton accepts a request whose `Inference-Header-Content-Length` is 0 as a single input named
`raw_input`; the model must have exactly one input, whose name, datatype and shape the server
deduces from the configuration (a batching model gets batch size 1; one variable dimension is
sized from the byte count; a BYTES input must have shape [1] and its bytes become one element).
The HTTP codec only marks the request (`InferenceRequest.raw_input`); the rule lives here.
Texts: Triton core, InferenceRequest::Normalize.
"""

from __future__ import annotations

import numpy as np

from host import datatypes
from host.errors import InvalidArgumentError
from host.inference import InferenceRequest, Tensor
from host.proto import model_config_pb2
from host.validation import request_tag

NAME = "raw_input"


def resolve(request: InferenceRequest, config: model_config_pb2.ModelConfig) -> None:
    """Turn the request's `raw_input` into the model's input (name, datatype, shape)."""
    tag = request_tag(request)
    if len(request.inputs) != 1 or len(config.input) != 1:
        raise InvalidArgumentError(
            f"{tag}Raw request must only have 1 input (found {len(request.inputs)}) to be deduced "
            f"but got {len(config.input)} inputs in '{config.name}' model configuration")
    raw = request.inputs.pop(NAME)
    model_input = config.input[0]
    datatype = datatypes.from_config_enum(model_input.data_type)
    shape = [1] if config.max_batch_size > 0 else []
    dynamic_axis = -1
    count = 1
    for dim in model_input.dims:
        if dim == -1:
            if dynamic_axis != -1:
                raise InvalidArgumentError(
                    f"{tag}The shape of the raw input '{model_input.name}' can not be deduced "
                    "because there are more than one variable-sized dimension")
            dynamic_axis = len(shape)
        else:
            count *= dim
        shape.append(dim)
    body = raw.data  # the request body as a uint8 view
    if datatype == "BYTES":
        if dynamic_axis != -1 or count != 1:
            raise InvalidArgumentError(
                f"{tag}For BYTE datatype raw input '{model_input.name}', the model must have "
                "input shape [1]")
        data = datatypes.bytes_array([body.tobytes()], shape)
    else:
        size = datatypes.element_size(datatype)
        if dynamic_axis != -1:
            shape[dynamic_axis] = len(body) // count // size if count and size else 0
        expected = datatypes.element_count(shape) * size
        if len(body) != expected:
            raise InvalidArgumentError(  # Triton names the input as the request did
                f"{tag}input byte size mismatch for input '{NAME}' for model "
                f"'{config.name}'. Expected {expected}, got {len(body)}")
        data = np.frombuffer(body, datatypes.to_numpy(datatype), datatypes.element_count(shape))
        data = data.reshape(shape)
    request.inputs[model_input.name] = Tensor(model_input.name, datatype, shape, data)
    request.raw_input = False
