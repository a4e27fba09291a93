"""echo: OUT = IN, PARAMS = the request parameters (JSON); sleeps DELAY seconds when given;
with a "log" parameter, logs it at each level (INFO, WARNING, ERROR, VERBOSE)."""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(0.2)  # a load that takes measurable time (nv_model_load_duration_secs)

    def execute(self, requests):
        responses = []
        for request in requests:
            delay = pb_utils.get_input_tensor_by_name(request, "DELAY")
            if delay is not None:
                time.sleep(float(delay.as_numpy()[0]))
            tag = json.loads(request.parameters() or "{}").get("log")
            if tag:
                logger = pb_utils.Logger
                logger.log_info(f"{tag} info")
                logger.log_warn(f"{tag} warning")
                logger.log_error(f"{tag} error")
                logger.log_verbose(f"{tag} verbose")
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            params = np.array([request.parameters().encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUT", data), pb_utils.Tensor("PARAMS", params)]))
        return responses
