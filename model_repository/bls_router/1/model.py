"""Route each request to `simple` or `onnx_add_sub` with a BLS call (see config.pbtxt)."""

import json

import triton_python_backend_utils as pb_utils

ROUTES = {"python": "simple", "onnx": "onnx_add_sub"}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            route = json.loads(request.parameters()).get("route", "python")
            target = ROUTES.get(route)
            if target is None:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    f"unknown route '{route}': expected one of {sorted(ROUTES)}",
                    pb_utils.TritonError.INVALID_ARG)))
                continue
            # The inputs go on as they are (no copy), and so do the outputs that come back.
            answer = pb_utils.InferenceRequest(
                model_name=target, inputs=request.inputs(),
                requested_output_names=["OUTPUT0", "OUTPUT1"]).exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=answer.error()))
            else:
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=answer.output_tensors(), parameters={"routed_to": target}))
        return responses
