"""simple_string: add/sub of integers that arrive and leave as decimal strings."""

import numpy as np
import triton_python_backend_utils as pb_utils


def _to_int(strings):
    """Object array of bytes (b"12") -> int64 array of the same shape."""
    return np.array([int(s) for s in strings.flat], dtype=np.int64).reshape(strings.shape)


def _to_strings(numbers):
    """Integer array -> object array of decimal strings as bytes, same shape."""
    return np.array([str(n).encode("utf-8") for n in numbers.flat], dtype=np.object_).reshape(
        numbers.shape
    )


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            try:
                a, b = _to_int(in0), _to_int(in1)
            except ValueError as e:
                error = pb_utils.TritonError(f"inputs must hold decimal integers: {e}")
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            out0 = pb_utils.Tensor("OUTPUT0", _to_strings(a + b))
            out1 = pb_utils.Tensor("OUTPUT1", _to_strings(a - b))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out0, out1]))
        return responses
