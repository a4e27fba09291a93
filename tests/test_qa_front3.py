"""Front-end behaviour that Triton's QA tests check (server repo qa/L0_data_compression,
qa/L0_client_timeout, qa/L0_socket, qa/L0_custom_model_config, qa/L0_cmdline_trace,
qa/L0_backend_config, qa/L0_simple_ensemble).

Each test reproduces, with a small model of its own, one thing a QA test found modelhost doing
differently from Triton 2.51 (checked side by side with tritonserver 2.51):
- L0_data_compression: an infer request whose Content-Encoding is gzip or deflate but whose body
  is empty is refused with Triton's "nothing to be decompressed" (400), and an empty
  Content-Encoding value on an infer request is UNSUPPORTED (501), as any unknown one.
- L0_client_timeout: Triton's testing hook TRITONSERVER_SERVER_DELAY_GRPC_RESPONSE_SEC holds the
  answer of every gRPC call but the infer ones for that many seconds, so that a client deadline
  passes ("Deadline Exceeded") while the server keeps serving.
- L0_socket: two services may share a port on different addresses; on the same address the
  server refuses to start with Triton's "The server cannot listen to ... at the same address and
  port" line; --allow-http=false opens no HTTP port (its port and address are then not checked);
  --reuse-http-port / --reuse-grpc-port let several servers listen on one port; the metrics
  address defaults to the HTTP address.
- L0_custom_model_config: an empty --model-config-name is refused with Triton's "Error: ..." text.
- L0_cmdline_trace: the deprecated --trace-* flags and --strict-model-config print Triton's
  warnings (once each, on stderr).
  A trace of an HTTP or gRPC infer request has the front end's activities (HTTP_RECV_START,
  HTTP_RECV_END, HTTP_SEND_START, HTTP_SEND_END; GRPC_WAITREAD_START, GRPC_WAITREAD_END,
  GRPC_SEND_START, GRPC_SEND_END), which the QA's trace_summary.py needs to count a trace.
- L0_simple_ensemble: a config.pbtxt that does not parse also writes the C++ protobuf library's
  unescaped stderr line (its QA greps `Expected integer, got: "invalid_value"`), once.
- L0_backend_config: --backend-config values are parsed as Triton parses them, with its texts
  ("--backend-config option format is ..."; an empty value is refused); each model load logs
  (verbose) whether default-max-batch-size keeps its default or is overwritten, a backend logs
  its "backend configuration:" JSON, a dynamic batcher its "Starting dynamic-batcher thread"
  line; the onnxruntime auto-complete takes default-max-batch-size (0: no batching).
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from host.testing import free_port, serve

pytestmark = pytest.mark.modelhost_only

NO_PROXY = {"http": "", "https": ""}
ROOT = Path(__file__).resolve().parent.parent

ADD_SUB = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy()
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]))
        return out
"""

CONFIG = """
name: "add_sub"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 4 ] } ]
dynamic_batching { }
"""

BODY = json.dumps({"inputs": [
    {"name": "INPUT0", "shape": [1, 4], "datatype": "INT32", "data": [1, 2, 3, 4]},
    {"name": "INPUT1", "shape": [1, 4], "datatype": "INT32", "data": [1, 1, 1, 1]}]}).encode()


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("front3")
    (root / "add_sub" / "1").mkdir(parents=True)
    (root / "add_sub" / "config.pbtxt").write_text(CONFIG)
    (root / "add_sub" / "1" / "model.py").write_text(ADD_SUB)
    return root


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("traces") / "trace.json"


@pytest.fixture(scope="module")
def server(repo: Path, traces: Path) -> Iterator:
    # every non-infer gRPC answer held 1 s (L0_client_timeout); L0_backend_config's flags;
    # every request traced, each trace written to its own file (L0_cmdline_trace)
    with serve(repo, "--log-verbose=1", "--backend-config=default-max-batch-size=6",
               "--backend-config=python,min-compute-capability=XX",
               "--trace-config", f"triton,file={traces}", "--trace-config", "level=TIMESTAMPS",
               "--trace-config", "rate=1", "--trace-config", "triton,log-frequency=1",
               env={"TRITONSERVER_SERVER_DELAY_GRPC_RESPONSE_SEC": "1"}) as s:
        yield s


def _infer(server, headers: dict[str, str], body: bytes) -> requests.Response:
    return requests.post(f"{server.http_url}/v2/models/add_sub/infer", data=body, headers=headers,
                         proxies=NO_PROXY, timeout=30)


# --- L0_data_compression --------------------------------------------------------------------

@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_empty_compressed_infer_body_is_nothing_to_decompress(server, encoding: str) -> None:
    r = _infer(server, {"Content-Encoding": encoding}, b"")
    assert (r.status_code, r.json()) == (400, {"error": "nothing to be decompressed"})
    # a compressed body still works
    r = _infer(server, {"Content-Encoding": "gzip", "Accept-Encoding": "gzip"}, gzip.compress(BODY))
    assert r.status_code == 200 and r.headers["Content-Encoding"] == "gzip"
    assert r.json()["outputs"][0]["data"] == [2, 3, 4, 5]


def test_empty_content_encoding_on_infer_is_unsupported(server) -> None:
    r = _infer(server, {"Content-Encoding": ""}, BODY)
    assert (r.status_code, r.json()) == (501, {"error": "Unsupported compression type"})
    assert r.headers["Accept-Encoding"] == "gzip, deflate"
    # Triton decompresses infer bodies only: elsewhere the header is not looked at
    r = requests.post(f"{server.http_url}/v2/repository/index", data=b"",
                      headers={"Content-Encoding": ""}, proxies=NO_PROXY, timeout=30)
    assert r.status_code == 200


# --- L0_client_timeout ----------------------------------------------------------------------

def test_grpc_response_delay_hook_makes_client_deadlines_pass(server) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException, match="Deadline Exceeded"):
        client.is_server_live(client_timeout=0.1)
    with pytest.raises(InferenceServerException, match="Deadline Exceeded"):
        client.get_model_metadata("add_sub", client_timeout=0.1)
    assert client.is_model_ready("add_sub", client_timeout=10)
    # infer answers are not held
    inputs = [grpcclient.InferInput(name, [1, 4], "INT32") for name in ("INPUT0", "INPUT1")]
    for item in inputs:
        item.set_data_from_numpy(np.ones((1, 4), np.int32))
    result = client.infer("add_sub", inputs, client_timeout=0.9)
    assert result.as_numpy("OUTPUT0").tolist() == [[2, 2, 2, 2]]
    assert "Delaying the write of the response by 1 seconds" in server.log_text()  # verbose
    client.close()


# --- L0_socket and the start-up flags ---------------------------------------------------------

def _command(repo: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "host", "serve", "--model-repository", str(repo), *args]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PYTHONSAFEPATH"] = "1"
    return env


def _refused(repo: Path, *args: str) -> str:
    done = subprocess.run(_command(repo, *args), capture_output=True, text=True, timeout=120,
                          env=_env())
    assert done.returncode != 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_same_address_and_port_refused_with_tritons_text(repo: Path) -> None:
    port, other = free_port(), free_port()
    out = _refused(repo, "--http-port", str(port), "--grpc-port", str(port),
                   "--metrics-port", str(other))
    assert ("The server cannot listen to HTTP requests and GRPC requests at the same address and "
            f"port 0.0.0.0:{port}") in out
    out = _refused(repo, "--http-address", "127.0.0.1", "--http-port", str(port),
                   "--grpc-port", str(other), "--metrics-port", str(port))
    # the metrics address is the HTTP one unless given
    assert ("The server cannot listen to HTTP requests and metrics requests at the same address "
            f"and port 127.0.0.1:{port}") in out


def test_empty_model_config_name_refused(repo: Path) -> None:
    assert "Error: empty argument for --model-config-name" in _refused(repo, "--model-config-name=")


class _Server:
    """A server started by hand (HTTP may be off, so readiness is asked over gRPC)."""

    def __init__(self, repo: Path, *args: str) -> None:
        self.log = open(repo.parent / f"front3-{time.monotonic_ns()}.log", "w+b")  # noqa: SIM115
        self.process = subprocess.Popen(_command(repo, *args), stdout=self.log,
                                        stderr=subprocess.STDOUT, env=_env(),
                                        start_new_session=True)

    def wait_grpc_ready(self, url: str, timeout: float = 90) -> None:
        client = grpcclient.InferenceServerClient(url)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                assert self.process.poll() is None, self.text()
                try:
                    if client.is_server_ready(client_timeout=2):
                        return
                except InferenceServerException:
                    pass
                time.sleep(0.2)
        finally:
            client.close()
        raise AssertionError(f"not ready\n{self.text()}")

    def text(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def _listening(address: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex((address, port)) == 0


def test_http_off_opens_no_port_and_ignores_its_port(repo: Path) -> None:
    grpc_port, metrics_port = free_port(), free_port()
    server = _Server(repo, "--allow-http=false", "--http-port", "-47", "--grpc-address", "127.0.0.1",
                     "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port))
    try:
        server.wait_grpc_ready(f"127.0.0.1:{grpc_port}")
        r = requests.get(f"http://127.0.0.1:{metrics_port}/metrics", proxies=NO_PROXY, timeout=10)
        assert r.status_code == 200
        assert "HTTP (KServe V2" not in server.text()  # no HTTP endpoint in the start-up table
    finally:
        server.stop()
    assert server.process.returncode == 0


def test_reuse_ports_and_same_port_on_other_addresses(repo: Path) -> None:
    """Two servers, each with HTTP on 127.0.0.1:P and gRPC on 127.0.0.2:P (one port, two
    addresses), sharing both with --reuse-http-port / --reuse-grpc-port."""
    port = free_port()
    servers = [_Server(repo, "--http-address", "127.0.0.1", "--http-port", str(port),
                       "--grpc-address", "127.0.0.2", "--grpc-port", str(port),
                       "--metrics-port", str(free_port()),
                       "--reuse-http-port=true", "--reuse-grpc-port=true") for _ in range(2)]
    try:
        for server in servers:
            server.wait_grpc_ready(f"127.0.0.2:{port}")
        for server in servers:
            assert server.process.poll() is None, server.text()
        r = requests.get(f"http://127.0.0.1:{port}/v2/health/ready", proxies=NO_PROXY, timeout=10)
        assert r.status_code == 200
        # without the flag, a third server is refused the port
        out = _refused(repo, "--http-address", "127.0.0.1", "--http-port", str(port),
                       "--grpc-port", str(free_port()), "--metrics-port", str(free_port()))
        assert f"failed to start HTTP service: Unavailable - Socket '127.0.0.1:{port}' already in use" in out
    finally:
        for server in servers:
            server.stop()


# --- L0_backend_config ------------------------------------------------------------------------

def test_backend_config_parse_errors_have_tritons_text(repo: Path) -> None:
    fmt = "--backend-config option format is '<backend name>,<setting>=<value>'. Got "
    assert fmt + "default-max-batch-size=\n" in _refused(repo, "--backend-config=default-max-batch-size=") + "\n"
    assert fmt + "default-max-batch-size\n" in _refused(repo, "--backend-config=default-max-batch-size") + "\n"
    assert ("No backend specified. --backend-config option format is <backend name>,<setting>="
            "<value> or <setting>=<value>. Got ,default-max-batch-size=3") in _refused(
                repo, "--backend-config=,default-max-batch-size=3")


def test_backend_config_log_lines(server) -> None:
    log = server.log_text()
    assert '"Found overwritten default setting: default-max-batch-size,6"' in log
    line = next(x for x in log.splitlines() if "backend configuration:" in x)
    payload = line.split('] "backend configuration:\\n', 1)[1].rstrip('"').replace('\\"', '"')
    cmdline = json.loads(payload)["cmdline"]
    assert cmdline["default-max-batch-size"] == "6" and cmdline["min-compute-capability"] == "XX"
    assert {"auto-complete-config", "backend-directory"} <= set(cmdline)
    assert "Starting dynamic-batcher thread for add_sub at nice 0..." in log


def test_onnxruntime_default_max_batch_size_setting() -> None:
    backend = pytest.importorskip("modelhost_onnxruntime.backend")
    from types import SimpleNamespace

    from host.proto import model_config_pb2 as mc

    args = [SimpleNamespace(name=n, shape=["batch", 16], type="tensor(float)") for n in ("X", "Y")]
    for setting, expected in (({}, 4), ({"default-max-batch-size": "5"}, 5),
                              ({"default-max-batch-size": "0"}, 0)):
        config = mc.ModelConfig(name="m")
        backend.auto_complete(config, args[:1], args[1:], backend._default_max_batch_size(setting))
        assert config.max_batch_size == expected
        assert config.HasField("dynamic_batching") == (expected > 0)
        assert list(config.input[0].dims) == ([16] if expected else [-1, 16])


# --- L0_cmdline_trace -------------------------------------------------------------------------

def test_deprecated_trace_flags_warn_with_tritons_text(tmp_path: Path) -> None:
    out = _refused(tmp_path / "missing", "--trace-file", str(tmp_path / "t.json"), "--trace-rate=100",
                   "--trace-level=TIMESTAMPS", "--trace-log-frequency=50", "--trace-count=100",
                   "--strict-model-config=false")
    for flag in ("file", "rate", "level", "log-frequency", "count"):
        assert out.count(f"Warning: '--trace-{flag}' has been deprecated and will be removed in "
                         "future releases. Please use '--trace-config ") == 1, flag
    assert out.count("Warning: '--strict-model-config' has been deprecated! Please use "
                     "'--disable-auto-complete-config' instead.") == 1


def test_traces_have_the_front_end_activities(server, traces: Path) -> None:
    from host.testing import wait_until

    inputs = [grpcclient.InferInput(name, [1, 4], "INT32") for name in ("INPUT0", "INPUT1")]
    for item in inputs:
        item.set_data_from_numpy(np.ones((1, 4), np.int32))
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.infer("add_sub", inputs, request_id="traced-grpc")
    client.close()
    r = requests.post(f"{server.http_url}/v2/models/add_sub/infer",
                      data=json.dumps({"id": "traced-http", **json.loads(BODY)}),
                      proxies=NO_PROXY, timeout=30)
    assert r.status_code == 200

    def found() -> dict[str, list[str]] | None:
        names: dict[str, list[str]] = {}
        for path in traces.parent.glob(f"{traces.name}.*"):
            try:
                entries = json.loads(path.read_text())
            except ValueError:  # being written
                return None
            head = next(e for e in entries if "model_name" in e)
            names[head.get("request_id", "")] = [
                s["name"] for e in entries for s in e.get("timestamps", [])]
        return names if {"traced-grpc", "traced-http"} <= set(names) else None

    names = wait_until(found)
    core = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
            "COMPUTE_OUTPUT_START", "COMPUTE_END", "INFER_RESPONSE_COMPLETE", "REQUEST_END"]
    assert names["traced-http"] == ["HTTP_RECV_START", "HTTP_RECV_END", *core,
                                    "HTTP_SEND_START", "HTTP_SEND_END"]
    assert names["traced-grpc"] == ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", *core,
                                    "GRPC_SEND_START", "GRPC_SEND_END"]


# --- L0_simple_ensemble (its invalid max_inflight_requests checks) ------------------------------

def test_config_parse_error_writes_protobufs_unescaped_line(tmp_path: Path) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.py").write_text(ADD_SUB)
    (tmp_path / "m" / "config.pbtxt").write_text(
        CONFIG.replace('"add_sub"', '"m"').replace("max_batch_size: 8",
                                                    'max_batch_size: "invalid_value"'))
    out = _refused(tmp_path, "--exit-on-error=true", "--http-port", str(free_port()),
                   "--grpc-port", str(free_port()), "--metrics-port", str(free_port()))
    line = ("[libprotobuf ERROR google/protobuf/text_format.cc:337] Error parsing text-format "
            'inference.ModelConfig: 4:17: Expected integer, got: "invalid_value"')
    assert out.count(line) == 1, out
