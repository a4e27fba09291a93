"""Triton's rate limiter (`--rate-limit=execution_count`, host/rate_limiter.py).

Through a real server: the load-time refusals with Triton's texts, and two models that need all of
one resource never executing at the same time. On the class itself: turns by scaled priority.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import tritonclient.http as httpclient

from host.errors import InvalidArgumentError
from host.proto import model_config_pb2
from host.rate_limiter import RateLimiter
from host.testing import serve

pytestmark = [pytest.mark.timeout(120), pytest.mark.modelhost_only]

# Sleeps (releasing the GIL, so two instances could overlap) and answers with when it ran.
TIMED = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        start = time.monotonic()
        time.sleep(0.03)
        end = time.monotonic()
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("SPAN", np.array([start, end], np.float64))]) for _ in requests]
"""


def _model(repo, name: str, limiter: str, count: int = 1) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}" backend: "python" max_batch_size: 0 '
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ] '
        'output [ { name: "SPAN" data_type: TYPE_FP64 dims: [ 2 ] } ] '
        f"instance_group [ {{ kind: KIND_CPU count: {count} rate_limiter {{ {limiter} }} }} ]")
    (repo / name / "1" / "model.py").write_text(TIMED)


def _reasons(server) -> dict[str, str]:
    client = httpclient.InferenceServerClient(server.url)
    return {m["name"]: m.get("reason", "") for m in client.get_model_repository_index()}


def test_a_resource_count_below_an_instances_need_refuses_the_load(tmp_path):
    _model(tmp_path, "big", 'resources [ { name: "resource1" count: 4 } ]')
    _model(tmp_path, "small", 'resources [ { name: "resource1" count: 1 } ]')
    with serve(tmp_path, "--rate-limit=execution_count", "--rate-limit-resource=resource1:1") as server:
        reasons = _reasons(server)
        assert 'Resource count for "resource1" is limited to 1 which will prevent scheduling of one ' \
               "or more model instances, the minimum required count is 4" in reasons["big"]
        assert reasons["small"] == ""


def test_a_resource_given_only_for_another_device_counts_zero(tmp_path):
    _model(tmp_path, "m", 'resources [ { name: "resource1" count: 4 } ]')
    with serve(tmp_path, "--rate-limit=execution_count", "--rate-limit-resource=resource1:10:10") as server:
        assert 'Resource count for "resource1" is limited to 0 which will prevent' in _reasons(server)["m"]


def test_one_name_both_global_and_per_device_is_refused(tmp_path):
    _model(tmp_path, "a", 'resources [ { name: "resource2" count: 2 } ]')
    _model(tmp_path, "b", 'resources [ { name: "resource2" global: true count: 2 } ]')
    with serve(tmp_path, "--rate-limit=execution_count") as server:
        reasons = _reasons(server)
        text = ('Resource "resource2" is present as both global and device-specific resource in the '
                "model configuration.")
        assert text in reasons["a"] or text in reasons["b"]


def _spans(server, models: list[str], per_model: int) -> dict[str, list[tuple[float, float]]]:
    spans: dict[str, list[tuple[float, float]]] = {m: [] for m in models}
    errors: list[Exception] = []

    def client(model: str) -> None:
        c = httpclient.InferenceServerClient(server.url)
        i = httpclient.InferInput("IN", [1], "FP32")
        i.set_data_from_numpy(np.zeros(1, np.float32))
        try:
            for _ in range(per_model):
                start, end = c.infer(model, [i]).as_numpy("SPAN").tolist()
                spans[model].append((start, end))
        except Exception as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(m,)) for m in models for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    return spans


def test_instances_that_need_the_whole_resource_never_run_together(tmp_path):
    # Four instances over two models, each needing the one unit of R: one execute at a time.
    _model(tmp_path, "left", 'resources [ { name: "R" count: 1 } ]', count=2)
    _model(tmp_path, "right", 'resources [ { name: "R" count: 1 } ]', count=2)
    with serve(tmp_path, "--rate-limit=execution_count") as server:
        spans = _spans(server, ["left", "right"], per_model=6)
    every = sorted(spans["left"] + spans["right"])
    assert len(every) == 24
    for (_, end), (start, _) in zip(every, every[1:]):
        assert start >= end  # the next execute starts after the previous one ended


def test_rate_limiter_sections_are_ignored_when_off(tmp_path):
    _model(tmp_path, "left", 'resources [ { name: "R" count: 1 } ]', count=2)
    with serve(tmp_path) as server:  # --rate-limit=off: as in Triton, nothing waits for R
        assert _reasons(server)["left"] == ""
        spans = _spans(server, ["left"], per_model=4)
    assert len(spans["left"]) == 8


def _config(priority: int = 0, **resources: int) -> model_config_pb2.ModelRateLimiter:
    cfg = model_config_pb2.ModelRateLimiter(priority=priority)
    for name, count in resources.items():
        cfg.resources.add(name=name, count=count)
    return cfg


def test_turns_follow_executions_times_priority():
    # Two instances that both need the one unit of R, always waiting: the one with priority 2
    # gets every other turn of the one with priority 1 (Triton's scaled priority).
    limiter = RateLimiter()
    fast, slow = object(), object()
    limiter.add_instance(fast, _config(R=1), 0)
    limiter.add_instance(slow, _config(priority=2, R=1), 0)
    order: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def worker(slot: object, name: str) -> None:
        while not stop.is_set():
            limiter.acquire(slot)
            with lock:
                order.append(name)
                if len(order) >= 60:
                    stop.set()
            time.sleep(0.001)
            limiter.release(slot, again=True)  # more work waits: staged again at once

    threads = [threading.Thread(target=worker, args=(s, n)) for s, n in ((fast, "f"), (slow, "s"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    counts = order[:60].count("f"), order[:60].count("s")
    assert abs(counts[0] - 2 * counts[1]) <= 3, (counts, "".join(order))


def test_explicit_counts_and_removal():
    limiter = RateLimiter(["R:2"])
    a, b = object(), object()
    limiter.add_instance(a, _config(R=2), 0)
    with pytest.raises(InvalidArgumentError, match='limited to 2 .* minimum required count is 3'):
        limiter.add_instance(b, _config(R=3), 0)
    limiter.add_instance(b, _config(R=1), 0)  # the refused registration left nothing behind
    limiter.acquire(b)
    granted = threading.Event()
    t = threading.Thread(target=lambda: (limiter.acquire(a), granted.set()))
    t.start()
    assert not granted.wait(0.2)  # a needs both units, b holds one
    limiter.release(b)
    assert granted.wait(10)
    limiter.release(a)
    t.join(10)
    limiter.remove_instance(a)
    limiter.remove_instance(b)


def _race(server, models: str, total: int) -> dict[str, int]:
    """Four clients per model, each sending requests until `total` were answered in all."""
    counts = dict.fromkeys(models, 0)
    lock = threading.Lock()

    def client(model: str) -> None:
        c = httpclient.InferenceServerClient(server.url)
        i = httpclient.InferInput("IN", [1], "FP32")
        i.set_data_from_numpy(np.zeros(1, np.float32))
        while True:
            with lock:
                if sum(counts.values()) >= total:
                    return
            c.infer(model, [i])
            with lock:
                counts[model] += 1

    threads = [threading.Thread(target=client, args=(m,)) for m in models for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return counts


def test_cross_model_priority_with_limited_and_plenty_resources(tmp_path):
    # Triton's L0_rate_limiter models: 'a' needs all of resource1, 'b' (priority 2) half of it
    # and a global resource2, so they cannot run together: 'a' gets about two turns for one.
    _model(tmp_path, "a", 'resources [ { name: "resource1" count: 4 } ]')
    _model(tmp_path, "b", 'resources [ { name: "resource1" count: 2 }, { name: "resource2" '
                          "global: true count: 2 } ] priority: 2")
    with serve(tmp_path, "--rate-limit=execution_count") as server:
        counts = _race(server, "ab", 60)
    assert 1.5 <= counts["a"] / counts["b"] <= 2.6, counts
    # With 6 units of resource1 they run side by side, and take as many turns each.
    with serve(tmp_path, "--rate-limit=execution_count", "--rate-limit-resource=resource1:6",
               "--rate-limit-resource=resource2:2") as server:
        counts = _race(server, "ab", 60)
    assert abs(counts["a"] - counts["b"]) <= 10, counts
