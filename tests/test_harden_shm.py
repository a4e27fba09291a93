"""Issue 15, finding 3: a client's shared memory must never crash the server.

A client registers a region and then shrinks the object under it (ftruncate). The next request
that reads or writes the region must get a clear 4xx error, not kill the worker with SIGBUS; the
other client's registration stays and keeps working.
"""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from host.testing import serve
from test_e2e_serve import write_identity

pytestmark = [pytest.mark.timeout(120), pytest.mark.modelhost_only]


def _region(size):
    key = f"/harden_{uuid.uuid4().hex[:10]}"
    return key, shm.create_shared_memory_region(key, key, size)


def _infer(module, client, in_region, out_region, n=4):
    x = module.InferInput("INPUT0", [n], "FP32")
    x.set_shared_memory(in_region, n * 4)
    out = module.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory(out_region, n * 4)
    return client.infer("a", [x], outputs=[out])


def test_shrunk_region_fails_its_request_and_spares_everyone_else(tmp_path):
    write_identity(tmp_path, "a")
    good_key, good = _region(32)
    bad_key, bad = _region(32)
    try:
        shm.set_shared_memory_region(good, [np.arange(4, dtype=np.float32)])
        shm.set_shared_memory_region(bad, [np.arange(4, dtype=np.float32)])
        with serve(tmp_path, "--allow-client-shm=true") as server:
            http = httpclient.InferenceServerClient(server.url)
            grpc = grpcclient.InferenceServerClient(server.grpc_url)
            http.register_system_shared_memory("good", good_key, 32)
            http.register_system_shared_memory("bad", bad_key, 32)
            # The careless (or hostile) client shrinks its object under the registration.
            fd = os.open("/dev/shm" + bad_key, os.O_RDWR)
            try:
                os.ftruncate(fd, 0)
            finally:
                os.close(fd)
            for module, client in ((httpclient, http), (grpcclient, grpc)):
                for in_region, out_region in (("bad", "good"), ("good", "bad")):
                    with pytest.raises(InferenceServerException, match="shrank to 0 bytes") as info:
                        _infer(module, client, in_region, out_region)
                    assert info.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
            assert server.running()
            # every other registration is still there and still works
            names = {r["name"] for r in http.get_system_shared_memory_status()}
            assert names == {"good", "bad"}
            _infer(httpclient, http, "good", "good")
            assert shm.get_contents_as_numpy(good, np.float32, [4]).tolist() == [0, 1, 2, 3]
            # the client may re-register after fixing its object
            http.unregister_system_shared_memory("bad")
            fd = os.open("/dev/shm" + bad_key, os.O_RDWR)
            os.ftruncate(fd, 32)
            os.close(fd)
            http.register_system_shared_memory("bad", bad_key, 32)
            _infer(grpcclient, grpc, "good", "bad")
    finally:
        for handle in (good, bad):
            try:
                shm.destroy_shared_memory_region(handle)
            except Exception:
                pass


GATED_READER = """
import os, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.gate = os.path.join(args["model_repository"], "gate")

    def execute(self, requests):
        deadline = time.monotonic() + 30
        while os.path.exists(self.gate) and time.monotonic() < deadline:
            time.sleep(0.01)
        # reads the input only now, after the client shrank the object under it
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", np.array(pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()))])
            for r in requests]
"""


def test_a_shrink_that_races_the_check_does_not_kill_the_server(tmp_path):
    """The client shrinks its object after the request was admitted (size checked) and before
    the model reads it: the SIGBUS guard keeps the worker alive and marks the region."""
    model = write_identity(tmp_path, "a")
    (model / "1" / "model.py").write_text(GATED_READER)
    size = 3 * 4096
    key, region = _region(size)
    try:
        shm.set_shared_memory_region(region, [np.ones(size // 4, np.float32)])
        with serve(tmp_path, "--allow-client-shm=true") as server:
            http = httpclient.InferenceServerClient(server.url, network_timeout=30)
            http.register_system_shared_memory("r", key, size)
            (model / "gate").touch()
            import threading

            result = {}

            def request():
                x = httpclient.InferInput("INPUT0", [size // 4], "FP32")
                x.set_shared_memory("r", size)
                try:
                    result["out"] = http.infer("a", [x]).as_numpy("OUTPUT0")
                except Exception as exc:  # noqa: BLE001 - what it is does not matter here
                    result["error"] = exc

            worker = threading.Thread(target=request)
            worker.start()
            import time

            time.sleep(1.0)  # admitted and waiting at the gate
            fd = os.open("/dev/shm" + key, os.O_RDWR)
            os.ftruncate(fd, 0)
            os.close(fd)
            (model / "gate").unlink()
            worker.join(30)
            assert result  # answered, one way or the other
            assert server.running() and http.is_server_ready()
            assert "SIGBUS" not in server.log_text()
            # the region is reported unusable from now on; the server serves on
            x = httpclient.InferInput("INPUT0", [4], "FP32")
            x.set_shared_memory("r", 16)
            with pytest.raises(InferenceServerException, match="no longer usable"):
                http.infer("a", [x])
            y = httpclient.InferInput("INPUT0", [2], "FP32")
            y.set_data_from_numpy(np.array([1.0, 2.0], np.float32))
            assert http.infer("a", [y]).as_numpy("OUTPUT0").tolist() == [1.0, 2.0]
    finally:
        shm.destroy_shared_memory_region(region)
