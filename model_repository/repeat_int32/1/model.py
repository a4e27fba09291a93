"""repeat_int32: decoupled model; one response per element of IN, sent from a background thread.

Response i carries OUT = [IN[i]] and IDX = [i] and is sent DELAY[i] ms after the previous one; a final
response with only the COMPLETE_FINAL flag closes the stream. execute itself returns after WAIT[0] ms.
"""

import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException(
                f"model '{args['model_name']}' sends any number of responses per request: "
                "enable the decoupled transaction policy in its configuration"
            )
        self.out_dtype = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(config, "OUT")["data_type"]
        )
        self.idx_dtype = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(config, "IDX")["data_type"]
        )
        self.inflight = 0
        self.inflight_done = threading.Condition()

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()
            wait = pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy()
            sender = request.get_response_sender()
            if values.shape != delays.shape:
                error = pb_utils.TritonError(
                    f"IN and DELAY must have the same shape, got {list(values.shape)} "
                    f"and {list(delays.shape)}"
                )
                sender.send(
                    pb_utils.InferenceResponse(error=error),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
                continue
            with self.inflight_done:
                self.inflight += 1
            thread = threading.Thread(target=self._respond, args=(sender, values, delays), daemon=True)
            thread.start()
            time.sleep(int(wait.flat[0]) / 1000)
        return None

    def _respond(self, sender, values, delays):
        try:
            for idx, (value, delay) in enumerate(zip(values.flat, delays.flat)):
                time.sleep(int(delay) / 1000)
                out = pb_utils.Tensor("OUT", np.array([value], dtype=self.out_dtype))
                idx_out = pb_utils.Tensor("IDX", np.array([idx], dtype=self.idx_dtype))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out, idx_out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        finally:
            with self.inflight_done:
                self.inflight -= 1
                self.inflight_done.notify_all()

    def finalize(self):
        # Let the response threads finish before the model goes away.
        with self.inflight_done:
            self.inflight_done.wait_for(lambda: self.inflight == 0, timeout=30)
