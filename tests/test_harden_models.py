"""Issue 15, finding 4: a model must not break the front ends.

A python model that calls sys.exit() (a BaseException) during a gRPC or HTTP request fails only
that request; the ports keep answering, health stays true, later requests succeed.
"""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from host.testing import serve

pytestmark = [pytest.mark.timeout(120), pytest.mark.modelhost_only]

EXITING = """
import sys
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            if x.size and x.flat[0] < 0:
                sys.exit(3)          # a careless model: BaseException, not Exception
            if x.size and x.flat[0] == 13:
                raise KeyboardInterrupt()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: {batch}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
{extra}
"""


def _write(repo, name, batch=0, extra=""):
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, batch=batch, extra=extra))
    (repo / name / "1" / "model.py").write_text(EXITING)


def _grpc(client, model, value, batch=False):
    data = np.array([[value]] if batch else [value], np.float32)
    x = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
    x.set_data_from_numpy(data)
    return client.infer(model, [x], client_timeout=20).as_numpy("OUTPUT0")


def _http(client, model, value):
    x = httpclient.InferInput("INPUT0", [1], "FP32")
    x.set_data_from_numpy(np.array([value], np.float32))
    return client.infer(model, [x]).as_numpy("OUTPUT0")


def test_sys_exit_in_a_model_fails_only_its_request(tmp_path):
    _write(tmp_path, "quitter")
    _write(tmp_path, "batched_quitter", batch=4, extra="dynamic_batching { }")
    with serve(tmp_path) as server:
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        http = httpclient.InferenceServerClient(server.url, network_timeout=20)
        for _ in range(3):  # more than once: no polling thread may be lost on the way
            for model, batch in (("quitter", False), ("batched_quitter", True)):
                with pytest.raises(InferenceServerException, match="SystemExit"):
                    _grpc(grpc, model, -1.0, batch)
                with pytest.raises(InferenceServerException, match="KeyboardInterrupt"):
                    _grpc(grpc, model, 13.0, batch)
                assert _grpc(grpc, model, 2.0, batch).ravel().tolist() == [2.0]
            with pytest.raises(InferenceServerException, match="SystemExit"):
                _http(http, "quitter", -1.0)
            assert _http(http, "quitter", 5.0).tolist() == [5.0]
        assert grpc.is_server_ready() and http.is_server_ready()
        assert server.running()
        assert "SystemExit" in server.log_text()  # logged
