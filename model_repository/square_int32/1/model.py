"""square_int32: decoupled; IN = [n] -> n responses OUT = [n * n], then the final flag."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            for _ in range(int(n[0])):
                sender.send(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", (n * n).astype(np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
