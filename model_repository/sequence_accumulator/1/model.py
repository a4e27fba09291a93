"""sequence_accumulator: OUTPUT = the sum of INPUT over the sequence so far.

The host's sequence batcher adds the control inputs START, END, READY (INT32 0/1) and CORRID
(UINT64, the request's correlation id) to every request. Running sums are kept per correlation
id, so the model is right under either scheduling strategy (direct or oldest); a padding row
(READY 0, in the direct strategy) is answered with 0 and changes nothing.
"""

import numpy as np
import triton_python_backend_utils as pb_utils


def _scalar(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy().item()


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            value = _scalar(request, "INPUT")
            if _scalar(request, "READY"):
                corrid = _scalar(request, "CORRID")
                total = value + (0 if _scalar(request, "START") else self.sums.get(corrid, 0))
                if _scalar(request, "END"):
                    self.sums.pop(corrid, None)
                else:
                    self.sums[corrid] = total
            else:
                total = 0
            # an INT32 accumulator: wraps around as int32 arithmetic does
            out = pb_utils.Tensor("OUTPUT", np.array([[total]], dtype=np.int64).astype(np.int32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
