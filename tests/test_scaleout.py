"""Scale-out, for real on one machine: three replicas in their own network namespaces behind
HAProxy (HTTP and gRPC), sharing one redis-server as their response cache (tests/netlab.py).

Checks, in order on one lab (each phase's figures are printed, and shown by `pytest -s` or
`-rA`):
- requests through the balancer spread over the replicas, over HTTP and over gRPC;
- a response cached through one replica is a hit through another;
- a replica killed (SIGKILL) mid-load costs at most the requests it had in flight, and its
  traffic moves to the others;
- a rolling restart of all three, one at a time, loses no request (each replica is drained in
  the balancer first, then stopped with SIGTERM, as Kubernetes does with its endpoints);
- a client's shared-memory region is refused, clearly, by a replica on another host.

The load is bounded: a fixed number of client threads, each stopping after a set count or time.
Traffic goes only to 127.0.0.1 (HAProxy) and to the addresses of the namespaces made here.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from cache_models import write_repository
from netlab import Lab

pytestmark = [pytest.mark.modelhost_only, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parent.parent
MODEL = "identity_fp32"
BODY = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4],
                               "data": [1.0, 2.0, 3.0, 4.0]}]}).encode()


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Iterator[Lab]:
    why = Lab.unavailable()
    if why:
        pytest.skip(f"scale-out lab unavailable: {why}")
    work = tmp_path_factory.mktemp("scaleout")
    repo = write_repository(work / "models", ["cached"])
    (repo / MODEL).symlink_to(ROOT / "model_repository" / MODEL, target_is_directory=True)
    lab = Lab(work, repo)
    try:
        yield lab.open()
    finally:
        lab.close()


@dataclass
class Load:
    """Client threads sending requests through the balancer until stopped (or their budget ends)."""

    lab: Lab
    http_threads: int = 3
    grpc_threads: int = 1
    max_requests: int = 3000  # per thread
    max_seconds: float = 60.0
    pause: float = 0.0  # between a thread's requests: keeps a long load light on a small machine
    ok: list[tuple[float, str]] = field(default_factory=list)  # (time, served by) per success
    failures: list[tuple[float, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Load:
        for _ in range(self.http_threads):
            self._threads.append(threading.Thread(target=self._http, daemon=True))
        for _ in range(self.grpc_threads):
            self._threads.append(threading.Thread(target=self._grpc, daemon=True))
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)

    def _running(self, started: float, sent: int) -> bool:
        return not self._stop.is_set() and sent < self.max_requests and \
            time.monotonic() - started < self.max_seconds

    def _http(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.lab.http_port, timeout=30)
        started, sent = time.monotonic(), 0
        while self._running(started, sent):
            sent += 1
            try:
                conn.request("POST", f"/v2/models/{MODEL}/infer", BODY)
                response = conn.getresponse()
                payload = response.read()
                if response.status != 200:
                    raise RuntimeError(f"HTTP {response.status}: {payload[:200]!r}")
                self.ok.append((time.monotonic(), response.getheader("X-Served-By", "?")))
                time.sleep(self.pause)
            except Exception as exc:  # noqa: BLE001 - every failure is counted
                self.failures.append((time.monotonic(), f"http: {exc}"))
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.lab.http_port, timeout=30)
        conn.close()

    def _grpc(self) -> None:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{self.lab.grpc_port}")
        tensor = grpcclient.InferInput("INPUT0", [4], "FP32")
        tensor.set_data_from_numpy(np.arange(4, dtype=np.float32))
        started, sent = time.monotonic(), 0
        while self._running(started, sent):
            sent += 1
            try:
                client.infer(MODEL, [tensor], client_timeout=30)
                self.ok.append((time.monotonic(), "grpc"))
                time.sleep(self.pause)
            except InferenceServerException as exc:
                self.failures.append((time.monotonic(), f"grpc: {exc}"))
        client.close()

    def join(self) -> None:
        """Wait until every thread has sent its budget."""
        for t in self._threads:
            t.join(120)

    def wait_for(self, count: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while len(self.ok) < count:
            assert time.monotonic() < deadline, f"the load stalled at {len(self.ok)} of {count} requests"
            assert any(t.is_alive() for t in self._threads), "the load ended its budget too early"
            time.sleep(0.02)


@pytest.fixture
def report(capsys):
    """Print a figure to the terminal even when pytest captures output: CI's log shows them."""
    def emit(text: str) -> None:
        with capsys.disabled():
            print(f"\n[scale-out] {text}")
    return emit


def _served(lab: Lab) -> dict[str, float]:
    return {r.name: r.metric("nv_inference_request_success", MODEL) for r in lab.replicas}


def test_requests_spread_over_replicas_http_and_grpc(lab, report):
    before = _served(lab)
    with Load(lab, http_threads=3, grpc_threads=0, max_requests=60) as load:
        load.join()
    http_by = Counter(name for _, name in load.ok)
    after_http = _served(lab)
    with Load(lab, http_threads=0, grpc_threads=2, max_requests=60) as grpc_load:
        grpc_load.join()
    assert not grpc_load.failures and len(grpc_load.ok) == 120
    after_grpc = _served(lab)
    grpc_by = {r: after_grpc[r] - after_http[r] for r in after_grpc}
    report(f"spread: HTTP requests per replica {dict(sorted(http_by.items()))}, "
          f"gRPC requests per replica {grpc_by}, failures {len(load.failures)}")
    assert not load.failures
    assert sum(http_by.values()) == 180 and set(http_by) == {"r0", "r1", "r2"}
    assert min(http_by.values()) >= 180 / 6  # round robin: about 60 each
    # the replicas' own counters agree with the balancer's header
    assert {r: after_http[r] - before[r] for r in before} == {r: float(n) for r, n in http_by.items()}
    assert sum(grpc_by.values()) == 120 and min(grpc_by.values()) >= 120 / 6


def test_a_response_cached_through_one_replica_is_a_hit_through_another(lab, report):
    r0, r1, r2 = lab.replicas
    data = np.arange(64, dtype=np.int32).reshape(1, 64) + int(time.time()) % 1000

    def infer(url: str) -> np.ndarray:
        client = httpclient.InferenceServerClient(url)
        tensor = httpclient.InferInput("INPUT0", list(data.shape), "INT32")
        tensor.set_data_from_numpy(data)
        return client.infer("cached", [tensor]).as_numpy("OUTPUT1")

    def stats(replica) -> tuple[int, int, int]:
        s = httpclient.InferenceServerClient(replica.http_url).get_inference_statistics("cached")
        s = s["model_stats"][0]
        return (s["inference_stats"]["cache_hit"]["count"], s["inference_stats"]["cache_miss"]["count"],
                s["execution_count"])

    before = {r.name: stats(r) for r in lab.replicas}
    np.testing.assert_array_equal(infer(r0.http_url), data * 2)        # computed by r0
    np.testing.assert_array_equal(infer(r1.http_url), data * 2)        # a hit on r1
    for _ in range(3):                                                  # and through the balancer
        np.testing.assert_array_equal(infer(f"127.0.0.1:{lab.http_port}"), data * 2)
    after = {r.name: stats(r) for r in lab.replicas}
    delta = {n: tuple(a - b for a, b in zip(after[n], before[n])) for n in after}
    report(f"cache (hits, misses, executions) per replica: {delta}")
    assert delta["r0"][1:] == (1, 1)            # one miss, one execution: the only one
    assert delta["r1"][0] >= 1 and delta["r1"][2] == 0
    assert sum(d[2] for d in delta.values()) == 1 and sum(d[0] for d in delta.values()) == 4


def test_a_replica_killed_mid_load_costs_only_its_in_flight_requests(lab, report):
    victim = lab.replicas[1]
    with Load(lab, http_threads=3, grpc_threads=1, max_seconds=60) as load:
        load.wait_for(150)
        in_flight = lab.current_sessions(victim)  # what HAProxy had on it just before
        victim.kill()
        # the replica is dead and reaped; a response it sent just before may still be on its way
        dead_at = time.monotonic() + 0.5
        time.sleep(0.5)
        load.wait_for(len(load.ok) + 300)
    after = [name for t, name in load.ok if t > dead_at]
    in_flight_bound = load.http_threads + load.grpc_threads
    report(f"kill: {len(load.ok)} requests ok, {len(load.failures)} failed "
          f"({in_flight} in flight on the replica just before the kill; bound: the "
          f"{in_flight_bound} client threads), served after the kill: {dict(Counter(after))}; "
          f"failures: {[f for _, f in load.failures][:5]}")
    assert len(load.failures) <= in_flight_bound
    assert "r1" not in after                     # nothing is answered by the dead replica
    assert {"r0", "r2"} <= set(after)            # its traffic moved to the others
    assert len(after) >= 300
    # bring it back for what follows
    victim.start()
    lab.set_state(victim, "ready")
    _wait_up(lab, victim)


def _wait_up(lab: Lab, replica, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not lab.server_up(replica):
        assert time.monotonic() < deadline, f"HAProxy never saw {replica.name} up again"
        time.sleep(0.05)


def test_rolling_restart_loses_no_request(lab, report):
    with Load(lab, http_threads=3, grpc_threads=1, max_requests=100_000, max_seconds=240,
              pause=0.005) as load:
        load.wait_for(100)
        for replica in lab.replicas:
            served_before = Counter(name for _, name in load.ok)[replica.name]
            lab.set_state(replica, "drain")           # the balancer sends it nothing new
            deadline = time.monotonic() + 10
            while lab.current_sessions(replica) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert replica.stop() == 0                # SIGTERM: what is in flight finishes
            replica.start()
            lab.set_state(replica, "ready")
            _wait_up(lab, replica)
            count = len(load.ok)
            load.wait_for(count + 100)
            # back in rotation: it serves again
            assert Counter(name for _, name in load.ok)[replica.name] > served_before
        total = len(load.ok)
    by_replica = dict(Counter(name for _, name in load.ok))
    report(f"rolling restart: {total} requests ok, {len(load.failures)} failed, "
          f"per replica {by_replica}; failures: {[f for _, f in load.failures][:5]}")
    assert load.failures == []
    assert all(by_replica.get(r.name, 0) > 0 for r in lab.replicas)


def test_shared_memory_is_refused_clearly_for_a_client_on_another_host(lab, report):
    import tritonclient.utils.shared_memory as shm

    key = f"/mh_scaleout_{lab.tag}"
    region = shm.create_shared_memory_region("far", key, 64)  # here, not on the replicas' host
    try:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{lab.http_port}")
        with pytest.raises(InferenceServerException) as info:
            client.register_system_shared_memory("far", key, 64)
        message = str(info.value)
        report(f"shared memory refused: {message}")
        assert f"Unable to open shared memory region: '{key}'" in message
        assert "works only for a client on the same host as the server" in message
        assert client.is_server_live()
    finally:
        shm.destroy_shared_memory_region(region)
