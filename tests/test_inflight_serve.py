"""The "inflight" backend behind a real `modelhost serve`, with the real clients.

A repository of its own holds a model written by scripts/make_llm.py (small, float64 so that the
server's batches cannot change a greedy choice by rounding); the expected tokens come from the
same decoder run here, one request at a time, through the batch manager.
"""

from __future__ import annotations

import http.client
import json
import random
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from host.inflight import DecoderConfig, GenerationRequest, KVCacheConfig, SchedulerConfig, TinyDecoder
from host.inflight.queue import RequestQueue
from host.testing import ServerProcess, serve, wait_until

REPO_ROOT = Path(__file__).resolve().parent.parent
MODEL = "llm"
DECODER = dict(vocab_size=300, d_model=64, heads=4, layers=2, d_ff=128, max_seq_len=1024, seed=7,
               dtype="float64")
FINAL = "triton_final_response"

pytestmark = pytest.mark.modelhost_only


def make_model(repo: Path, name: str = MODEL, **extra: str) -> None:
    args = [sys.executable, str(REPO_ROOT / "scripts" / "make_llm.py"), str(repo / name)]
    for key, value in {**DECODER, **extra}.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    subprocess.run(args, check=True, capture_output=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("llm_repo")
    make_model(repo, kv_tokens="2048", max_batch_size="4")
    with serve(repo) as process:
        yield process


@pytest.fixture(scope="module")
def decoder() -> TinyDecoder:
    return TinyDecoder(DecoderConfig(**DECODER))


def expected(decoder: TinyDecoder, prompts: list[list[int]], lengths: list[int]) -> list[list[int]]:
    q = RequestQueue(keep_stats=False)
    manager = q.start(decoder, scheduler_config=SchedulerConfig(max_batch_size=1),
                      kv_cache_config=KVCacheConfig(max_tokens=2048))
    q.submit(*[GenerationRequest(i, p, n, exclude_input_in_output=True)
               for i, (p, n) in enumerate(zip(prompts, lengths))])
    results = q.wait_all(120)
    manager.shutdown()
    return [r.tokens for r in sorted(results, key=lambda r: r.request_id)]


def workload(count: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(DECODER["vocab_size"]) for _ in range(rng.randint(2, 30))]
               for _ in range(count)]
    return prompts, [rng.randint(1, 25) for _ in range(count)]


def grpc_inputs(prompt: list[int], length: int, streaming: bool = True, **extra: Any) -> list:
    def tensor(name: str, values: list, datatype: str) -> grpcclient.InferInput:
        dtype = {"INT32": np.int32, "BOOL": np.bool_, "FP32": np.float32}[datatype]
        array = np.asarray([values], dtype=dtype)
        t = grpcclient.InferInput(name, list(array.shape), datatype)
        t.set_data_from_numpy(array)
        return t

    inputs = [tensor("input_ids", prompt, "INT32"), tensor("request_output_len", [length], "INT32"),
              tensor("streaming", [streaming], "BOOL")]
    for name, (values, datatype) in extra.items():
        inputs.append(tensor(name, values, datatype))
    return inputs


class Collector:
    def __init__(self) -> None:
        self.items: list[tuple[Any, Any]] = []
        self.cond = threading.Condition()

    def __call__(self, result: Any, error: Any) -> None:
        with self.cond:
            self.items.append((result, error))
            self.cond.notify_all()

    def wait_for(self, count: int, timeout: float = 60) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.items) >= count, timeout), self.items


def metrics(server: ServerProcess) -> str:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        return response.read().decode()


def gauge(text: str, family: str, label: str) -> float:
    for line in text.splitlines():
        if line.startswith(family + "{") and f'"{label}"' in line and f'model="{MODEL}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{family} {label} not in metrics")


def test_grpc_stream_many_requests_at_once(server, decoder):
    prompts, lengths = workload(10)
    want = expected(decoder, prompts, lengths)
    got = Collector()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=got)
    try:
        for i, (p, n) in enumerate(zip(prompts, lengths)):
            client.async_stream_infer(MODEL, grpc_inputs(p, n), request_id=str(i))
        got.wait_for(sum(lengths))
    finally:
        client.stop_stream()
        client.close()
    assert all(e is None for _, e in got.items), got.items
    by_id: dict[str, list[Any]] = {}
    for result, _ in got.items:
        by_id.setdefault(result.get_response().id, []).append(result)
    for i, tokens in enumerate(want):
        responses = by_id[str(i)]
        # one response per token; the last one carries the final flag
        assert [r.as_numpy("output_ids").reshape(-1).tolist() for r in responses] == [[t] for t in tokens]
        flags = [r.get_response().parameters[FINAL].bool_param for r in responses]
        assert flags == [False] * (len(tokens) - 1) + [True]
    # they ran side by side: some request's first token came before another one's last
    order = [r.get_response().id for r, _ in got.items]
    first = {i: order.index(i) for i in by_id}
    last = {i: len(order) - 1 - order[::-1].index(i) for i in by_id}
    assert any(first[a] < last[b] and first[b] < last[a] for a in by_id for b in by_id if a != b)
    assert gauge(metrics(server), "nv_trt_llm_request_metrics", "max") == 4


def test_grpc_non_streaming_returns_everything_once(server, decoder):
    prompts, lengths = workload(3, seed=1)
    want = expected(decoder, prompts, lengths)
    got = Collector()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=got)
    try:
        for i, (p, n) in enumerate(zip(prompts, lengths)):
            client.async_stream_infer(MODEL, grpc_inputs(
                p, n, streaming=False, return_log_probs=([True], "BOOL")), request_id=str(i))
        got.wait_for(3)
    finally:
        client.stop_stream()
        client.close()
    results = {r.get_response().id: r for r, e in got.items if e is None}
    assert len(results) == 3
    for i, tokens in enumerate(want):
        r = results[str(i)]
        assert r.as_numpy("output_ids").reshape(-1).tolist() == tokens
        assert r.as_numpy("sequence_length").reshape(-1).tolist() == [len(tokens)]
        log_probs = r.as_numpy("output_log_probs").reshape(-1)
        assert log_probs.shape == (len(tokens),) and (log_probs <= 0).all()
        assert r.as_numpy("cum_log_probs").reshape(-1)[0] == pytest.approx(log_probs.sum(), rel=1e-4)


def test_grpc_cancel_stops_the_request_and_frees_its_blocks(server):
    got = Collector()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=got)
    try:
        client.async_stream_infer(MODEL, grpc_inputs([1, 2, 3], 1000), request_id="long")
        got.wait_for(3)
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()

    def settled() -> bool:
        text = metrics(server)
        return (gauge(text, "nv_trt_llm_request_metrics", "active") == 0
                and 'nv_inference_request_failure{model="llm",reason="CANCELED",version="1"} 1' in text)

    wait_until(settled, timeout=60)
    text = metrics(server)
    assert gauge(text, "nv_trt_llm_kv_cache_block_metrics", "used") == 0
    assert gauge(text, "nv_trt_llm_kv_cache_block_metrics", "max") == 2048 // 16


def _post(server: ServerProcess, path: str, doc: dict) -> tuple[int, list[dict]]:
    host, port = server.url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        connection.request("POST", path, body=json.dumps(doc), headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        body = response.read().decode()
    finally:
        connection.close()
    if path.endswith("generate_stream"):
        return response.status, [json.loads(line[5:]) for line in body.splitlines() if line.startswith("data:")]
    return response.status, [json.loads(body)]


def test_http_generate_stream(server, decoder):
    prompts, lengths = workload(4, seed=2)
    want = expected(decoder, prompts, lengths)
    results: dict[int, tuple[int, list[dict]]] = {}

    def send(i: int) -> None:
        results[i] = _post(server, f"/v2/models/{MODEL}/generate_stream",
                           {"input_ids": prompts[i], "request_output_len": lengths[i], "streaming": True})

    threads = [threading.Thread(target=send, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i, tokens in enumerate(want):
        status, events = results[i]
        assert status == 200
        assert [e["output_ids"] for e in events] == tokens  # one event (one token) per response


def _canceled(text: str) -> int:
    prefix = f'nv_inference_request_failure{{model="{MODEL}",reason="CANCELED",version="1"}} '
    return next(int(float(line[len(prefix):])) for line in text.splitlines() if line.startswith(prefix))


def test_http_client_gone_stops_the_request(server):
    before = _canceled(metrics(server))
    host, port = server.url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    connection.request("POST", f"/v2/models/{MODEL}/generate_stream",
                       body=json.dumps({"input_ids": [4, 5, 6], "request_output_len": 1000, "streaming": True}))
    response = connection.getresponse()
    assert response.status == 200
    events = 0
    while events < 3:
        events += response.readline().startswith(b"data:")
    connection.sock.shutdown(2)  # the client goes away mid-stream
    connection.close()

    def settled() -> bool:
        text = metrics(server)
        return _canceled(text) == before + 1 and gauge(text, "nv_trt_llm_request_metrics", "active") == 0

    wait_until(settled, timeout=60)
    assert gauge(metrics(server), "nv_trt_llm_kv_cache_block_metrics", "used") == 0


def test_http_generate_without_streaming(server, decoder):
    prompts, lengths = workload(1, seed=3)
    (tokens,) = expected(decoder, prompts, lengths)
    status, (doc,) = _post(server, f"/v2/models/{MODEL}/generate",
                           {"input_ids": prompts[0], "request_output_len": lengths[0]})
    assert status == 200, doc
    assert (doc["output_ids"] if isinstance(doc["output_ids"], list) else [doc["output_ids"]]) == tokens


def test_bad_requests_are_400_and_the_server_keeps_serving(server):
    status, (doc,) = _post(server, f"/v2/models/{MODEL}/generate",
                           {"input_ids": [1, 2], "request_output_len": 5000})
    assert status == 400 and "maximum sequence length" in doc["error"]
    status, (doc,) = _post(server, f"/v2/models/{MODEL}/generate",
                           {"input_ids": [100000], "request_output_len": 2})
    assert status == 400 and "out of the vocabulary" in doc["error"]
    status, (doc,) = _post(server, f"/v2/models/{MODEL}/generate", {"input_ids": [1, 2]})
    assert status == 400 and "request_output_len" in doc["error"]
    status, (doc,) = _post(server, f"/v2/models/{MODEL}/generate",
                           {"input_ids": [1, 2], "request_output_len": 2})
    assert status == 200


def test_example_repository_model_serves(tmp_path):
    """model_repository/tiny_llm, the example the README points at."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "tiny_llm").symlink_to(REPO_ROOT / "model_repository" / "tiny_llm")
    with serve(repo) as process:
        status, events = _post(process, "/v2/models/tiny_llm/generate_stream",
                               {"input_ids": [1, 2, 3], "request_output_len": 4, "streaming": True})
    assert status == 200 and len(events) == 4


def test_without_torch_only_that_model_fails(tmp_path):
    """No PyTorch: the generation model is UNAVAILABLE with a message saying what to install,
    the other models serve."""
    blocker = tmp_path / "blocker"
    (blocker / "torch").mkdir(parents=True)
    (blocker / "torch" / "__init__.py").write_text("raise ImportError(\"No module named 'torch'\")\n")
    repo = tmp_path / "repo"
    repo.mkdir()
    make_model(repo)
    (repo / "simple").symlink_to(REPO_ROOT / "model_repository" / "simple")
    # An installation without torch has no PyTorch backend plugin either (it requires torch, and
    # imports it when it registers): block it here, where it is installed.
    with serve(repo, "--block-plugin", "pytorch", env={"PYTHONPATH": str(blocker)}) as process:
        host, port = process.url.rsplit(":", 1)
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        connection.request("POST", "/v2/repository/index", body="{}")
        index = {e["name"]: e for e in json.loads(connection.getresponse().read())}
        connection.close()
    assert index["simple"]["state"] == "READY"
    assert index[MODEL]["state"] == "UNAVAILABLE"
    assert "pip install torch" in index[MODEL]["reason"]
