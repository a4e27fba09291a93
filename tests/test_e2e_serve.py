"""`modelhost serve` as a user runs it: signals, --exit-on-error, control modes, configs left out.

Each test starts its own real server (host.testing) on a small repository it writes, and talks to
it with the real tritonclient.
"""

from __future__ import annotations

import shutil
import signal
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from host.testing import ServerProcess, ServerStartError, serve, wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.modelhost_only]

IDENTITY_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
"""

IDENTITY_MODEL = """
import os, time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.marker = os.path.join(args["model_repository"], "finalized")

    def execute(self, requests):
        open(self.marker + ".started", "w").close()
        time.sleep(float(os.environ.get("SLOW_SECONDS", "0")))
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]

    def finalize(self):
        with open(self.marker, "w") as f:
            f.write("done")
"""


def write_identity(repo: Path, name: str, config: bool = True, model: str = IDENTITY_MODEL) -> Path:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    if config:
        (repo / name / "config.pbtxt").write_text(IDENTITY_CONFIG.format(name=name))
    (repo / name / "1" / "model.py").write_text(model)
    return repo / name


def infer(client: httpclient.InferenceServerClient, model: str, values) -> np.ndarray:
    x = np.asarray(values, dtype=np.float32)
    i = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    return client.infer(model, [i]).as_numpy("OUTPUT0")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_lets_inflight_request_finish_then_finalizes(tmp_path, sig):
    path = write_identity(tmp_path, "slow")
    server = ServerProcess(tmp_path, env={"SLOW_SECONDS": "1.0"}).start()
    try:
        client = httpclient.InferenceServerClient(server.url, network_timeout=30)
        result: list[np.ndarray] = []
        t = threading.Thread(target=lambda: result.append(infer(client, "slow", [1, 2, 3])))
        t.start()
        wait_until(lambda: (path / "finalized.started").exists(), timeout=20)  # inside execute now
        assert server.stop(sig, timeout=30) == 0, server.log_text()[-3000:]
        t.join(30)
        assert result and result[0].tolist() == [1, 2, 3]
        assert (path / "finalized").read_text() == "done", "finalize() was not called"
    finally:
        server.kill()


def test_a_stopping_server_serves_grpc_until_its_http_connections_end(tmp_path):
    """Triton's order (main.cc: the HTTP front end's Stop with the exit timeout, then gRPC's
    GracefulStop; checked on Triton 2.51): while an HTTP request is still in flight after the
    signal, gRPC still serves; once the HTTP connections have ended it takes no new call."""
    path = write_identity(tmp_path, "slow")
    server = ServerProcess(tmp_path, env={"SLOW_SECONDS": "3.0"}).start()
    try:
        client = httpclient.InferenceServerClient(server.url, network_timeout=30)
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        assert grpc.is_server_live()
        result: list[np.ndarray] = []
        t = threading.Thread(target=lambda: result.append(infer(client, "slow", [4.0])))
        t.start()
        wait_until(lambda: (path / "finalized.started").exists(), timeout=20)  # in execute now
        assert server.process is not None
        server.process.send_signal(signal.SIGTERM)
        wait_until(lambda: "Found 1 HTTP service connections" in server.log_text(), timeout=20)
        assert grpc.is_server_live(client_timeout=10)
        t.join(30)
        assert result and result[0].tolist() == [4.0]

        def refused() -> bool:
            try:
                grpc.is_server_live(client_timeout=2)
                return False
            except InferenceServerException:
                return True
        wait_until(refused, timeout=20)
        assert server.process.wait(30) == 0
    finally:
        server.kill()


def test_exit_on_error_stops_the_server(tmp_path):
    write_identity(tmp_path, "good")
    write_identity(tmp_path, "bad", model="raise RuntimeError('boom at import')\n")
    server = ServerProcess(tmp_path, "--exit-on-error")
    with pytest.raises(ServerStartError):
        server.start(timeout=30, attempts=1)
    assert server.process is not None and server.process.wait(30) != 0
    assert "boom at import" in server.log_text()
    server.kill()


def test_failed_model_is_unavailable_and_others_serve(tmp_path):
    write_identity(tmp_path, "good")
    write_identity(tmp_path, "bad", model="raise RuntimeError('boom at import')\n")
    with serve(tmp_path) as server:
        client = httpclient.InferenceServerClient(server.url)
        rows = {r["name"]: r for r in client.get_model_repository_index()}
        assert rows["good"]["state"] == "READY"
        assert rows["bad"]["state"] == "UNAVAILABLE" and "boom at import" in rows["bad"]["reason"]
        assert infer(client, "good", [5.0]).tolist() == [5.0]
        with pytest.raises(InferenceServerException, match="no available versions"):
            infer(client, "bad", [1.0])


def test_explicit_mode_load_with_config_override_and_unload(tmp_path):
    write_identity(tmp_path, "a")
    write_identity(tmp_path, "b")
    with serve(tmp_path, "--model-control-mode", "explicit", "--load-model", "a") as server:
        client = httpclient.InferenceServerClient(server.url)
        assert client.is_model_ready("a") and not client.is_model_ready("b")
        override = ('{"backend": "python", "max_batch_size": 4, '
                    '"input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}], '
                    '"output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]}')
        client.load_model("b", config=override)
        assert client.is_model_ready("b")
        assert client.get_model_config("b")["max_batch_size"] == 4
        assert infer(client, "b", [[1.0, 2.0]]).tolist() == [[1.0, 2.0]]
        client.unload_model("b")
        assert not client.is_model_ready("b")
        with pytest.raises(InferenceServerException, match="failed to load 'nope'"):
            client.load_model("nope")
        assert infer(client, "a", [3.0]).tolist() == [3.0]  # still serving


def test_poll_mode_follows_the_repository(tmp_path):
    write_identity(tmp_path, "first")
    with serve(tmp_path, "--model-control-mode", "poll", "--repository-poll-secs", "0.3") as server:
        client = httpclient.InferenceServerClient(server.url)
        assert client.is_model_ready("first")
        write_identity(tmp_path, "second")
        wait_until(lambda: client.is_model_ready("second"), timeout=20)
        assert infer(client, "second", [7.0]).tolist() == [7.0]
        shutil.rmtree(tmp_path / "second")
        wait_until(lambda: not client.is_model_ready("second"), timeout=20)
        with pytest.raises(InferenceServerException, match="explicit model load / unload is not allowed"):
            client.load_model("first")


AUTO_MODEL = IDENTITY_MODEL + """
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]})
        auto_complete_model_config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]})
        return auto_complete_model_config
"""


def test_model_without_config_is_auto_completed(tmp_path):
    write_identity(tmp_path, "noconfig", config=False, model=AUTO_MODEL)
    with serve(tmp_path) as server:
        client = httpclient.InferenceServerClient(server.url)
        config = client.get_model_config("noconfig")
        assert config["name"] == "noconfig" and config["backend"] == "python"
        assert [i["name"] for i in config["input"]] == ["INPUT0"]
        assert infer(client, "noconfig", [1.5]).tolist() == [1.5]


# --- `tritonserver`: Triton's command name, with Triton's defaults ------------------------------
TRITONSERVER = ("-m", "host.tritonserver")


def test_tritonserver_command_is_installed():
    from importlib.metadata import entry_points

    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert scripts.get("tritonserver") == "host.tritonserver:main"


def test_tritonserver_serves_with_tritons_name(tmp_path):
    write_identity(tmp_path, "good")
    with ServerProcess(tmp_path, entry=TRITONSERVER) as server:
        http = httpclient.InferenceServerClient(server.url)
        assert http.get_server_metadata()["name"] == "triton"
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        assert grpc.get_server_metadata().name == "triton"
        assert infer(http, "good", [2.0]).tolist() == [2.0]


def test_tritonserver_exits_when_a_model_fails_to_load(tmp_path):
    write_identity(tmp_path, "good")
    write_identity(tmp_path, "bad", model="raise RuntimeError('boom at import')\n")
    server = ServerProcess(tmp_path, entry=TRITONSERVER)
    with pytest.raises(ServerStartError):
        server.start(timeout=30, attempts=1)
    assert server.process is not None and server.process.wait(30) == 1
    assert "boom at import" in server.log_text()
    server.kill()


def test_tritonserver_flags_override_its_defaults(tmp_path):
    write_identity(tmp_path, "good")
    write_identity(tmp_path, "bad", model="raise RuntimeError('boom at import')\n")
    # Triton's own way to keep serving: --exit-on-error=false; with --strict-readiness=false the
    # server then reports ready although 'bad' failed.
    with ServerProcess(tmp_path, "--exit-on-error=false", "--strict-readiness=false", "--id=edge",
                       entry=TRITONSERVER) as server:
        client = httpclient.InferenceServerClient(server.url)
        assert client.get_server_metadata()["name"] == "edge"
        assert client.is_server_ready()
        assert not client.is_model_ready("bad")
        assert infer(client, "good", [3.0]).tolist() == [3.0]


# --- the dynamic batcher's equal-shape rule holds for python models, as in Triton's core ---------
SHAPES_CONFIG = """
name: "shapes"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 100000 }
"""

SHAPES_MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        arrays = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        if len({a.shape[1:] for a in arrays}) != 1:
            raise ValueError("one execute got inputs of different shapes")
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", a)])
                for a in arrays]
"""


def test_python_model_batches_only_equal_shapes(tmp_path):
    (tmp_path / "shapes" / "1").mkdir(parents=True)
    (tmp_path / "shapes" / "config.pbtxt").write_text(SHAPES_CONFIG)
    (tmp_path / "shapes" / "1" / "model.py").write_text(SHAPES_MODEL)
    widths = (2, 2, 3, 2)
    # Triton's testing hook: no batch until all four are queued, so they could all share one.
    with serve(tmp_path, env={"TRITONSERVER_DELAY_SCHEDULER": str(len(widths))}) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        results: list = []
        done = threading.Semaphore(0)

        def callback(result, error):
            results.append((result, error))
            done.release()

        for width in widths:
            inp = grpcclient.InferInput("INPUT0", [1, width], "FP32")
            inp.set_data_from_numpy(np.full((1, width), width, np.float32))
            client.async_infer("shapes", [inp], callback)
        for _ in widths:
            assert done.acquire(timeout=30)
        assert [e for _, e in results] == [None] * len(widths)
        assert sorted(r.as_numpy("OUTPUT0").shape[1] for r, _ in results) == sorted(widths)
        stats = client.get_inference_statistics("shapes", as_json=True)["model_stats"][0]
        assert int(stats["inference_count"]) == len(widths)
        # the width-3 request never shares an execute with a width-2 one
        assert int(stats["execution_count"]) >= 2
        rows = sorted(int(b["batch_size"]) for b in stats["batch_stats"])
        assert 1 in rows


# --- a python model's error names its frames, as Triton's stub words it (pybind11) ----------------
INIT_FAILS = """
class TritonPythonModel:
    def initialize(self, args):
        self.check(args)

    def check(self, args):
        raise RuntimeError("bad init")

    def execute(self, requests):
        return None
"""


def test_initialize_error_lists_the_models_frames(tmp_path):
    write_identity(tmp_path, "good")
    model_py = write_identity(tmp_path, "initfail", model=INIT_FAILS.lstrip("\n")) / "1" / "model.py"
    with serve(tmp_path) as server:
        client = httpclient.InferenceServerClient(server.url)
        rows = {r["name"]: r for r in client.get_model_repository_index()}
        assert rows["initfail"]["reason"] == (
            "Internal: RuntimeError: bad init\n\nAt:\n"
            f"  {model_py}(6): check\n"
            f"  {model_py}(3): initialize\n")
