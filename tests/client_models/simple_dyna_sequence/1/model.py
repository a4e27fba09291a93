"""simple_dyna_sequence: OUTPUT = INPUT + START, plus CORRID on the request with END set.

With the oldest strategy one execute may hold requests of several sequences (one row each).
"""

import numpy as np
import triton_python_backend_utils as pb_utils


def _tensor(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy()


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            out = _tensor(request, "INPUT") + _tensor(request, "START")
            out = out + _tensor(request, "END") * _tensor(request, "CORRID").astype(np.int32)
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUTPUT", out.astype(np.int32))]))
        return responses
