"""`modelhost serve --frontend-processes N`: N front-end processes before one engine process,
behaving as one server to every client (host.frontend, docs/process_model.md).

Real servers, the real tritonclient, fresh connections per request so that the kernel spreads
them over the front ends (gunicorn's shared HTTP socket, SO_REUSEPORT for gRPC).
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from host.testing import ServerProcess, ServerStartError, serve, wait_until

pytestmark = [pytest.mark.timeout(180), pytest.mark.modelhost_only]

FRONT_ENDS = 3

IDENTITY_CONFIG = """
name: "identity"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""

# Records the process it was loaded in, and sleeps when asked (a request in flight at shutdown).
IDENTITY_MODEL = """
import os, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        with open(os.path.join(args["model_repository"], "loaded_in"), "a") as f:
            f.write(f"{os.getpid()}\\n")

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            if x.size and x[0] < 0:
                time.sleep(-float(x[0]))
            out.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""

REPEAT_CONFIG = """
name: "repeat"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

REPEAT_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            sender = r.get_response_sender()
            for v in pb_utils.get_input_tensor_by_name(r, "IN").as_numpy():
                sender.send(pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("OUT", np.array([v], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


# Two steps of the identity: an ensemble's request runs in the engine like any other.
PIPE_CONFIG = """
name: "pipe"
platform: "ensemble"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [
  { model_name: "identity" model_version: -1
    input_map { key: "INPUT0" value: "X" } output_map { key: "OUTPUT0" value: "mid" } },
  { model_name: "identity" model_version: -1
    input_map { key: "INPUT0" value: "mid" } output_map { key: "OUTPUT0" value: "Y" } }
] }
"""


def write_repo(root: Path) -> Path:
    repo = root / "repo"
    for name, config, model in (("identity", IDENTITY_CONFIG, IDENTITY_MODEL),
                                ("repeat", REPEAT_CONFIG, REPEAT_MODEL)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
        (repo / name / "1" / "model.py").write_text(model)
    (repo / "pipe" / "1").mkdir(parents=True)
    (repo / "pipe" / "config.pbtxt").write_text(PIPE_CONFIG)
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = write_repo(tmp_path_factory.mktemp("frontends"))
    with serve(repo, "--frontend-processes", str(FRONT_ENDS), "--allow-client-shm",
               "--model-control-mode", "explicit", "--load-model", "*") as s:
        wait_until(lambda: len(front_ends(s)) == FRONT_ENDS, timeout=30)
        yield s


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def engine_of(server: ServerProcess) -> int:
    """The engine: the master's child that names itself so (host.frontend.process)."""
    for pid in children(server.pid):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "modelhost-engin":
                return pid
        except OSError:
            continue
    raise AssertionError("no engine process")


def front_ends(server: ServerProcess) -> list[int]:
    try:
        engine = engine_of(server)
    except (AssertionError, OSError):
        return []
    return [p for p in children(server.pid) if p != engine and "host serve" in cmdline(p)]


def http(server: ServerProcess) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.url)  # a new connection


def grpc(server: ServerProcess) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(server.grpc_url)


def infer_http(server: ServerProcess, values) -> np.ndarray:
    x = np.asarray(values, np.float32)
    i = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    with http(server) as c:
        return c.infer("identity", [i]).as_numpy("OUTPUT0")


def infer_grpc(server: ServerProcess, values) -> np.ndarray:
    x = np.asarray(values, np.float32)
    i = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    with grpc(server) as c:
        return c.infer("identity", [i]).as_numpy("OUTPUT0")


def success_count(server: ServerProcess, model: str = "identity") -> int:
    with http(server) as c:
        stats = c.get_inference_statistics(model)
    return int(stats["model_stats"][0]["inference_stats"]["success"]["count"])


def test_processes_and_one_copy_of_each_model(server, tmp_path):
    engine = engine_of(server)
    fronts = front_ends(server)
    assert len(fronts) == FRONT_ENDS and engine not in fronts
    # every front end serves (many fresh connections reach all of them) and the model was
    # loaded once, in the engine
    for k in range(30):
        assert infer_http(server, [k, 1]).tolist() == [k, 1]
    loaded = (Path(server.model_repository) / "identity" / "loaded_in").read_text().split()
    assert loaded == [str(engine)]


def test_statistics_and_metrics_count_every_front_ends_requests(server):
    before = success_count(server)
    for k in range(12):
        infer_http(server, [k])
        infer_grpc(server, [k])
    # asked through any front end, the counts are the same and include all 24
    counts = {success_count(server) for _ in range(9)}
    assert counts == {before + 24}
    with grpc(server) as c:
        stats = c.get_inference_statistics("identity", as_json=True)
    assert int(stats["model_stats"][0]["inference_stats"]["success"]["count"]) == before + 24
    import urllib.request

    text = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    line = next(ln for ln in text.splitlines()
                if ln.startswith("nv_inference_request_success{") and 'model="identity"' in ln)
    assert float(line.rsplit(" ", 1)[1]) == before + 24


def test_model_control_through_one_front_end_is_seen_by_all(server):
    with http(server) as c:
        c.unload_model("repeat")
    assert all(not http(server).is_model_ready("repeat") for _ in range(6))
    assert all(not grpc(server).is_model_ready("repeat") for _ in range(6))
    with grpc(server) as c:
        c.load_model("repeat")
    assert all(http(server).is_model_ready("repeat") for _ in range(6))
    index = {m["name"]: m.get("state") for m in http(server).get_model_repository_index()}
    assert index["repeat"] == "READY" and index["identity"] == "READY"


def test_shared_memory_registered_through_one_front_end_serves_all(server):
    x = np.arange(8, dtype=np.float32)
    key = f"/fe_test_{os.getpid()}"
    handle = shm.create_shared_memory_region("fe_in", key, 2 * x.nbytes)
    try:
        shm.set_shared_memory_region(handle, [x])
        with http(server) as c:
            c.register_system_shared_memory("fe_in", key, 2 * x.nbytes)
        for _ in range(6):  # status and use through fresh connections, both protocols
            assert [r["name"] for r in http(server).get_system_shared_memory_status()] == ["fe_in"]
            with grpc(server) as c:
                assert "fe_in" in c.get_system_shared_memory_status(as_json=True)["regions"]
            i = httpclient.InferInput("INPUT0", [8], "FP32")
            i.set_shared_memory("fe_in", x.nbytes)
            o = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
            o.set_shared_memory("fe_in", x.nbytes, offset=x.nbytes)
            with http(server) as c:
                c.infer("identity", [i], outputs=[o])
            out = shm.get_contents_as_numpy(handle, np.float32, [8], offset=x.nbytes)
            assert out.tolist() == x.tolist()
        with grpc(server) as c:
            c.unregister_system_shared_memory("fe_in")
        assert all(http(server).get_system_shared_memory_status() == [] for _ in range(6))
    finally:
        shm.destroy_shared_memory_region(handle)


def test_decoupled_stream_and_errors_through_front_ends(server):
    responses: queue.Queue = queue.Queue()
    with grpc(server) as c:
        c.start_stream(callback=lambda result, error: responses.put((result, error)))
        i = grpcclient.InferInput("IN", [3], "INT32")
        i.set_data_from_numpy(np.array([7, 8, 9], np.int32))
        c.async_stream_infer("repeat", [i])
        got = [responses.get(timeout=20) for _ in range(3)]
        c.stop_stream()
    assert [r.as_numpy("OUT").tolist() for r, e in got] == [[7], [8], [9]]
    with pytest.raises(InferenceServerException) as err:  # Triton's texts, as one process
        with http(server) as c:
            c.infer("nope", [])
    assert "Request for unknown model: 'nope' is not found" in str(err.value)
    i = httpclient.InferInput("IN", [1], "INT32")
    i.set_data_from_numpy(np.array([1], np.int32))
    with pytest.raises(InferenceServerException) as err:
        with http(server) as c:
            c.infer("repeat", [i])
    assert "doesn't support models with decoupled transaction policy" in str(err.value)


def test_a_front_end_that_dies_loses_nothing(server):
    key = f"/fe_keep_{os.getpid()}"
    handle = shm.create_shared_memory_region("fe_keep", key, 64)
    try:
        with http(server) as c:
            c.register_system_shared_memory("fe_keep", key, 64)
        victim = front_ends(server)[0]
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: len(front_ends(server)) == FRONT_ENDS and victim not in front_ends(server),
                   timeout=30)
        for _ in range(6):
            assert [r["name"] for r in http(server).get_system_shared_memory_status()] == ["fe_keep"]
            assert infer_grpc(server, [3]).tolist() == [3]
        with http(server) as c:
            c.unregister_system_shared_memory("fe_keep")
    finally:
        shm.destroy_shared_memory_region(handle)


def test_sigterm_lets_requests_in_flight_finish(tmp_path):
    repo = write_repo(tmp_path)
    with serve(repo, "--frontend-processes", "2") as s:
        result: dict = {}

        def slow():
            try:
                result["out"] = infer_http(s, [-1.5, 2])
            except Exception as exc:  # noqa: BLE001 - reported below
                result["error"] = exc

        t = threading.Thread(target=slow)
        t.start()
        time.sleep(0.5)
        os.killpg(s.pid, signal.SIGTERM)  # the whole group, as a terminal or systemd does
        t.join(30)
        assert "error" not in result, result
        assert result["out"].tolist() == [-1.5, 2]
        assert s.process.wait(30) == 0


def test_an_engine_that_dies_comes_back_with_its_models_and_registrations(tmp_path):
    repo = write_repo(tmp_path)
    key = f"/fe_engine_{os.getpid()}"
    handle = shm.create_shared_memory_region("fe_engine", key, 64)
    try:
        with serve(repo, "--frontend-processes", "2", "--allow-client-shm",
                   "--model-control-mode", "explicit", "--load-model", "identity") as s:
            with http(s) as c:
                c.load_model("repeat")  # through the API: the journal keeps it
                c.register_system_shared_memory("fe_engine", key, 64)
            old = engine_of(s)
            os.kill(old, signal.SIGKILL)

            def serving_again() -> bool:
                try:
                    return engine_of(s) != old and infer_http(s, [2, 3]).tolist() == [2, 3]
                except Exception:  # noqa: BLE001 - while it restarts, any failure means "not yet"
                    return False

            wait_until(serving_again, timeout=60)
            assert s.running()
            assert http(s).is_model_ready("repeat")
            assert [r["name"] for r in http(s).get_system_shared_memory_status()] == ["fe_engine"]
            assert "the engine process died; restarting it" in s.log_text()
            with http(s) as c:
                c.unregister_system_shared_memory("fe_engine")
    finally:
        shm.destroy_shared_memory_region(handle)


def test_an_engine_crash_loop_stops_the_server(tmp_path):
    repo = write_repo(tmp_path)
    s = ServerProcess(repo, "--frontend-processes", "2", env={"MODELHOST_WORKER_CRASH_LIMIT": "0"})
    with s:
        os.kill(engine_of(s), signal.SIGKILL)
        assert s.process.wait(30) == 1
        assert "the engine process crashed 1 times within 60 s; not restarting it again" in s.log_text()


def test_start_up_failures_are_one_line(tmp_path):
    repo = write_repo(tmp_path)
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "config.pbtxt").write_text('name: "broken"\nbackend: "python"\n'
                                                  'input [ { name: "X" data_type: TYPE_BOGUS dims: [1] } ]\n')
    s = ServerProcess(repo, "--frontend-processes", "2", "--exit-on-error")
    with pytest.raises(ServerStartError):
        s.start(timeout=60)
    assert s.process.wait(30) == 1
    text = s.log_text()
    assert "failed to load all models" in text and "Traceback" not in text
    for args, message in ((["--frontend-processes", "0"], "expected a number of processes"),
                          (["--frontend-processes", "2", "--grpc-port", "0"],
                           "--grpc-port 0 (any free port) cannot be shared")):
        run = subprocess.run([sys.executable, "-m", "host", "serve", "--model-repository", str(repo),
                              "--http-port", "0", "--metrics-port", "0", *args],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode != 0 and message in run.stderr + run.stdout


def test_large_tensors_cross_out_of_band_both_ways(server):
    # 4 MiB in and out: past wire.OUT_OF_BAND, the arrays travel after the pickle
    x = np.random.default_rng(7).random(1 << 20, dtype=np.float32)
    assert np.array_equal(infer_http(server, x), x)
    assert np.array_equal(infer_grpc(server, x), x)


def test_generate_and_settings_through_front_ends(server):
    import json
    import urllib.request

    body = json.dumps({"IN": [4, 5]}).encode()
    req = urllib.request.Request(f"{server.http_url}/v2/models/repeat/generate_stream", data=body,
                                 method="POST")
    with urllib.request.urlopen(req, timeout=20) as r:
        events = [json.loads(line[len(b"data: "):]) for line in r.read().splitlines()
                  if line.startswith(b"data: ")]
    assert [e["OUT"] for e in events] == [4, 5]
    # log settings changed through one front end are the engine's, and so every front end's
    with http(server) as c:
        c.update_log_settings({"log_verbose_level": 0, "log_info": False})
    assert all(http(server).get_log_settings()["log_info"] is False for _ in range(6))
    with grpc(server) as c:
        c.update_log_settings({"log_info": True})
    assert all(http(server).get_log_settings()["log_info"] is True for _ in range(6))
    with http(server) as c:
        c.update_trace_settings("identity", {"trace_rate": "7"})
    assert {http(server).get_trace_settings("identity")["trace_rate"] for _ in range(6)} == {"7"}


def test_ensemble_through_front_ends(server):
    x = np.array([1.5, -0.0, 3.0], np.float32)
    for _ in range(4):  # fresh connections: several front ends
        i = httpclient.InferInput("X", [3], "FP32")
        i.set_data_from_numpy(x)
        with http(server) as c:
            assert c.infer("pipe", [i]).as_numpy("Y").tolist() == x.tolist()
        g = grpcclient.InferInput("X", [3], "FP32")
        g.set_data_from_numpy(x)
        with grpc(server) as c:
            assert c.infer("pipe", [g]).as_numpy("Y").tolist() == x.tolist()


def test_a_sequence_spread_over_front_ends_keeps_its_state(tmp_path):
    # Each request of the sequence on a new connection, so on any front end: the sequence
    # batcher is the engine's, one for all of them.
    repo = tmp_path / "repo"
    example = Path(__file__).resolve().parent.parent / "model_repository" / "sequence_accumulator"
    import shutil

    shutil.copytree(example, repo / "sequence_accumulator")
    with serve(repo, "--frontend-processes", "2") as s:
        totals = []
        for k, value in enumerate([3, 4, 5, 6]):
            i = httpclient.InferInput("INPUT", [1, 1], "INT32")
            i.set_data_from_numpy(np.array([[value]], np.int32))
            with http(s) as c:
                r = c.infer("sequence_accumulator", [i], sequence_id=42, sequence_start=k == 0,
                            sequence_end=k == 3)
            totals.append(int(r.as_numpy("OUTPUT").reshape(-1)[0]))
        assert totals == [3, 7, 12, 18]
        with pytest.raises(InferenceServerException) as err:  # Triton's text, from the engine
            i = httpclient.InferInput("INPUT", [1, 1], "INT32")
            i.set_data_from_numpy(np.array([[1]], np.int32))
            with http(s) as c:
                c.infer("sequence_accumulator", [i], sequence_id=42)
        assert "inference request for sequence 42" in str(err.value)
