"""mlp_postprocess: LOGITS FP32[1, 8] -> PROBABILITIES FP32[8] (softmax), CLASS INT32[1] (argmax)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            logits = pb_utils.get_input_tensor_by_name(request, "LOGITS").as_numpy().reshape(8)
            exp = np.exp(logits - logits.max())
            probabilities = (exp / exp.sum()).astype(np.float32)
            best = np.array([probabilities.argmax()], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("PROBABILITIES", probabilities), pb_utils.Tensor("CLASS", best)]))
        return responses
