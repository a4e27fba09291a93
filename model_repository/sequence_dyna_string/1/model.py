"""sequence_dyna_string: OUTPUT = running sum of INPUT per sequence; SEQUENCE = its string id.

With the oldest strategy one execute receives the next request of several sequences; the
CORRID control input (BYTES) tells them apart, and `request.correlation_id()` returns the same
string.
"""

import numpy as np
import triton_python_backend_utils as pb_utils


def _value(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy().item()


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            corrid = _value(request, "CORRID")  # bytes
            assert corrid.decode() == request.correlation_id()
            total = _value(request, "INPUT") + (0 if _value(request, "START") else self.sums.get(corrid, 0))
            if _value(request, "END"):
                self.sums.pop(corrid, None)
            else:
                self.sums[corrid] = total
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT", np.array([[total]], dtype=np.int32)),
                pb_utils.Tensor("SEQUENCE", np.array([[corrid]], dtype=np.object_))]))
        return responses
