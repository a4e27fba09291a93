import threading

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            threading.Thread(target=self.forward, args=(request.get_response_sender(), values)).start()
        return None

    def forward(self, sender, values):
        call = pb_utils.InferenceRequest(model_name="repeat", inputs=[pb_utils.Tensor("IN", values)],
                                         requested_output_names=["OUT"])
        for response in call.exec(decoupled=True):
            if response.has_error():
                sender.send(pb_utils.InferenceResponse(error=response.error()))
                break
            out = pb_utils.get_output_tensor_by_name(response, "OUT")
            if out is not None:
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
