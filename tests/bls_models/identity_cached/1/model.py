import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            params = json.loads(request.parameters() or "{}")
            if "correlation_id" not in params:
                params["seen_id"] = request.request_id()
                cid = request.correlation_id()
                params["seen_correlation_id"] = cid if isinstance(cid, str) else int(cid)
                params["seen_flags"] = int(request.flags())
            outputs = [pb_utils.Tensor("OUTPUT0", in0.as_numpy())]
            try:
                responses.append(pb_utils.InferenceResponse(output_tensors=outputs, parameters=params))
            except TypeError:  # Triton 24.10's python backend: responses have no parameters
                responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
