"""Test model: answers every input it received (the host's control and state inputs included)
as an output of the same name prefixed with "SEEN_", and OUTPUT = INPUT. Also reports what
`request.correlation_id()` and `request.flags()` returned, as SEEN_ID (BYTES) and SEEN_FLAGS."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = [pb_utils.Tensor("SEEN_" + t.name(), t.as_numpy()) for t in request.inputs()]
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            seen_id = np.array([str(request.correlation_id()).encode()], dtype=object)
            outputs.append(pb_utils.Tensor("OUTPUT", value))
            outputs.append(pb_utils.Tensor("SEEN_ID", seen_id))
            outputs.append(pb_utils.Tensor("SEEN_FLAGS", np.array([request.flags()], dtype=np.uint32)))
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
