"""Loads only alongside its peer: initialize marks itself in $PARITY_GATE and waits (up to
20 s) for the peer's mark, so OUTPUT0 says whether both models were loading at the same time."""

import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

PEERS = ("wait_a", "wait_b")


class TritonPythonModel:
    def initialize(self, args):
        gate = os.environ.get("PARITY_GATE", "")
        name = args["model_name"]
        self.saw_peer = False
        if gate:
            open(os.path.join(gate, name), "w").close()
            peer = [p for p in PEERS if p != name][0]
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not self.saw_peer:
                self.saw_peer = os.path.exists(os.path.join(gate, peer))
                time.sleep(0.02)

    def execute(self, requests):
        out = np.array([self.saw_peer])
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out)]) for _ in requests]
