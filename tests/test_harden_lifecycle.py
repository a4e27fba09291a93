"""Issue 15, finding 7: request lifecycle under races and time.

- a request completes exactly once even when two threads deliver its final response at once;
- the dynamic batcher's queue policy (max_queue_size, default timeout REJECT / DELAY, timeout
  override, priority levels) and Triton's messages, over the real client;
- an instance stuck in execute freezes neither unloading (bounded), loading, the index nor other
  models.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from host.backend import Backend, Instance, Model
from host.core import Host
from host.inference import InferenceRequest, InferenceResponse, Tensor
from host.options import ServerOptions
from host.plugins import get_plugin_manager, hookimpl
from host.testing import serve, wait_until
from test_e2e_serve import write_identity

pytestmark = [pytest.mark.timeout(180)]


# --- exactly once --------------------------------------------------------------------------------

class _RacingInstance(Instance):
    """Answers each request from two threads released together, plus a failure from a third."""

    def execute(self, requests):
        for request in requests:
            barrier = threading.Barrier(3)

            def answer(kind: str, request: InferenceRequest = request) -> None:
                barrier.wait()
                if kind == "error":
                    from host.errors import InternalError
                    request.respond(InferenceResponse(error=InternalError("scheduler failure")), True)
                else:
                    out = Tensor("OUT", "INT32", [1], np.array([1], np.int32))
                    request.respond(InferenceResponse(outputs=[out]), True)

            for kind in ("ok", "ok", "error"):
                threading.Thread(target=answer, args=(kind,)).start()
        return None


class _RacingModel(Model):
    def create_instance(self, spec):
        return _RacingInstance()


class _RacingBackend(Backend):
    def create_model(self, spec):
        return _RacingModel(spec)


class _RacingPlugin:
    __name__ = "racing"

    @hookimpl
    def modelhost_register_backends(self, registry) -> None:
        registry.add_backend("racing", _RacingBackend)


def test_final_response_is_delivered_exactly_once(tmp_path):
    (tmp_path / "r" / "1").mkdir(parents=True)
    (tmp_path / "r" / "config.pbtxt").write_text(
        'name: "r"\nbackend: "racing"\nmax_batch_size: 0\n'
        'model_transaction_policy { decoupled: true }\n'
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n')
    host = Host(ServerOptions(model_repositories=[tmp_path]),
                plugins=get_plugin_manager(blocked=["python"], extra=[_RacingPlugin()]))
    host.start()
    try:
        finals = []
        done = threading.Semaphore(0)
        for _ in range(300):
            count = [0]

            def callback(response, final, count=count):
                if final:
                    count[0] += 1
                    done.release()

            request = InferenceRequest(model_name="r", inputs={
                "IN": Tensor("IN", "INT32", [1], np.array([1], np.int32))})
            host.submit(request, callback)
            assert done.acquire(timeout=10)
            finals.append(count)
        time.sleep(0.2)  # any late duplicate would have arrived by now
        assert all(c[0] == 1 for c in finals), [c[0] for c in finals if c[0] != 1]
        assert host.manager.get("r").inflight == 0  # counted out once per request
    finally:
        host.stop()


# --- queue policy over the real server -----------------------------------------------------------

GATED = """
import os, time, json
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.gate = os.path.join(args["model_repository"], "gate")
        self.order = os.path.join(args["model_repository"], "order")

    def execute(self, requests):
        deadline = time.monotonic() + 60
        while os.path.exists(self.gate) and time.monotonic() < deadline:
            time.sleep(0.01)
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            with open(self.order, "a") as f:
                f.write(f"{int(x.flat[0])}\\n")
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
"""


def _gated(repo, name, batching):
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(GATED)
    (repo / name / "config.pbtxt").write_text(f"""
name: "{name}"
backend: "python"
max_batch_size: 1
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
dynamic_batching {{ {batching} }}
""")
    return repo / name


def _send(client, model, value, **kwargs):
    x = httpclient.InferInput("INPUT0", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[value]], np.float32))
    return client.infer(model, [x], **kwargs).as_numpy("OUTPUT0").item()


@pytest.mark.modelhost_only
def test_queue_policy_as_triton(tmp_path):
    full = _gated(tmp_path, "full", "default_queue_policy { max_queue_size: 2 }")
    reject = _gated(tmp_path, "reject", "default_queue_policy { timeout_action: REJECT "
                    "default_timeout_microseconds: 300000 }")
    delay = _gated(tmp_path, "delay", "default_queue_policy { timeout_action: DELAY "
                   "default_timeout_microseconds: 100000 }")
    override = _gated(tmp_path, "override", "default_queue_policy { timeout_action: REJECT "
                      "default_timeout_microseconds: 60000000 allow_timeout_override: true }")
    prio = _gated(tmp_path, "prio", "priority_levels: 2 default_priority_level: 2")
    with serve(tmp_path) as server, concurrent.futures.ThreadPoolExecutor(16) as pool:
        def client():
            return httpclient.InferenceServerClient(server.url, network_timeout=60)

        def hold(folder, model):
            (folder / "gate").touch()
            holder = pool.submit(_send, client(), model, 0.0)
            time.sleep(0.5)  # the holder's request is taken by the one instance by now
            return holder

        # max_queue_size: the instance holds one, the queue two, the next is refused
        holder = hold(full, "full")
        queued = [pool.submit(_send, client(), "full", float(i)) for i in (1, 2)]
        time.sleep(0.3)
        with pytest.raises(InferenceServerException) as info:
            _send(client(), "full", 3.0)
        assert info.value.status() == "503" and "Exceeds maximum queue size" in str(info.value)
        (full / "gate").unlink()
        assert holder.result(30) == 0.0 and [q.result(30) for q in queued] == [1.0, 2.0]

        # REJECT: a request that waits past its timeout fails with Triton's message
        holder = hold(reject, "reject")
        with pytest.raises(InferenceServerException) as info:
            _send(client(), "reject", 1.0)
        assert info.value.status() == "503" and "Request timeout expired" in str(info.value)
        (reject / "gate").unlink()
        assert holder.result(30) == 0.0

        # DELAY: it expires, but still runs
        holder = hold(delay, "delay")
        late = pool.submit(_send, client(), "delay", 1.0)
        time.sleep(0.3)
        (delay / "gate").unlink()
        assert holder.result(30) == 0.0 and late.result(30) == 1.0

        # allow_timeout_override: the request's own, shorter timeout (microseconds)
        holder = hold(override, "override")
        with pytest.raises(InferenceServerException, match="Request timeout expired"):
            _send(client(), "override", 1.0, timeout=200000)
        (override / "gate").unlink()
        assert holder.result(30) == 0.0

        # priority levels: level 1 goes before level 2 (the default) queued earlier
        holder = hold(prio, "prio")
        low = pool.submit(_send, client(), "prio", 2.0)
        time.sleep(0.2)
        high = pool.submit(_send, client(), "prio", 1.0, priority=1)
        time.sleep(0.3)
        (prio / "gate").unlink()
        assert holder.result(30) == 0.0 and low.result(30) == 2.0 and high.result(30) == 1.0
        assert (prio / "order").read_text().split() == ["0", "1", "2"]


# --- a stuck instance ----------------------------------------------------------------------------

@pytest.mark.modelhost_only
def test_a_stuck_instance_freezes_nothing_else(tmp_path):
    stuck = _gated(tmp_path, "stuck", "")
    write_identity(tmp_path, "other")
    write_identity(tmp_path, "later")
    with serve(tmp_path, "--model-control-mode", "explicit", "--load-model", "stuck",
               "--load-model", "other", "--exit-timeout-secs", "1") as server, \
            concurrent.futures.ThreadPoolExecutor(4) as pool:
        client = httpclient.InferenceServerClient(server.url, network_timeout=60)
        (stuck / "gate").touch()
        holder = pool.submit(_send, httpclient.InferenceServerClient(server.url, network_timeout=60),
                             "stuck", 7.0)
        time.sleep(0.5)
        started = time.monotonic()
        client.unload_model("stuck")  # bounded: returns while the request is still running
        assert time.monotonic() - started < 20
        rows = {r["name"]: r for r in client.get_model_repository_index()}
        assert rows["stuck"]["state"] == "UNLOADING"
        client.load_model("later")
        x = httpclient.InferInput("INPUT0", [1], "FP32")
        x.set_data_from_numpy(np.array([3.0], np.float32))
        assert client.infer("later", [x]).as_numpy("OUTPUT0").tolist() == [3.0]
        assert client.infer("other", [x]).as_numpy("OUTPUT0").tolist() == [3.0]
        (stuck / "gate").unlink()
        assert holder.result(30) == 7.0  # the request in flight still finished
        wait_until(lambda: {r["name"]: r for r in client.get_model_repository_index()}
                   ["stuck"].get("state") != "UNLOADING", timeout=20)


@pytest.mark.modelhost_only
def test_reloading_a_stuck_model_freezes_nothing_else(tmp_path):
    """A reload replaces a version whose request is stuck in execute: the reload waits for it
    (bounded by --exit-timeout-secs), and meanwhile the index, loads and other models answer."""
    stuck = _gated(tmp_path, "stuck", "")
    write_identity(tmp_path, "other")
    write_identity(tmp_path, "later")
    with serve(tmp_path, "--model-control-mode", "explicit", "--load-model", "stuck",
               "--load-model", "other", "--exit-timeout-secs", "120") as server, \
            concurrent.futures.ThreadPoolExecutor(4) as pool:
        client = httpclient.InferenceServerClient(server.url, network_timeout=300)
        (stuck / "gate").touch()
        holder = pool.submit(_send, httpclient.InferenceServerClient(server.url, network_timeout=300),
                             "stuck", 7.0)
        time.sleep(0.5)
        reload = pool.submit(httpclient.InferenceServerClient(server.url, network_timeout=300)
                             .load_model, "stuck")
        time.sleep(2.0)  # the new version loads; the reload then waits for the stuck one
        rows = {r["name"]: r for r in client.get_model_repository_index()}
        client.load_model("later")
        x = httpclient.InferInput("INPUT0", [1], "FP32")
        x.set_data_from_numpy(np.array([3.0], np.float32))
        assert client.infer("other", [x]).as_numpy("OUTPUT0").tolist() == [3.0]
        # all of that answered while the reload still waited for the stuck request
        assert not reload.done() and not holder.done(), rows
        (stuck / "gate").unlink()
        assert holder.result(60) == 7.0
        reload.result(60)
        assert client.is_model_ready("stuck")
