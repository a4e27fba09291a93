"""Triton's trace extension against a real `modelhost serve`, with the real tritonclient.

- the settings API (HTTP and gRPC): answers, per-model settings and clearing them, Triton's errors;
- sampling by rate and count, written to files in Triton's JSON trace format, with the
  timestamps of each request in order and inside the client's own clock readings;
- OpenTelemetry: the server exports to an OTLP/HTTP endpoint this test runs on loopback, which
  decodes the ExportTraceServiceRequest protobuf it receives; spans, parents, events, attributes.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from host.testing import ServerProcess, free_port, serve, wait_until

pytestmark = pytest.mark.modelhost_only

MODELS = Path(__file__).resolve().parent / "obs_models"
ORDER = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
         "COMPUTE_OUTPUT_START", "COMPUTE_END", "INFER_RESPONSE_COMPLETE", "REQUEST_END"]
# ... with the HTTP front end's activities around them, as Triton's (qa/L0_cmdline_trace's
# trace_summary.py keeps only traces that have them)
HTTP_ORDER = ["HTTP_RECV_START", "HTTP_RECV_END", *ORDER, "HTTP_SEND_START", "HTTP_SEND_END"]


def _inputs(module=httpclient) -> list:
    tensor = module.InferInput("IN", [3], "FP32")
    tensor.set_data_from_numpy(np.arange(3, dtype=np.float32))
    return [tensor]


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    """Triton mode, every request traced (rate 1) until 3 were (count 3), to <tmp>/trace.json."""
    trace_file = tmp_path_factory.mktemp("trace") / "trace.json"
    with serve(MODELS, "--model-control-mode", "explicit", "--load-model", "echo",
               "--load-model", "echo_cached", "--trace-config", f"triton,file={trace_file}",
               "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1",
               "--trace-config", "count=3") as server:
        yield server, trace_file


def _read(path: Path) -> list[dict]:
    return json.loads(path.read_text())


def _traces(entries: list[dict]) -> dict[int, dict]:
    """Triton's flat list -> {id: {"head": {...}, "stamps": [(name, ns)], "tensors": [...]}}."""
    out: dict[int, dict] = {}
    for e in entries:
        t = out.setdefault(e["id"], {"head": {}, "stamps": [], "tensors": []})
        if "timestamps" in e:
            t["stamps"] += [(s["name"], s["ns"]) for s in e["timestamps"]]
        elif "activity" in e:
            t["tensors"].append(e)
        else:
            t["head"] = e
    return out


def test_rate_and_count_write_an_indexed_trace_file(traced):
    server, trace_file = traced
    client = httpclient.InferenceServerClient(server.url)
    assert client.get_trace_settings() == {
        "trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "3", "log_frequency": "0",
        "trace_file": str(trace_file), "trace_mode": "triton"}
    before = time.monotonic_ns()  # the server's trace clock is the same monotonic clock
    for i in range(4):
        client.infer("echo", _inputs(), request_id=f"r{i}")
    after = time.monotonic_ns()
    # count 3 reached with every request sampled: Triton writes them to <file>.0 at once
    assert client.get_trace_settings()["trace_count"] == "0"
    index0 = Path(f"{trace_file}.0")
    traces = _traces(_read(wait_until(lambda: index0.exists() and index0)))
    assert [t["head"] for t in traces.values()] == [
        {"id": i, "model_name": "echo", "model_version": 1, "request_id": f"r{n}"}
        for n, i in enumerate(sorted(traces))]
    for t in traces.values():
        names = [n for n, _ in t["stamps"]]
        assert names == HTTP_ORDER
        times = [ns for _, ns in t["stamps"]]
        assert times == sorted(times) and before <= times[0] and times[-1] <= after


def test_per_model_setting_rate_and_clearing(traced):
    server, trace_file = traced
    client = httpclient.InferenceServerClient(server.url)
    grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
    client.update_trace_settings(settings={"trace_count": "-1"})  # the global count: no limit
    # A model setting: what it sets is its own, the rest follows the global setting.
    answer = client.update_trace_settings(model_name="echo_cached", settings={
        "trace_rate": "2", "trace_count": "2", "log_frequency": "1"})
    assert answer == {"trace_level": ["TIMESTAMPS"], "trace_rate": "2", "trace_count": "2",
                      "log_frequency": "1", "trace_file": str(trace_file), "trace_mode": "triton"}
    assert grpc_client.get_trace_settings(model_name="echo_cached", as_json=True)["settings"][
        "trace_rate"] == {"value": ["2"]}
    assert client.get_trace_settings(model_name="echo")["trace_rate"] == "1"  # the global one
    # rate 2: the 2nd and 4th requests; log_frequency 1: each written to the next indexed file
    # (echo_cached's cache is off here: no --cache-config, so every request executes)
    for i in range(5):
        client.infer("echo_cached", _inputs(), request_id=f"c{i}")
    files = [Path(f"{trace_file}.{n}") for n in (1, 2)]
    wait_until(lambda: all(f.exists() for f in files))
    heads = [next(iter(_traces(_read(f)).values()))["head"] for f in files]
    assert [h["request_id"] for h in heads] == ["c1", "c3"]
    assert client.get_trace_settings(model_name="echo_cached")["trace_count"] == "0"
    assert not Path(f"{trace_file}.3").exists()
    # Clearing (no value over gRPC): the global value again.
    cleared = grpc_client.update_trace_settings(
        model_name="echo_cached", settings={"trace_count": None}, as_json=True)["settings"]
    assert cleared["trace_count"] == {"value": ["-1"]} and cleared["trace_rate"] == {"value": ["2"]}
    # The global setting moves the fields a model setting does not set itself.
    client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS", "TENSORS"]})
    model = client.get_trace_settings(model_name="echo_cached")
    assert model["trace_level"] == ["TIMESTAMPS", "TENSORS"] and model["trace_rate"] == "2"
    # Clearing with null over HTTP: nothing of its own left, the model follows the global setting.
    assert client.update_trace_settings(model_name="echo_cached", settings={
        "trace_rate": None, "log_frequency": None}) == client.get_trace_settings()
    client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})


def test_tensor_level_records_inputs_and_outputs(traced, tmp_path):
    server, trace_file = traced
    client = httpclient.InferenceServerClient(server.url)
    client.update_trace_settings(model_name="echo", settings={
        "trace_level": ["TIMESTAMPS", "TENSORS"], "trace_count": "1", "log_frequency": "1"})
    before = set(trace_file.parent.iterdir())
    client.infer("echo", _inputs(), request_id="tensors")
    new = wait_until(lambda: set(trace_file.parent.iterdir()) - before)
    (trace,) = _traces(_read(new.pop())).values()
    assert [n for n, _ in trace["stamps"]] == HTTP_ORDER
    by_activity = {(t["activity"], t["tensor"]["name"]): t["tensor"] for t in trace["tensors"]}
    assert by_activity[("TENSOR_QUEUE_INPUT", "IN")] == {
        "name": "IN", "data": "0,1,2", "shape": "3", "dtype": "FP32"}
    assert by_activity[("TENSOR_BACKEND_OUTPUT", "OUT")]["data"] == "0,1,2"
    client.update_trace_settings(model_name="echo", settings={
        "trace_level": None, "trace_count": None, "log_frequency": None})
    assert client.get_trace_settings(model_name="echo") == client.get_trace_settings()


@pytest.mark.parametrize("settings, status, message", [
    ({"trace_file": "elsewhere.json"}, 501,
     "trace file location can not be updated through network protocol"),
    ({"trace_level": ["OFF", "TIMESTAMPS"]}, 400, "Expect only one trace level 'OFF' is specified"),
    ({"trace_rate": "abc"}, 400, "Unable to parse 'trace_rate', got: abc"),
    ({"trace_count": "-2"}, 400, "Unable to parse 'trace_count'. Expecting value >= -1, got:-2"),
    ({"trace_rate": 5}, 400, "attempt to access JSON non-string as string"),
    ({"trace_level": "TIMESTAMPS"}, 400, "attempt to access JSON non-array as array"),
    ({"trace_rate": "0"}, 400, "Attempting to set invalid trace setting :sample rate must be non-zero"),
    ({"trace_rate": "99999999999"}, 400,
     "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], got: 99999999999"),
])
def test_settings_errors_are_tritons(traced, settings, status, message):
    server, _ = traced
    client = httpclient.InferenceServerClient(server.url)
    before = client.get_trace_settings()
    with pytest.raises(InferenceServerException) as info:
        client.update_trace_settings(settings=settings)
    assert info.value.status() == str(status) and info.value.message() == message
    assert client.get_trace_settings() == before


def test_grpc_errors_and_unknown_model(traced):
    server, _ = traced
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as info:
        client.update_trace_settings(settings={"trace_rate": ["1", "2"]})
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert info.value.message() == "expect only 1 value for 'trace_rate'"
    with pytest.raises(InferenceServerException) as info:
        client.update_trace_settings(settings={"trace_file": "x"})
    assert info.value.status() == "StatusCode.UNIMPLEMENTED"
    with pytest.raises(InferenceServerException, match="Request for unknown model : nope"):
        client.get_trace_settings(model_name="nope")
    with pytest.raises(InferenceServerException, match="Request for unknown model : nope") as http:
        httpclient.InferenceServerClient(server.url).get_trace_settings(model_name="nope")
    assert http.value.status() == "400"


def test_trace_off_by_default_and_extensions_listed(tmp_path):
    with serve(MODELS, "--model-control-mode", "explicit", "--load-model", "echo") as server:
        client = httpclient.InferenceServerClient(server.url)
        assert {"trace", "logging", "classification", "sequence", "schedule_policy"} <= set(
            client.get_server_metadata()["extensions"])
        assert client.get_trace_settings() == {
            "trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1", "log_frequency": "0",
            "trace_file": "", "trace_mode": "triton"}
        # Turning tracing on needs a file in triton mode, as Triton says.
        with pytest.raises(InferenceServerException,
                           match="invalid trace setting :trace file name is not given"):
            client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
        meta = grpcclient.InferenceServerClient(server.grpc_url).get_server_metadata()
        assert {"trace", "logging"} <= set(meta.extensions)


def test_deprecated_flags_and_shutdown_write_the_main_file(tmp_path):
    """--trace-file/--trace-level/--trace-rate still work; with log frequency 0 the traces are
    written to the file itself, a JSON array closed when the server stops."""
    trace_file = tmp_path / "t.json"
    server = ServerProcess(MODELS, "--model-control-mode", "explicit", "--load-model", "echo",
                           "--trace-file", str(trace_file), "--trace-level", "TIMESTAMPS",
                           "--trace-rate", "1").start()
    try:
        client = httpclient.InferenceServerClient(server.url)
        assert client.get_trace_settings()["trace_file"] == str(trace_file)
        client.infer("echo", _inputs(), request_id="last")
    finally:
        assert server.stop() == 0
    traces = _traces(_read(trace_file))
    assert [t["head"]["request_id"] for t in traces.values()] == ["last"]
    assert [n for n, _ in next(iter(traces.values()))["stamps"]] == HTTP_ORDER


# --- OpenTelemetry ---------------------------------------------------------------------------

REMOTE_TRACE = "0af7651916cd43dd8448eb211c80319c"
REMOTE_SPAN, REMOTE_SPAN_GRPC = "b7ad6b7169203331", "00f067aa0ba902b7"


class _Collector(ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver: decodes every ExportTraceServiceRequest posted to it."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest, ExportTraceServiceResponse)

        self.requests: list = []
        self.paths: list[str] = []
        parse, answer = ExportTraceServiceRequest.FromString, ExportTraceServiceResponse()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                collector.paths.append(self.path)
                collector.requests.append(parse(body))
                data = answer.SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", free_port()), Handler)

    def spans(self) -> list[tuple]:
        """(resource attributes, scope name, span) of everything received."""
        out = []
        for request in self.requests:
            for rs in request.resource_spans:
                resource = {a.key: a.value.string_value for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    out += [(resource, ss.scope.name, span) for span in ss.spans]
        return out


@pytest.fixture
def collector() -> Iterator[_Collector]:
    server = _Collector()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_opentelemetry_spans_reach_an_otlp_endpoint(collector):
    url = f"127.0.0.1:{collector.server_address[1]}/v1/traces"  # no scheme, as Triton's users write
    with serve(MODELS, "--model-control-mode", "explicit", "--load-model", "echo",
               "--trace-config", "mode=opentelemetry", "--trace-config", f"opentelemetry,url={url}",
               "--trace-config", "opentelemetry,resource=service.name=modelhost-test",
               "--trace-config", "opentelemetry,bsp_schedule_delay=100",
               "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1") as server:
        settings = httpclient.InferenceServerClient(server.url).get_trace_settings()
        assert settings == {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "-1",
                            "trace_mode": "opentelemetry", "url": url,
                            "resource": "service.name=modelhost-test",
                            "bsp_schedule_delay": "100", "bsp_max_queue_size": "2048",
                            "bsp_max_export_batch_size": "512"}
        start = time.time_ns()
        httpclient.InferenceServerClient(server.url).infer("echo", _inputs(), request_id="otel-h")
        grpcclient.InferenceServerClient(server.grpc_url).infer(
            "echo", _inputs(grpcclient), request_id="otel-g")
        end = time.time_ns()
        wait_until(lambda: len(collector.spans()) >= 6, timeout=20,
                   message="the server exported no spans")
        # A propagated W3C context forces the trace even when sampling would skip the request.
        http = httpclient.InferenceServerClient(server.url)
        http.update_trace_settings(settings={"trace_rate": "1000"})
        http.infer("echo", _inputs(), request_id="otel-skipped")
        http.infer("echo", _inputs(), request_id="otel-ctx",
                   headers={"traceparent": f"00-{REMOTE_TRACE}-{REMOTE_SPAN}-01"})
        grpcclient.InferenceServerClient(server.grpc_url).infer(
            "echo", _inputs(grpcclient), request_id="otel-ctx-grpc",
            headers={"traceparent": f"00-{REMOTE_TRACE}-{REMOTE_SPAN_GRPC}-01"})
        wait_until(lambda: len(collector.spans()) >= 12, timeout=20)
    assert set(collector.paths) == {"/v1/traces"}
    spans = collector.spans()
    assert len(spans) == 12
    for parent in (REMOTE_SPAN, REMOTE_SPAN_GRPC):
        (remote,) = [s for _, _, s in spans if s.parent_span_id.hex() == parent]
        assert remote.name == "InferRequest" and remote.trace_id.hex() == REMOTE_TRACE
    remote_spans = [s for _, _, s in spans if s.trace_id.hex() == REMOTE_TRACE]
    assert sorted(s.name for s in remote_spans) == ["InferRequest", "InferRequest", "compute",
                                                    "compute", "echo", "echo"]
    spans = [x for x in spans if x[2].trace_id.hex() != REMOTE_TRACE]
    assert {r["service.name"] for r, _, _ in spans} == {"modelhost-test"}
    assert {scope for _, scope, _ in spans} == {"triton-server"}
    by_id = {s.span_id: s for _, _, s in spans}
    models = [s for s in by_id.values() if s.name == "echo"]
    assert len(models) == 2
    request_ids = set()
    for model in models:
        root = by_id[model.parent_span_id]
        (compute,) = [s for s in by_id.values() if s.parent_span_id == model.span_id]
        assert root.name == "InferRequest" and not root.parent_span_id
        assert compute.name == "compute"
        assert root.trace_id == model.trace_id == compute.trace_id
        attributes = {a.key: a.value for a in model.attributes}
        request_ids.add(attributes["triton.request_id"].string_value)
        assert attributes["triton.model_name"].string_value == "echo"
        assert attributes["triton.model_version"].int_value == 1
        assert attributes["triton.trace_id"].int_value > 0
        assert [e.name for e in model.events] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
        assert [e.name for e in compute.events] == ORDER[2:6]
        # the front end's activities are events of the root span, as in Triton
        protocol = "HTTP" if attributes["triton.request_id"].string_value == "otel-h" else "GRPC"
        recv = ["HTTP_RECV_START", "HTTP_RECV_END"] if protocol == "HTTP" else \
            ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END"]
        assert [e.name for e in root.events] == [
            *recv, "INFER_RESPONSE_COMPLETE", f"{protocol}_SEND_START", f"{protocol}_SEND_END"]
        times = [model.events[0].time_unix_nano, model.events[1].time_unix_nano,
                 *(e.time_unix_nano for e in compute.events), root.events[2].time_unix_nano,
                 model.events[2].time_unix_nano]
        # INFER_RESPONSE_COMPLETE and REQUEST_END are stamped once the response is handed to the
        # front end, which may already have delivered it: only the earlier ones precede `end`.
        assert times == sorted(times) and start <= times[0] and times[-3] <= end
        assert root.start_time_unix_nano <= model.start_time_unix_nano <= compute.start_time_unix_nano
        assert compute.end_time_unix_nano <= model.end_time_unix_nano <= root.end_time_unix_nano
    assert request_ids == {"otel-h", "otel-g"}


def test_trace_config_errors_stop_the_server_at_start():
    server = ServerProcess(MODELS, "--trace-config", "level=LOUD")
    with pytest.raises(Exception, match="invalid value for trace level option: loud"):
        server.start(timeout=30)
    server.stop()


def test_aio_clients(traced):
    """tritonclient's asyncio clients (HTTP and gRPC) read and change trace and log settings."""
    import asyncio

    import tritonclient.grpc.aio as grpcaio
    import tritonclient.http.aio as httpaio

    server, _ = traced

    async def run() -> None:
        http = httpaio.InferenceServerClient(server.url)
        grpc_client = grpcaio.InferenceServerClient(server.grpc_url)
        try:
            answer = await http.update_trace_settings(model_name="echo",
                                                      settings={"trace_rate": "7"})
            assert answer["trace_rate"] == "7"
            got = await grpc_client.get_trace_settings(model_name="echo", as_json=True)
            assert got["settings"]["trace_rate"] == {"value": ["7"]}
            cleared = await grpc_client.update_trace_settings(
                model_name="echo", settings={"trace_rate": None}, as_json=True)
            assert cleared["settings"]["trace_rate"] == (await grpc_client.get_trace_settings(
                as_json=True))["settings"]["trace_rate"]
            logs = await http.update_log_settings({"log_verbose_level": 2})
            assert logs["log_verbose_level"] == 2
            grpc_logs = await grpc_client.update_log_settings({"log_verbose_level": 0}, as_json=True)
            assert grpc_logs["settings"]["log_verbose_level"] == {"uint32_param": 0}
            assert (await http.get_log_settings())["log_verbose_level"] == 0
        finally:
            await http.close()
            await grpc_client.close()

    asyncio.run(run())
