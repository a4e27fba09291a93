"""simple_sequence: OUTPUT = INPUT + START (1 on the first request of a sequence, else 0)."""

import triton_python_backend_utils as pb_utils


def _tensor(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy()


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            out = _tensor(request, "INPUT") + _tensor(request, "START")
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", out)]))
        return responses
