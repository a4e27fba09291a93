"""Identity that holds each request until the test says so (the request parameter `gate`, a
directory: the model creates `started` in it, then waits for `release`)."""

import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            gate = json.loads(request.parameters()).get("gate")
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if gate:
                open(os.path.join(gate, "started"), "w").close()
                deadline = time.monotonic() + 30
                while not os.path.exists(os.path.join(gate, "release")) and time.monotonic() < deadline:
                    time.sleep(0.01)
                data = data.copy()  # read the client's input after the region was unregistered
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data)]))
        return responses
