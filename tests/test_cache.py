"""The response cache with the builtin `local` cache: a real `modelhost serve`, the real tritonclient.

Every assertion about whether a request was answered from the cache reads the model's statistics:
a hit moves `cache_hit` and leaves `execution_count` where it was; a miss runs the model.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from cache_models import write_repository
from host.testing import ServerProcess, ServerStartError, serve

pytestmark = pytest.mark.modelhost_only

ONE_KIB = np.arange(256, dtype=np.int32).reshape(1, 256)  # 1 KiB of INT32


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    return write_repository(tmp_path_factory.mktemp("cache_models"))


@pytest.fixture(scope="module")
def cached_server(repository: Path) -> Iterator[ServerProcess]:
    with serve(repository, "--cache-config", "local,size=1048576") as server:
        yield server


@pytest.fixture
def client(cached_server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(cached_server.url, network_timeout=30.0)
    yield c
    c.close()


def infer(client, model: str, data: np.ndarray, outputs: list[str] | None = None,
          datatype: str = "INT32"):
    inp = httpclient.InferInput("INPUT0", list(data.shape), datatype)
    inp.set_data_from_numpy(data, binary_data=True)
    wanted = [httpclient.InferRequestedOutput(n, binary_data=True) for n in outputs or []] or None
    return client.infer(model, [inp], outputs=wanted)


def stats(client, model: str) -> dict:
    s = client.get_inference_statistics(model)["model_stats"][0]
    return {"hit": s["inference_stats"]["cache_hit"]["count"],
            "miss": s["inference_stats"]["cache_miss"]["count"],
            "exec": s["execution_count"], "ok": s["inference_stats"]["success"]["count"],
            "fail": s["inference_stats"]["fail"]["count"], "rows": s["inference_count"],
            "hit_ns": s["inference_stats"]["cache_hit"]["ns"]}


def delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in before if k != "hit_ns"}


def test_repeated_request_hits_without_executing(client):
    data = ONE_KIB + 1000
    before = stats(client, "cached")
    first = infer(client, "cached", data)
    second = infer(client, "cached", data)
    np.testing.assert_array_equal(first.as_numpy("OUTPUT0"), data)
    np.testing.assert_array_equal(second.as_numpy("OUTPUT0"), data)
    np.testing.assert_array_equal(second.as_numpy("OUTPUT1"), data * 2)
    assert delta(before, stats(client, "cached")) == {
        "hit": 1, "miss": 1, "exec": 1, "ok": 2, "fail": 0, "rows": 1}


def test_hit_needs_every_output_asked_for(client):
    # The python backend, like Triton's, returns only the outputs asked for, so an entry holds
    # those; a request for an output the entry lacks is a miss whose response replaces it.
    data = ONE_KIB + 2000
    before = stats(client, "cached")
    infer(client, "cached", data, outputs=["OUTPUT0"])
    assert infer(client, "cached", data, outputs=["OUTPUT0"]).as_numpy("OUTPUT1") is None
    d = delta(before, stats(client, "cached"))
    assert (d["hit"], d["miss"]) == (1, 1)
    full = infer(client, "cached", data)  # no outputs named: every output, which the entry lacks
    np.testing.assert_array_equal(full.as_numpy("OUTPUT1"), data * 2)
    d = delta(before, stats(client, "cached"))
    assert (d["hit"], d["miss"], d["exec"]) == (1, 2, 2)
    only1 = infer(client, "cached", data, outputs=["OUTPUT1"])  # now served from the full entry
    assert only1.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(only1.as_numpy("OUTPUT1"), data * 2)
    d = delta(before, stats(client, "cached"))
    assert (d["hit"], d["miss"], d["exec"]) == (2, 2, 2)


def test_same_bytes_other_shape_is_a_miss(client):
    flat = np.arange(16, dtype=np.int32) + 3000
    before = stats(client, "cached")
    a = infer(client, "cached", flat.reshape(2, 8))
    b = infer(client, "cached", flat.reshape(4, 4))
    assert a.as_numpy("OUTPUT0").shape == (2, 8)
    assert b.as_numpy("OUTPUT0").shape == (4, 4)
    d = delta(before, stats(client, "cached"))
    assert (d["hit"], d["miss"], d["exec"]) == (0, 2, 2)
    assert infer(client, "cached", flat.reshape(4, 4)).as_numpy("OUTPUT0").shape == (4, 4)
    assert delta(before, stats(client, "cached"))["hit"] == 1


def test_failure_is_not_cached(client):
    data = -(ONE_KIB + 1)
    before = stats(client, "cached")
    for _ in range(2):
        with pytest.raises(InferenceServerException, match="negative input"):
            infer(client, "cached", data)
    d = delta(before, stats(client, "cached"))
    # (the python model answers with an error response, which Triton's python backend counts
    # as a success in the statistics: no fail)
    assert (d["hit"], d["miss"], d["exec"], d["fail"]) == (0, 2, 2, 0)


def test_model_without_response_cache_always_executes(client):
    data = ONE_KIB + 4000
    before = stats(client, "uncached")
    for _ in range(3):
        np.testing.assert_array_equal(infer(client, "uncached", data).as_numpy("OUTPUT0"), data)
    d = delta(before, stats(client, "uncached"))
    assert (d["hit"], d["miss"], d["exec"]) == (0, 0, 3)


def test_grpc_hit_and_statistics(cached_server, client):
    data = ONE_KIB + 5000
    infer(client, "cached", data)  # stored through HTTP, served through gRPC
    g = grpcclient.InferenceServerClient(cached_server.grpc_url)
    try:
        before = g.get_inference_statistics("cached", as_json=True)["model_stats"][0]
        inp = grpcclient.InferInput("INPUT0", list(data.shape), "INT32")
        inp.set_data_from_numpy(data)
        result = g.infer("cached", [inp])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), data * 2)
        after = g.get_inference_statistics("cached", as_json=True)["model_stats"][0]
    finally:
        g.close()
    hits = lambda s: int(s["inference_stats"]["cache_hit"].get("count", 0))  # noqa: E731
    assert hits(after) == hits(before) + 1
    assert after.get("execution_count") == before.get("execution_count")
    assert int(after["inference_stats"]["cache_hit"]["ns"]) > 0


def test_metrics(cached_server, client):
    data = ONE_KIB + 6000
    infer(client, "cached", data)
    infer(client, "cached", data)
    s = stats(client, "cached")
    with urllib.request.urlopen(cached_server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    labels = '{model="cached",version="1"}'
    assert f"nv_cache_num_hits_per_model{labels} {s['hit']}" in text
    assert f"nv_cache_num_misses_per_model{labels} {s['miss']}" in text
    assert f"nv_cache_hit_duration_per_model{labels} {s['hit_ns'] // 1000}" in text
    assert "nv_cache_miss_duration_per_model" + labels in text
    assert 'nv_cache_num_hits_per_model{model="uncached"' not in text


def test_decoupled_and_sequence_models_with_cache_fail_to_load(client):
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert index["decoupled_cached"]["state"] == "UNAVAILABLE"
    assert "does not currently support" in index["decoupled_cached"]["reason"]
    assert "'decoupled' transaction policy" in index["decoupled_cached"]["reason"]
    assert index["sequence_cached"]["state"] == "UNAVAILABLE"
    assert "sequence batching" in index["sequence_cached"]["reason"]
    assert client.is_server_ready()


def test_server_without_cache_config_does_not_cache(repository):
    with serve(repository) as server:
        c = httpclient.InferenceServerClient(server.url)
        try:
            for _ in range(2):
                infer(c, "cached", ONE_KIB)
            s = stats(c, "cached")
        finally:
            c.close()
    assert (s["hit"], s["miss"], s["exec"]) == (0, 0, 2)


def test_lru_eviction_under_the_size_bound(tmp_path):
    repo = write_repository(tmp_path / "models", ["cached"])
    # One response (two 4 KiB outputs) costs about 8.3 KB: 20000 bytes hold two, not three.
    with serve(repo, "--response-cache-byte-size", "20000") as server:
        c = httpclient.InferenceServerClient(server.url)
        try:
            a, b, cc = (np.full((1, 1024), v, dtype=np.int32) for v in (1, 2, 3))
            infer(c, "cached", a)
            infer(c, "cached", b)
            infer(c, "cached", a)   # hit: A becomes the most recently used
            infer(c, "cached", cc)  # evicts B, the least recently used
            before = stats(c, "cached")
            infer(c, "cached", a)   # still cached
            after_a = stats(c, "cached")
            infer(c, "cached", b)   # evicted: runs again
            after_b = stats(c, "cached")
        finally:
            c.close()
        log = server.log_text()
    assert delta(before, after_a)["hit"] == 1
    assert delta(after_a, after_b)["exec"] == 1 and delta(after_a, after_b)["hit"] == 0
    assert "deprecated" in log


def test_entry_larger_than_the_cache_is_not_stored(tmp_path):
    repo = write_repository(tmp_path / "models", ["cached"])
    with serve(repo, "--cache-config", "local,size=4096") as server:
        c = httpclient.InferenceServerClient(server.url)
        try:
            big = np.zeros((1, 1024), dtype=np.int32)  # 8 KiB of outputs
            for _ in range(3):
                infer(c, "cached", big)
            small = np.zeros((1, 4), dtype=np.int32)
            infer(c, "cached", small)
            infer(c, "cached", small)
            s = stats(c, "cached")
        finally:
            c.close()
        log = server.log_text()
    assert (s["hit"], s["miss"], s["exec"]) == (1, 4, 4)
    # Triton's line ("Failed to insert key [...] into response cache: Requested byte_size: ..."),
    # rate-limited: the three refused inserts within a second are one line
    assert log.count("Failed to insert key [") == 1
    assert "Requested byte_size: " in log and "is greater than total cache size: 4096" in log


@pytest.mark.parametrize("args, message", [
    (["--cache-config", "local,size=100"], "Failed to initialize LocalCache: size 100 is too small"),
    (["--cache-config", "local,size=lots"], "is not an integer"),
    (["--cache-config", "local,colour=blue"], "unknown local cache setting"),
    (["--cache-config", "nosuch,size=1", "--cache-directory", "/nonexistent"],
     "libtritoncache_nosuch.so"),
])
def test_bad_cache_config_fails_at_start(tmp_path, args, message):
    repo = write_repository(tmp_path / "models", ["uncached"])
    with pytest.raises(ServerStartError) as info:
        ServerProcess(repo, *args).start(timeout=60, attempts=1)
    assert message in str(info.value)


def test_grpc_stream_hit(cached_server, client):
    import queue

    data = ONE_KIB + 7000
    got: queue.SimpleQueue = queue.SimpleQueue()
    g = grpcclient.InferenceServerClient(cached_server.grpc_url)
    try:
        g.start_stream(callback=lambda result, error: got.put((result, error)))
        inp = grpcclient.InferInput("INPUT0", list(data.shape), "INT32")
        inp.set_data_from_numpy(data)
        before = stats(client, "cached")
        for _ in range(2):
            g.async_stream_infer("cached", [inp])
            result, error = got.get(timeout=30)
            assert error is None
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
        g.stop_stream()
    finally:
        g.close()
    d = delta(before, stats(client, "cached"))
    assert (d["hit"], d["miss"], d["exec"]) == (1, 1, 1)
