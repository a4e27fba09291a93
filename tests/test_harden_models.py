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


SABOTEUR = """
import ctypes, threading
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        # Kill the gRPC polling thread the way a bug would: an exception raised in it from outside
        # any call it handles (delivered when its next event arrives).
        for thread in threading.enumerate():
            if thread.name.startswith("grpc-") and thread is not threading.current_thread():
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident),
                                                           ctypes.py_object(SystemExit))
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
"""


def test_a_dead_grpc_loop_is_noticed_and_the_worker_replaced(tmp_path):
    _write(tmp_path, "quitter")
    (tmp_path / "saboteur" / "1").mkdir(parents=True)
    (tmp_path / "saboteur" / "config.pbtxt").write_text(CONFIG.format(name="saboteur", batch=0, extra=""))
    (tmp_path / "saboteur" / "1" / "model.py").write_text(SABOTEUR)
    with serve(tmp_path) as server:
        http = httpclient.InferenceServerClient(server.url, network_timeout=20)
        assert _http(http, "saboteur", 1.0).tolist() == [1.0]  # runs on an HTTP thread
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        try:  # the event this call makes is what the dead thread never handles
            grpc.is_server_live(client_timeout=2)
        except InferenceServerException:
            pass
        from host.testing import wait_until

        wait_until(lambda: "restarting the worker" in server.log_text(), timeout=30)
        wait_until(server.is_ready, timeout=60)
        wait_until(lambda: _grpc_ok(server), timeout=60)
        log = server.log_text()
        assert "a gRPC polling thread died: SystemExit" in log
        assert server.running()


def _grpc_ok(server) -> bool:
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        return _grpc(client, "quitter", 3.0).tolist() == [3.0]
    except InferenceServerException:
        return False


def test_sys_exit_while_loading_fails_only_that_model(tmp_path):
    _write(tmp_path, "quitter")
    (tmp_path / "leaver" / "1").mkdir(parents=True)
    (tmp_path / "leaver" / "config.pbtxt").write_text(CONFIG.format(name="leaver", batch=0, extra=""))
    (tmp_path / "leaver" / "1" / "model.py").write_text(
        "import sys\nclass TritonPythonModel:\n    def initialize(self, args):\n        sys.exit(4)\n")
    with serve(tmp_path, "--model-control-mode", "explicit", "--load-model", "*") as server:
        http = httpclient.InferenceServerClient(server.url, network_timeout=20)
        rows = {r["name"]: r for r in http.get_model_repository_index()}
        assert rows["leaver"]["state"] == "UNAVAILABLE" and "SystemExit" in rows["leaver"]["reason"]
        for client in (http, grpcclient.InferenceServerClient(server.grpc_url)):
            with pytest.raises(InferenceServerException, match="SystemExit"):
                client.load_model("leaver")
        assert _http(http, "quitter", 1.0).tolist() == [1.0]
        assert server.running()
