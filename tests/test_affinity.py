"""--python-cpu (host.affinity): the threads that run Python on the request path share one CPU;
a long execute (and a model's first), a load and a restarted stub run on every CPU."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from host import affinity
from host.backend import Backend, Instance, Model
from host.core import Host
from host.errors import InvalidArgumentError
from host.inference import InferenceRequest, InferenceResponse, Tensor
from host.options import ServerOptions
from host.plugins import get_plugin_manager, hookimpl
from host.testing import ServerStartError, serve

ALLOWED = sorted(os.sched_getaffinity(0))
needs_two = pytest.mark.skipif(len(ALLOWED) < 2, reason="pinning needs a process that may use two CPUs")

# A python model that answers with the CPUs its execute may run on.
WHERE_PY = """
import os
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        import json
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.sleep_s = float(parameters.get("sleep_ms", {}).get("string_value", "0")) / 1000

    def execute(self, requests):
        time.sleep(self.sleep_s)
        cpus = np.array(sorted(os.sched_getaffinity(0)), dtype=np.int32)
        responses = []
        for request in requests:
            rows = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().shape[:-1]
            out = np.broadcast_to(cpus, rows + cpus.shape).copy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("CPUS", out)]))
        return responses
"""
CONFIG = """
name: "{name}"
backend: "{backend}"
max_batch_size: {mbs}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "CPUS" data_type: TYPE_INT32 dims: [ -1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{extra}
"""


def write_model(repo: Path, name: str, backend: str = "python", extra: str = "", mbs: int = 0) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, backend=backend, extra=extra, mbs=mbs))
    if backend == "python":
        (repo / name / "1" / "model.py").write_text(WHERE_PY)


def settled(call, tries: int = 200) -> list[int]:
    """What `call` answers once the model's executes were seen to be short: its first execute,
    and any that a busy machine stretched past host.affinity.LONG_EXECUTE_NS, run wide, so a
    short model is pinned from the call after its last long one on."""
    seen: list[int] = []
    for _ in range(tries):
        seen = call()
        if len(seen) == 1:
            break
    return seen


def http_cpus(server, model: str = "where") -> list[int]:
    client = httpclient.InferenceServerClient(server.url, network_timeout=30)
    try:
        shape = [1, 1] if model.endswith("batched") else [1]
        inp = httpclient.InferInput("IN", shape, "INT32")
        inp.set_data_from_numpy(np.zeros(shape, np.int32))
        return client.infer(model, [inp]).as_numpy("CPUS").reshape(-1).tolist()
    finally:
        client.close()


def grpc_cpus(server, model: str = "where") -> list[int]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        shape = [1, 1] if model.endswith("batched") else [1]
        inp = grpcclient.InferInput("IN", shape, "INT32")
        inp.set_data_from_numpy(np.zeros(shape, np.int32))
        return client.infer(model, [inp], client_timeout=30).as_numpy("CPUS").reshape(-1).tolist()
    finally:
        client.close()


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    write_model(tmp_path, "where")
    write_model(tmp_path, "where_batched", mbs=4, extra="dynamic_batching { max_queue_delay_microseconds: 100 }")
    write_model(tmp_path, "where_slow", extra='parameters { key: "sleep_ms" value { string_value: "2" } }')
    return tmp_path


@needs_two
def test_requests_and_python_models_run_on_the_chosen_cpu(repo: Path) -> None:
    cpu = ALLOWED[-1]
    with serve(repo, "--python-cpu", str(cpu)) as server:
        # The python model runs on the thread that took the request (HTTP connection, gRPC
        # poller) or on the batcher's thread: each of them is on the chosen CPU.
        assert settled(lambda: http_cpus(server)) == [cpu]
        assert settled(lambda: grpc_cpus(server)) == [cpu]
        assert settled(lambda: http_cpus(server, "where_batched")) == [cpu]
        assert settled(lambda: grpc_cpus(server, "where_batched")) == [cpu]
        # A python model whose execute is long (here it sleeps; it might call torch) is let
        # onto every CPU for the call.
        assert http_cpus(server, "where_slow") == ALLOWED
        assert grpc_cpus(server, "where_slow") == ALLOWED


@needs_two
def test_off_leaves_the_threads_on_every_cpu(repo: Path) -> None:
    with serve(repo, "--python-cpu", "off") as server:
        assert http_cpus(server) == ALLOWED
        assert grpc_cpus(server) == ALLOWED


@needs_two
def test_auto_pins_to_one_allowed_cpu(repo: Path) -> None:
    with serve(repo) as server:
        first = settled(lambda: http_cpus(server))
        assert len(first) == 1 and first[0] in ALLOWED
        assert settled(lambda: grpc_cpus(server)) == first


def test_a_cpu_the_process_may_not_use_is_refused(repo: Path) -> None:
    with pytest.raises(ServerStartError) as failure:
        with serve(repo, "--python-cpu", str(max(ALLOWED) + 4096), timeout=30):
            pass
    assert f"CPU {max(ALLOWED) + 4096} is not one this process may run on" in str(failure.value)


def test_a_malformed_setting_is_a_usage_error(repo: Path) -> None:
    with pytest.raises(ServerStartError) as failure:
        with serve(repo, "--python-cpu", "fast", timeout=30):
            pass
    assert "expected 'auto', 'off' or a CPU number, got 'fast'" in str(failure.value)


# --- in process: which backends widen, and loads -----------------------------------------------

SEEN: dict[str, list[int]] = {}


class WhereInstance(Instance):
    def __init__(self, sleep_s: float) -> None:
        self.sleep_s = sleep_s

    def execute(self, requests):
        time.sleep(self.sleep_s)
        cpus = np.array(sorted(os.sched_getaffinity(0)), dtype=np.int32)
        return [InferenceResponse(outputs=[Tensor("CPUS", "INT32", [len(cpus)], cpus)]) for _ in requests]


class WhereModel(Model):
    def initialize(self) -> None:
        SEEN[self.spec.name] = sorted(os.sched_getaffinity(0))

    def create_instance(self, spec) -> Instance:
        return WhereInstance(float(self.spec.parameter("sleep_ms", "0")) / 1000)


class WhereBackend(Backend):
    def create_model(self, spec) -> Model:
        return WhereModel(spec)


class WherePlugin:
    __name__ = "wherebe"

    @hookimpl
    def modelhost_register_backends(self, registry) -> None:
        registry.add_backend("where", WhereBackend)


def _on_pinned_thread(fn, inherited: bool = False):
    """Run fn on a new thread that pinned itself, as a front-end thread does (or, `inherited`,
    on a thread started by one, as a pool's thread is); returns (fn's result, the thread's CPUs
    afterwards)."""
    out: list = []

    def run() -> None:
        try:
            out.append(fn())
        finally:
            out.append(sorted(os.sched_getaffinity(0)))

    def pinned() -> None:
        affinity.pin()
        if not inherited:
            run()
            return
        child = threading.Thread(target=run)  # its mask is this thread's; it never calls pin()
        child.start()
        child.join(60)

    t = threading.Thread(target=pinned)
    t.start()
    t.join(60)
    return out[0], out[1]


@needs_two
def test_a_long_execute_and_a_load_run_on_every_cpu(tmp_path: Path) -> None:
    cpu = ALLOWED[0]
    write_model(tmp_path, "quick", backend="where")
    write_model(tmp_path, "slow", backend="where",
                extra='parameters { key: "sleep_ms" value { string_value: "2" } }')
    write_model(tmp_path, "loaded_later", backend="where")
    options = ServerOptions(model_repositories=[tmp_path], python_cpu=str(cpu),
                            model_control_mode="explicit", load_models=["quick", "slow"])
    host = Host(options, plugins=get_plugin_manager(blocked=["python"], extra=[WherePlugin()]))
    try:
        assert host.start() == {}

        def infer(model: str):
            request = InferenceRequest(model_name=model, inputs={
                "IN": Tensor("IN", "INT32", [1], np.zeros(1, np.int32))})
            return host.infer(request).outputs[0].data.tolist()

        # A model's first execute is wide (a pool it starts lazily gets every CPU), and its
        # thread is pinned again after the call.
        seen, after = _on_pinned_thread(lambda: infer("quick"))
        assert seen == ALLOWED and after == [cpu]
        # Once an execute was short, the next one stays on the Python CPU (moving costs more).
        assert settled(lambda: _on_pinned_thread(lambda: infer("quick"))[0]) == [cpu]
        for _ in range(3):  # a long execute keeps widening
            seen, after = _on_pinned_thread(lambda: infer("slow"))
            assert seen == ALLOWED and after == [cpu]
        # Also on a thread that only inherited the pin (a pool started from a request's thread).
        seen, after = _on_pinned_thread(lambda: infer("slow"), inherited=True)
        assert seen == ALLOWED and after == [cpu]
        # A load asked for on a front-end thread runs wide (its threads inherit that).
        _, after = _on_pinned_thread(lambda: host.load_model("loaded_later"))
        assert SEEN["loaded_later"] == ALLOWED and after == [cpu]
    finally:
        host.stop()
        affinity.configure("off")


def test_configure_checks_its_value() -> None:
    with pytest.raises(ValueError, match="--python-cpu: expected 'auto', 'off' or a CPU number"):
        affinity.configure("many")
    assert affinity.parse(" Auto ") == "auto" and affinity.parse("3") == "3"
    with pytest.raises(InvalidArgumentError, match="is not one this process may run on"):
        Host(ServerOptions(model_repositories=[], python_cpu=str(max(ALLOWED) + 4096)))
    affinity.configure("off")
    assert affinity.cpu() is None
