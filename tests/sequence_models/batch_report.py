"""Test model: an accumulator per correlation id (like the example sequence_accumulator) that
also reports, in every response, how many requests its execute received (ROWS) and the READY
value of each of them in order (READY_ROWS, -1 where absent), so tests can see batch
composition, padding rows included."""

import numpy as np
import triton_python_backend_utils as pb_utils


def _value(request, name, default=None):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else tensor.as_numpy().item()


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        ready = np.array([[_value(r, "READY", -1) for r in requests]], dtype=np.int32)
        responses = []
        for request in requests:
            corrid = request.correlation_id()
            value = _value(request, "INPUT")
            total = value + (0 if _value(request, "START") else self.sums.get(corrid, 0))
            if _value(request, "READY", 1):
                self.sums[corrid] = total
            out = np.array([[total]], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT", out.reshape(1, 1) if out.size else out),
                pb_utils.Tensor("ROWS", np.array([[len(requests)]], dtype=np.int32)),
                pb_utils.Tensor("READY_ROWS", ready)]))
        return responses
