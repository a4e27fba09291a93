"""Statistics (host.stats) with Triton's definitions, through a real Host and a test backend plugin.

The backend is a plugin object registered through the plugin manager. Per model (config
parameters) it sleeps `sleep_ms` in execute, waits for the gate named `gate`, or raises
(`mode: raise`); per request, a negative first input value gets an error response. Decoupled models
answer IN[0] times from a thread after execute returned, then send the final flag.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from host.backend import Backend, Instance, Model
from host.core import Host
from host.errors import CancelledError, HostError, InternalError, InvalidArgumentError
from host.inference import InferenceRequest, InferenceResponse, Tensor
from host.options import ServerOptions
from host.plugins import get_plugin_manager, hookimpl
from host.stats import FAILURE_REASONS, ModelStats, failure_reason
from host.testing import wait_until

GATES: dict[str, threading.Event] = {}
ENTERED: dict[str, threading.Event] = {}


class StatsInstance(Instance):
    def __init__(self, spec) -> None:
        self.spec = spec  # the model's spec: its parameters and transaction policy

    def execute(self, requests):
        p = self.spec.parameter
        if p("gate"):
            ENTERED[p("gate")].set()
            assert GATES[p("gate")].wait(timeout=20)
        time.sleep(int(p("sleep_ms", "0")) / 1000)
        if p("mode") == "raise":
            raise RuntimeError("execute failed on purpose")
        if self.spec.decoupled:
            threading.Thread(target=self._stream, args=(list(requests),)).start()
            return None
        return [self._answer(r) for r in requests]

    @staticmethod
    def _answer(request: InferenceRequest) -> InferenceResponse:
        x = request.inputs["IN"].data
        if x.reshape(-1)[0] < 0:
            return InferenceResponse(error=InvalidArgumentError("negative input"))
        return InferenceResponse(outputs=[Tensor("OUT", "INT32", list(x.shape), x + 1)])

    @staticmethod
    def _stream(requests) -> None:
        for r in requests:
            n = int(r.inputs["IN"].data.reshape(-1)[0])
            if n < 0:
                r.respond(InferenceResponse(error=InternalError("negative count")), True)
                continue
            for i in range(n):
                r.respond(InferenceResponse(outputs=[
                    Tensor("OUT", "INT32", [1], np.array([i], dtype=np.int32))]), False)
            r.respond(None, True)


class StatsModel(Model):
    def create_instance(self, spec) -> Instance:
        return StatsInstance(self.spec)


class StatsBackend(Backend):
    def create_model(self, spec) -> Model:
        return StatsModel(spec)


class StatsPlugin:
    __name__ = "statsbe"

    @hookimpl
    def modelhost_register_backends(self, registry) -> None:
        registry.add_backend("statsbe", StatsBackend)


CONFIG = """
name: "{name}"
backend: "statsbe"
max_batch_size: {mbs}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{extra}
"""


def write_model(repo: Path, name: str, mbs: int = 0, versions=(1,), extra: str = "", **params: str) -> None:
    path = repo / name
    for v in versions:
        (path / str(v)).mkdir(parents=True, exist_ok=True)
    for k, v in params.items():
        extra += f'\nparameters {{ key: "{k}" value {{ string_value: "{v}" }} }}'
    (path / "config.pbtxt").write_text(CONFIG.format(name=name, mbs=mbs, extra=extra))


def make_host(repo: Path) -> Host:
    host = Host(ServerOptions(model_repositories=[repo]),
                plugins=get_plugin_manager(blocked=["python"], extra=[StatsPlugin()]))
    assert host.start() == {}
    return host


def request(model: str, values, version: int = -1) -> InferenceRequest:
    x = np.asarray(values, dtype=np.int32)
    return InferenceRequest(model_name=model, model_version=version,
                            inputs={"IN": Tensor("IN", "INT32", list(x.shape), x)})


def stats_of(host: Host, model: str) -> dict:
    (stats,) = host.statistics(model)["model_stats"]
    return stats


@pytest.fixture
def gate():
    name = f"gate{len(GATES)}"
    GATES[name], ENTERED[name] = threading.Event(), threading.Event()
    yield name
    GATES[name].set()


# --- successful requests -------------------------------------------------------------------------

def test_success_queue_compute_and_counts_per_request(tmp_path):
    write_model(tmp_path, "plain", sleep_ms="20")
    host = make_host(tmp_path)
    before_ms = int(time.time() * 1000)
    for _ in range(3):
        host.infer(request("plain", [1, 2, 3, 4, 5]))  # no batching: 1 inference each, whatever the shape
    after_ms = int(time.time() * 1000)
    s = stats_of(host, "plain")
    inf = s["inference_stats"]
    assert (s["name"], s["version"]) == ("plain", "1")
    assert s["inference_count"] == 3 and s["execution_count"] == 3
    assert before_ms <= s["last_inference"] <= after_ms
    for key in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert inf[key]["count"] == 3, key
    for key in ("fail", "cache_hit", "cache_miss"):
        assert inf[key] == {"count": 0, "ns": 0}, key
    assert inf["compute_infer"]["ns"] >= 3 * 20_000_000  # the execute call, sleep included
    assert inf["compute_input"]["ns"] > 0 and inf["compute_output"]["ns"] > 0
    # success is end to end: at least its queue, input and execute time
    assert inf["success"]["ns"] >= (inf["queue"]["ns"] + inf["compute_input"]["ns"]
                                    + inf["compute_infer"]["ns"])
    (batch,) = s["batch_stats"]
    assert batch["batch_size"] == 1
    for part in ("compute_input", "compute_infer", "compute_output"):
        assert batch[part] == inf[part]  # one request per execute: the same numbers
    assert s["response_stats"] == {} and s["memory_usage"] == []
    host.stop()


def test_batched_requests_count_rows(tmp_path):
    write_model(tmp_path, "batched", mbs=8)
    host = make_host(tmp_path)
    host.infer(request("batched", [[1, 2]] * 3))
    host.infer(request("batched", [[1, 2]] * 5))
    host.infer(request("batched", [[7, 7]] * 3))
    s = stats_of(host, "batched")
    assert s["inference_count"] == 11 and s["execution_count"] == 3
    assert s["inference_stats"]["success"]["count"] == 3
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in s["batch_stats"]] == [(3, 2), (5, 1)]
    host.stop()


def test_queue_time_is_the_wait_for_an_instance(tmp_path, gate):
    write_model(tmp_path, "gated", gate=gate)
    host = make_host(tmp_path)
    first = threading.Thread(target=host.infer, args=(request("gated", [1]),))
    first.start()
    assert ENTERED[gate].wait(10)  # the only instance is busy with the first request
    second = threading.Thread(target=host.infer, args=(request("gated", [2]),))
    second.start()
    mv = host.manager.get("gated")
    deadline = time.monotonic() + 10
    while mv.inflight < 2 and time.monotonic() < deadline:  # the second request is queued
        time.sleep(0.01)
    time.sleep(0.2)
    GATES[gate].set()
    first.join(10)
    second.join(10)
    inf = stats_of(host, "gated")["inference_stats"]
    assert inf["queue"]["count"] == 2 and inf["success"]["count"] == 2
    assert inf["queue"]["ns"] >= 150_000_000  # the second one waited for the first's execute
    assert inf["compute_infer"]["ns"] >= 150_000_000  # the first execute waited at the gate
    assert inf["success"]["ns"] >= inf["queue"]["ns"] + inf["compute_infer"]["ns"]
    host.stop()


def test_dynamic_batch_stats(tmp_path):
    write_model(tmp_path, "dyn", mbs=8, extra="dynamic_batching { preferred_batch_size: [ 4 ] "
                                              "max_queue_delay_microseconds: 5000000 }")
    host = make_host(tmp_path)
    threads = [threading.Thread(target=host.infer, args=(request("dyn", [[i, i]]),)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    # Counted before the responses went out: visible as soon as the clients have their answers.
    s = stats_of(host, "dyn")
    assert s["execution_count"] == 1 and s["inference_count"] == 4
    (batch,) = s["batch_stats"]
    assert batch["batch_size"] == 4 and batch["compute_infer"]["count"] == 1
    inf = s["inference_stats"]
    assert inf["success"]["count"] == inf["queue"]["count"] == 4
    assert inf["queue"]["ns"] > 0
    # Every request of the batch carries the batch's compute durations (as Triton's backends report).
    for part in ("compute_input", "compute_infer"):
        assert inf[part] == {"count": 4, "ns": 4 * batch[part]["ns"]}
    wait_until(lambda: stats_of(host, "dyn")["batch_stats"][0]["compute_output"]["ns"] > 0, 5)
    s = stats_of(host, "dyn")
    assert s["inference_stats"]["compute_output"] == {
        "count": 4, "ns": 4 * s["batch_stats"][0]["compute_output"]["ns"]}
    host.stop()


def test_decoupled_request_is_one_success(tmp_path):
    write_model(tmp_path, "dec", extra="model_transaction_policy { decoupled: true }")
    host = make_host(tmp_path)
    responses = list(host.infer_stream(request("dec", [3])))
    assert len(responses) == 3
    with pytest.raises(HostError, match="negative count"):
        for r in host.infer_stream(request("dec", [-1])):
            if r.error is not None:
                raise r.error
    # A decoupled model's responses may overtake the end of its execute: wait for both.
    wait_until(lambda: (stats_of(host, "dec")["inference_stats"]["fail"]["count"] == 1
                        and stats_of(host, "dec")["execution_count"] == 2), 5)
    s = stats_of(host, "dec")
    inf = s["inference_stats"]
    assert inf["success"]["count"] == 1 and s["inference_count"] == 1
    assert s["execution_count"] == 2 and inf["compute_infer"]["count"] == 2
    assert host.manager.get("dec").stats.failure_counts()["BACKEND"] == 1
    host.stop()


# --- failures --------------------------------------------------------------------------------------

def test_error_response_is_a_backend_failure(tmp_path):
    write_model(tmp_path, "plain", mbs=4)
    host = make_host(tmp_path)
    host.infer(request("plain", [[1, 2]]))
    with pytest.raises(InvalidArgumentError, match="negative input"):
        host.infer(request("plain", [[-1, 2], [3, 4]]))
    s = stats_of(host, "plain")
    inf = s["inference_stats"]
    assert inf["success"]["count"] == 1 and inf["queue"]["count"] == 1  # queue: successes only
    assert inf["fail"]["count"] == 1 and inf["fail"]["ns"] > 0
    assert s["inference_count"] == 1  # the failed request's rows are not inferences
    assert s["execution_count"] == 2  # but its execute happened
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in s["batch_stats"]] == [(1, 1), (2, 1)]
    assert host.manager.get("plain").stats.failure_counts() == {
        "REJECTED": 0, "CANCELED": 0, "BACKEND": 1, "OTHER": 0}
    host.stop()


def test_raising_execute_is_a_backend_failure(tmp_path):
    write_model(tmp_path, "broken", mode="raise")
    host = make_host(tmp_path)
    for _ in range(2):
        with pytest.raises(InternalError, match="execute failed on purpose"):
            host.infer(request("broken", [1]))
    s = stats_of(host, "broken")
    assert s["inference_stats"]["fail"]["count"] == 2
    assert s["inference_stats"]["success"]["count"] == 0 and s["inference_count"] == 0
    assert s["execution_count"] == 2
    assert host.manager.get("broken").stats.failure_counts()["BACKEND"] == 2
    host.stop()


def test_request_cancelled_while_queued_is_a_canceled_failure(tmp_path, gate):
    write_model(tmp_path, "gated", gate=gate)
    host = make_host(tmp_path)
    first = threading.Thread(target=host.infer, args=(request("gated", [1]),))
    first.start()
    assert ENTERED[gate].wait(10)
    queued = request("gated", [2])
    got: list[InferenceResponse | None] = []
    waiting = threading.Thread(target=host.submit, args=(queued, lambda r, final: got.append(r)))
    waiting.start()
    wait_until(lambda: queued.enqueue_ns, 5)
    queued.cancel()
    GATES[gate].set()
    first.join(10)
    waiting.join(10)
    assert isinstance(got[-1].error, CancelledError)
    s = stats_of(host, "gated")
    assert s["inference_stats"]["success"]["count"] == 1 and s["inference_stats"]["fail"]["count"] == 1
    assert s["execution_count"] == 1  # the cancelled request never reached execute
    assert host.manager.get("gated").stats.failure_counts() == {
        "REJECTED": 0, "CANCELED": 1, "BACKEND": 0, "OTHER": 0}
    host.stop()


def test_request_refused_by_validation_is_not_counted(tmp_path):
    """As in Triton: a request the server refuses before scheduling it is in no statistic."""
    write_model(tmp_path, "plain")
    host = make_host(tmp_path)
    bad = InferenceRequest(model_name="plain", inputs={
        "IN": Tensor("IN", "FP32", [2], np.zeros(2, dtype=np.float32))})
    with pytest.raises(InvalidArgumentError):
        host.infer(bad)
    s = stats_of(host, "plain")
    assert all(v == {"count": 0, "ns": 0} for v in s["inference_stats"].values())
    assert s["inference_count"] == s["execution_count"] == s["last_inference"] == 0
    assert s["batch_stats"] == []
    host.stop()


# --- ModelStats itself -----------------------------------------------------------------------------

def test_failure_reasons():
    assert FAILURE_REASONS == ("REJECTED", "CANCELED", "BACKEND", "OTHER")
    assert failure_reason(CancelledError("x"), executed=False) == "CANCELED"
    assert failure_reason(CancelledError("x"), executed=True) == "CANCELED"
    assert failure_reason(InternalError("x"), executed=True) == "BACKEND"
    assert failure_reason(InternalError("x"), executed=False) == "OTHER"
    assert failure_reason(None, executed=False) == "OTHER"


def test_cache_counters_and_cache_hit_requests():
    stats = ModelStats("m", 3)
    stats.cache_hit(1_000)
    stats.cache_hit(2_000)
    stats.cache_miss(5_000)
    stats.request_done(True, 10_000, 300, rows=0)  # a hit: served without an execute
    d = stats.as_dict()
    inf = d["inference_stats"]
    assert inf["cache_hit"] == {"count": 2, "ns": 3_000}
    assert inf["cache_miss"] == {"count": 1, "ns": 5_000}
    assert inf["success"] == {"count": 1, "ns": 10_000} and inf["queue"] == {"count": 1, "ns": 300}
    assert d["inference_count"] == 0 and d["execution_count"] == 0 and d["version"] == "3"
    assert inf["compute_infer"]["count"] == 0


# --- the HTTP statistics endpoint says the same ----------------------------------------------------

def test_http_statistics_agree_with_host_statistics(tmp_path):
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    from host.http.app import create_app
    from host.http.server import serve

    write_model(tmp_path, "plain", mbs=4)
    write_model(tmp_path, "multi", versions=(1, 2), extra="version_policy { all { } }")
    host = make_host(tmp_path)
    server = serve(create_app(host), "127.0.0.1", 0)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}", network_timeout=30.0)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        for rows in (1, 3):
            x = np.full((rows, 2), rows, dtype=np.int32)
            tensor = httpclient.InferInput("IN", [rows, 2], "INT32")
            tensor.set_data_from_numpy(x)
            client.infer("plain", [tensor])
        bad = httpclient.InferInput("IN", [1, 2], "INT32")
        bad.set_data_from_numpy(np.full((1, 2), -1, dtype=np.int32))
        with pytest.raises(InferenceServerException, match="negative input"):
            client.infer("plain", [bad])
        for version in ("1", "1", "2"):
            tensor = httpclient.InferInput("IN", [2], "INT32")
            tensor.set_data_from_numpy(np.array([5, 6], dtype=np.int32))
            client.infer("multi", [tensor], model_version=version)

        def get(path: str) -> dict:
            with opener.open(f"http://127.0.0.1:{server.port}{path}", timeout=10) as response:
                return json.loads(response.read())

        assert client.get_inference_statistics() == host.statistics()
        assert get("/v2/models/stats") == host.statistics()
        assert client.get_inference_statistics("plain") == host.statistics("plain")
        multi = client.get_inference_statistics("multi")
        assert multi == host.statistics("multi")
        assert [(m["version"], m["inference_count"]) for m in multi["model_stats"]] == [("1", 2), ("2", 1)]
        assert get("/v2/models/multi/versions/2/stats") == host.statistics("multi", "2")
        (plain,) = host.statistics("plain")["model_stats"]
        assert plain["inference_count"] == 4 and plain["inference_stats"]["fail"]["count"] == 1
    finally:
        client.close()
        server.shutdown(5)
        host.stop()
