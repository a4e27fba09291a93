"""sequence_implicit_state: OUTPUT = STATE_IN + INPUT; the same value is the next state.

STATE_IN is not one of the model's configured inputs: the host adds it to every request of a
sequence (implicit state). Returning an output tensor named STATE_OUT hands the next value back;
the client does not see it (it is not a configured output).
"""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            state = pb_utils.get_input_tensor_by_name(request, "STATE_IN").as_numpy()
            total = state + pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT", total), pb_utils.Tensor("STATE_OUT", total)]))
        return responses
