"""Issue 15, finding 5: no crash loops, and a crashed worker comes back as it was.

- A native backend that aborts in its load (tests/native/aborting.c) makes the server exit with
  one clear message naming the model, instead of restarting its worker for ever.
- A worker that crashes while serving (a model that aborts the process) is restarted with the
  models loaded through the API and the clients' shared-memory registrations; the crash is
  logged with the model that was executing.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from host.native.testing import build_library, compiler
from host.testing import ServerProcess, ServerStartError, serve, wait_until
from test_e2e_serve import infer, write_identity

pytestmark = [pytest.mark.timeout(180), pytest.mark.modelhost_only]

NATIVE = Path(__file__).parent / "native"

ABORTING_MODEL = """
import os, resource
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file to write
        os.abort()   # the whole process dies, as a segfaulting native model would
"""


@pytest.mark.skipif(compiler() is None, reason="no C compiler to build the test backend")
def test_a_backend_that_aborts_in_load_stops_the_server_with_one_message(tmp_path):
    lib = build_library(NATIVE / "aborting.c", tmp_path / "libs" / "aborting.so")
    repo = tmp_path / "repo"
    write_identity(repo, "fine")
    (repo / "doomed" / "1").mkdir(parents=True)
    (repo / "doomed" / "config.pbtxt").write_text(
        'name: "doomed"\nbackend: "aborting"\nmax_batch_size: 0\n'
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n')
    (repo / "doomed" / "libtriton_aborting.so").write_bytes(lib.read_bytes())
    server = ServerProcess(repo)
    with pytest.raises(ServerStartError):
        server.start(timeout=60, attempts=1)
    try:
        server.process.wait(30)
        log = server.log_text()
        assert server.process.returncode != 0
        assert "while loading model 'doomed' version 1" in log
        assert log.count("Booting worker") == 1  # no restart loop
    finally:
        server.kill()


def test_a_worker_that_crashes_while_serving_comes_back_as_it_was(tmp_path):
    write_identity(tmp_path, "a")
    write_identity(tmp_path, "b")
    (tmp_path / "crasher" / "1").mkdir(parents=True)
    (tmp_path / "crasher" / "config.pbtxt").write_text(
        'name: "crasher"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n')
    (tmp_path / "crasher" / "1" / "model.py").write_text(ABORTING_MODEL)
    key = f"/harden_sup_{uuid.uuid4().hex[:8]}"
    region = shm.create_shared_memory_region(key, key, 16)
    try:
        shm.set_shared_memory_region(region, [np.array([1, 2, 3, 4], np.float32)])
        with serve(tmp_path, "--model-control-mode", "explicit", "--load-model", "a",
                   "--load-model", "crasher", "--allow-client-shm=true") as server:
            client = httpclient.InferenceServerClient(server.url, network_timeout=30)
            override = json.dumps({"backend": "python", "max_batch_size": 2,
                                   "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                                   "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]})
            client.load_model("b", config=override)
            client.unload_model("a")
            client.register_system_shared_memory("kept", key, 16)
            with pytest.raises(Exception):
                infer(client, "crasher", [1.0])  # the worker dies under this request
            wait_until(server.is_ready, timeout=60, message="the worker was not restarted")
            client = httpclient.InferenceServerClient(server.url, network_timeout=30)
            assert client.is_model_ready("b") and not client.is_model_ready("a")
            assert client.get_model_config("b")["max_batch_size"] == 2  # with its override
            assert [r["name"] for r in client.get_system_shared_memory_status()] == ["kept"]
            x = httpclient.InferInput("INPUT0", [1, 4], "FP32")
            x.set_shared_memory("kept", 16)
            assert client.infer("b", [x]).as_numpy("OUTPUT0").tolist() == [[1, 2, 3, 4]]
            log = server.log_text()
            assert "crashed while executing model 'crasher'" in log
            assert server.running()
    finally:
        shm.destroy_shared_memory_region(region)


def test_a_crash_loop_while_serving_stops_the_server(tmp_path):
    (tmp_path / "crasher" / "1").mkdir(parents=True)
    (tmp_path / "crasher" / "config.pbtxt").write_text(
        'name: "crasher"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n')
    (tmp_path / "crasher" / "1" / "model.py").write_text(ABORTING_MODEL)
    server = ServerProcess(tmp_path, env={"MODELHOST_WORKER_CRASH_LIMIT": "2"})
    with server.start():
        for _ in range(10):
            if not server.running():
                break
            wait_until(lambda: server.is_ready() or not server.running(), timeout=60)
            if not server.running():
                break
            with pytest.raises(Exception):
                infer(httpclient.InferenceServerClient(server.url, network_timeout=30), "crasher", [1.0])
        server.process.wait(60)
        assert server.process.returncode != 0
        assert "crashed 3 times within 60 s, the last time executing model 'crasher'" in server.log_text()
