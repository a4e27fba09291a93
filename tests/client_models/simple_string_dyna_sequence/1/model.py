"""simple_string_dyna_sequence: Triton's QA "dyna sequence" semantics with string correlation ids.

START: OUTPUT = INPUT; later requests add INPUT to the running sum; the END
request adds the correlation id (a decimal string) to its answer.
"""

import numpy as np
import triton_python_backend_utils as pb_utils


def _value(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0]


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            corrid = request.correlation_id()
            start, end = int(_value(request, "START")), int(_value(request, "END"))
            value = int(_value(request, "INPUT"))
            total = value + (0 if start else self.sums.get(corrid, 0))
            self.sums[corrid] = total
            out = total
            if end:
                self.sums.pop(corrid, None)
                out += int(corrid)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT", np.array([[out]], dtype=np.int32))]))
        return responses
