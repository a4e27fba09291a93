"""batched_add: OUTPUT0 = INPUT0 + INPUT0; BATCH = rows received by this execute call in total.

With dynamic batching the python backend passes the queued requests to one execute call as a list
(their tensors are not concatenated); each request still gets its own response.
"""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        total_rows = sum(in0.shape[0] for in0 in inputs)
        responses = []
        for in0 in inputs:
            out0 = pb_utils.Tensor("OUTPUT0", in0 + in0)
            batch = pb_utils.Tensor("BATCH", np.full((in0.shape[0], 1), total_rows, dtype=np.int32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out0, batch]))
        return responses
