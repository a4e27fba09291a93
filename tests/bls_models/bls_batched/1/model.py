"""Each request (a batch of one row): call SPEC["model"] with INPUT0 (see bls_call for SPEC)."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            spec = json.loads(pb_utils.get_input_tensor_by_name(request, "SPEC").as_numpy()
                              .reshape(-1)[0])
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0]
            inputs = [pb_utils.Tensor("INPUT0", x)]
            if "next" in spec:
                inputs.append(pb_utils.Tensor("SPEC", np.array([json.dumps(spec["next"]).encode()],
                                                               dtype=np.object_)))
            answer = pb_utils.InferenceRequest(
                model_name=spec["model"], inputs=inputs,
                requested_output_names=spec.get("outputs", ["OUTPUT0"])).exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=answer.error()))
                continue
            out = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0").as_numpy()
            nested = pb_utils.get_output_tensor_by_name(answer, "RESULT")
            result = json.loads(nested.as_numpy()[0]) if nested is not None else None
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", out[None]),
                pb_utils.Tensor("RESULT", np.array([[json.dumps(result).encode()]],
                                                   dtype=np.object_))]))
        return responses
