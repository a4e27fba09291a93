"""mlp_preprocess: RAW FP32[16] -> FEATURES FP32[1, 16], standardized."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "RAW").as_numpy()
            features = (raw - raw.mean()) / (raw.std() + 1e-6)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("FEATURES", features.reshape(1, 16).astype(np.float32))]))
        return responses
