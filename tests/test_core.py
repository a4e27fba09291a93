"""Core unit tests: lifecycle, scheduling, control modes, versions, plugins (no sockets).

The backend here is a real plugin object registered through the plugin manager; it records
every lifecycle call so the tests can check order, and its behaviour is chosen per model through
config parameters (`fail_at`, `sleep_ms`, `barrier`).
"""

from __future__ import annotations

import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from host.backend import Backend, Instance, Model
from host.core import Host
from host.errors import (AlreadyExistsError, InternalError, InvalidArgumentError, NotFoundError,
                         UnavailableError, UnsupportedError)
from host.inference import InferenceRequest, InferenceResponse, Tensor
from host.options import ServerOptions
from host.plugins import get_plugin_manager, hookimpl

EVENTS: list[str] = []
BARRIERS: dict[str, threading.Barrier] = {}
GATES: dict[str, threading.Event] = {}


class RecInstance(Instance):
    def __init__(self, model: "RecModel", spec) -> None:
        self.model, self.spec, self.active = model, spec, 0
        self.max_active = 0
        self.batches: list[int] = []

    def initialize(self) -> None:
        self.model.fail("instance_initialize", self.spec.name)
        EVENTS.append(f"instance_initialize {self.spec.name}")

    def execute(self, requests):
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            self.batches.append(len(requests))
            p = self.model.spec.parameter
            if p("barrier"):
                BARRIERS[p("barrier")].wait(timeout=10)
            if p("gate"):
                GATES[p("gate")].wait(timeout=10)
            time.sleep(int(p("sleep_ms", "0")) / 1000)
            if self.model.spec.decoupled:
                threading.Thread(target=self._stream, args=(requests,)).start()
                return None
            return [self._answer(r) for r in requests]
        finally:
            self.active -= 1

    def _answer(self, request: InferenceRequest) -> InferenceResponse:
        x = request.inputs["IN"].data
        return InferenceResponse(outputs=[
            Tensor("OUT", "INT32", list(x.shape), x + 1),
            Tensor("ROWS", "INT32", [1], np.array([len(self.batches)], dtype=np.int32))])

    @staticmethod
    def _stream(requests) -> None:
        for r in requests:
            n = int(r.inputs["IN"].data.reshape(-1)[0])
            for i in range(n):
                r.respond(InferenceResponse(outputs=[
                    Tensor("OUT", "INT32", [1], np.array([i], dtype=np.int32))]), False)
            r.respond(None, True)

    def finalize(self) -> None:
        EVENTS.append(f"instance_finalize {self.spec.name}")


class RecModel(Model):
    def fail(self, stage: str, who: str) -> None:
        if self.spec.parameter("fail_at") == stage:
            raise RuntimeError(f"{stage} failed for {who}")

    def initialize(self) -> None:
        self.fail("model_initialize", self.spec.name)
        EVENTS.append(f"model_initialize {self.spec.name} v{self.spec.version}")

    def create_instance(self, spec) -> Instance:
        return RecInstance(self, spec)

    def finalize(self) -> None:
        EVENTS.append(f"model_finalize {self.spec.name} v{self.spec.version}")


class RecBackend(Backend):
    def initialize(self) -> None:
        EVENTS.append("backend_initialize")

    def create_model(self, spec) -> Model:
        return RecModel(spec)

    def finalize(self) -> None:
        EVENTS.append("backend_finalize")


class RecPlugin:
    __name__ = "rec"

    @hookimpl
    def modelhost_register_backends(self, registry) -> None:
        registry.add_backend("rec", RecBackend)


CONFIG = """
name: "{name}"
backend: "rec"
max_batch_size: {mbs}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] }},
         {{ name: "ROWS" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
{extra}
"""


def write_model(repo: Path, name: str, versions=(1,), mbs: int = 0, count: int = 1, extra: str = "",
                params: dict[str, str] | None = None) -> Path:
    path = repo / name
    path.mkdir(parents=True, exist_ok=True)
    for v in versions:
        (path / str(v)).mkdir(exist_ok=True)
    for k, v in (params or {}).items():
        extra += f'\nparameters {{ key: "{k}" value {{ string_value: "{v}" }} }}'
    (path / "config.pbtxt").write_text(CONFIG.format(name=name, mbs=mbs, count=count, extra=extra))
    return path


def make_host(repo: Path, **opts) -> Host:
    EVENTS.clear()
    host = Host(ServerOptions(model_repositories=[repo], **opts),
                plugins=get_plugin_manager(blocked=["python"], extra=[RecPlugin()]))
    return host


def request(model: str, values, version: int = -1, shape=None) -> InferenceRequest:
    x = np.asarray(values, dtype=np.int32)
    return InferenceRequest(model_name=model, model_version=version,
                            inputs={"IN": Tensor("IN", "INT32", list(shape or x.shape), x)})


def instances(host: Host, name: str) -> list[RecInstance]:
    return [s.instance for s in host.manager.get(name)._slots]


# --- lifecycle ---------------------------------------------------------------------------------

def test_lifecycle_order_backend_shared_between_models(tmp_path):
    write_model(tmp_path, "a", count=2)
    write_model(tmp_path, "b")
    host = make_host(tmp_path, model_control_mode="explicit")
    host.start()
    host.load_model("a")
    host.load_model("b")
    assert EVENTS == ["backend_initialize", "model_initialize a v1", "instance_initialize a_0_0",
                      "instance_initialize a_0_1", "model_initialize b v1", "instance_initialize b_0_0"]
    EVENTS.clear()
    host.unload_model("a")
    assert EVENTS == ["instance_finalize a_0_1", "instance_finalize a_0_0", "model_finalize a v1"]
    EVENTS.clear()
    host.stop()
    assert EVENTS == ["instance_finalize b_0_0", "model_finalize b v1", "backend_finalize"]


@pytest.mark.parametrize("stage", ["model_initialize", "instance_initialize"])
def test_initialize_failure_leaves_model_unavailable_and_finalizes(tmp_path, stage):
    write_model(tmp_path, "bad", count=2, params={"fail_at": stage})
    write_model(tmp_path, "good")
    host = make_host(tmp_path)
    errors = host.start()
    assert f"{stage} failed for bad" in errors["bad"]
    rows = {r["name"]: r for r in host.repository_index()}
    assert rows["bad"]["state"] == "UNAVAILABLE" and f"{stage} failed" in rows["bad"]["reason"]
    assert rows["good"]["state"] == "READY"
    assert not any("bad" in e and "initialize" in e for e in EVENTS if e.startswith("instance_init"))
    if stage == "instance_initialize":  # the model object had been initialized: it is finalized
        assert "model_finalize bad v1" in EVENTS
    with pytest.raises(NotFoundError, match="has no available versions"):
        host.infer(request("bad", [1]))
    assert host.infer(request("good", [1, 2])).output("OUT").data.tolist() == [2, 3]
    host.stop()
    assert EVENTS[-1] == "backend_finalize"  # the last user unloaded


def test_exit_on_error_raises_and_unloads(tmp_path):
    write_model(tmp_path, "bad", params={"fail_at": "model_initialize"})
    write_model(tmp_path, "good")
    host = make_host(tmp_path, exit_on_error=True)
    with pytest.raises(UnavailableError, match="bad"):
        host.start()
    assert "model_finalize good v1" in EVENTS and EVENTS[-1] == "backend_finalize"


def test_unknown_backend_fails_with_clear_message(tmp_path):
    path = write_model(tmp_path, "nob")
    (path / "config.pbtxt").write_text((path / "config.pbtxt").read_text().replace('"rec"', '"nosuch"'))
    host = make_host(tmp_path)
    errors = host.start()
    assert "no plugin provides backend 'nosuch'" in errors["nob"] and "libtriton_nosuch.so" in errors["nob"]


# --- scheduling --------------------------------------------------------------------------------

def test_execute_never_concurrent_on_one_instance(tmp_path):
    write_model(tmp_path, "one", params={"sleep_ms": "5"})
    host = make_host(tmp_path)
    host.start()
    threads = [threading.Thread(target=host.infer, args=(request("one", [i]),)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (inst,) = instances(host, "one")
    assert len(inst.batches) == 16 and inst.max_active == 1
    host.stop()


def test_instances_run_in_parallel(tmp_path):
    # Both executes must be inside the barrier at once, or it times out and breaks.
    BARRIERS["two"] = threading.Barrier(2)
    write_model(tmp_path, "two", count=2, params={"barrier": "two"})
    host = make_host(tmp_path)
    host.start()
    results = []
    threads = [threading.Thread(target=lambda: results.append(host.infer(request("two", [1]))))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not BARRIERS["two"].broken and len(results) == 2
    host.stop()


def test_dynamic_batching_combines_requests_of_several_clients(tmp_path):
    write_model(tmp_path, "dyn", mbs=8, extra="dynamic_batching { preferred_batch_size: [ 4 ] "
                                               "max_queue_delay_microseconds: 500000 }")
    host = make_host(tmp_path)
    host.start()
    outs = []
    threads = [threading.Thread(target=lambda i=i: outs.append(host.infer(request("dyn", [[i, i]]))))
               for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (inst,) = instances(host, "dyn")
    assert inst.batches == [4]  # preferred size reached: one execute, long before the delay
    assert sorted(o.output("OUT").data.tolist()[0][0] for o in outs) == [1, 2, 3, 4]
    stats = host.statistics("dyn")["model_stats"][0]
    assert stats["execution_count"] == 1 and stats["inference_count"] == 4
    assert stats["batch_stats"][0]["batch_size"] == 4
    host.stop()


def _batches_of_shapes(tmp_path, monkeypatch, equal: bool, ragged: bool) -> list[int]:
    """Four queued requests, inner shapes 2, 2, 3, 2: the executes the dynamic batcher makes."""
    monkeypatch.setattr(RecBackend, "equal_shape_batches", equal)
    path = write_model(tmp_path, "shapes", mbs=8, extra="dynamic_batching { preferred_batch_size: [ 4 ] "
                                                        "max_queue_delay_microseconds: 2000000 }")
    if ragged:
        cfg = path / "config.pbtxt"
        cfg.write_text(cfg.read_text().replace("dims: [ -1 ] }} ]".replace("}}", "}"),
                                               "dims: [ -1 ] allow_ragged_batch: true } ]", 1))
    host = make_host(tmp_path)
    host.start()
    done = threading.Semaphore(0)
    for width in (2, 2, 3, 2):  # queued in this order, before the batcher takes any
        host.infer_async(request("shapes", [[7] * width]), lambda r: done.release())
    for _ in range(4):
        assert done.acquire(timeout=10)
    (inst,) = instances(host, "shapes")
    host.stop()
    return inst.batches


def test_batcher_keeps_shapes_apart_for_a_backend_that_needs_it(tmp_path, monkeypatch):
    # A batch ends at the first request of another shape (Triton's order-keeping rule).
    assert _batches_of_shapes(tmp_path, monkeypatch, equal=True, ragged=False) == [2, 1, 1]


def test_batcher_honours_allow_ragged_batch(tmp_path, monkeypatch):
    assert _batches_of_shapes(tmp_path, monkeypatch, equal=True, ragged=True) == [4]


def test_batcher_mixes_shapes_for_a_backend_that_takes_any(tmp_path, monkeypatch):
    assert _batches_of_shapes(tmp_path, monkeypatch, equal=False, ragged=False) == [4]


def test_batch_size_over_max_is_rejected(tmp_path):
    write_model(tmp_path, "b", mbs=2)
    host = make_host(tmp_path)
    host.start()
    with pytest.raises(InvalidArgumentError, match="batch-size must be <= 2"):
        host.infer(request("b", [[1], [2], [3]]))
    host.stop()


def test_decoupled_stream_and_unary_rejected(tmp_path):
    write_model(tmp_path, "dec", extra="model_transaction_policy { decoupled: true }")
    host = make_host(tmp_path)
    host.start()
    got = [r.output("OUT").data.tolist() for r in host.infer_stream(request("dec", [3]))]
    assert got == [[0], [1], [2]]
    assert list(host.infer_stream(request("dec", [0]))) == []
    with pytest.raises(UnsupportedError, match="doesn't support models with decoupled transaction policy"):
        host.infer(request("dec", [1]))
    host.stop()


def test_unload_waits_for_inflight_and_rejects_new(tmp_path):
    GATES["slow"] = threading.Event()
    write_model(tmp_path, "slow", params={"gate": "slow"})
    host = make_host(tmp_path, model_control_mode="explicit", load_models=["slow"])
    host.start()
    result = []
    t = threading.Thread(target=lambda: result.append(host.infer(request("slow", [1]))))
    mv = host.manager.get("slow")
    t.start()
    deadline = time.monotonic() + 10
    while mv.inflight < 1 and time.monotonic() < deadline:  # the request is in flight
        time.sleep(0.01)
    unloader = threading.Thread(target=host.unload_model, args=("slow",))
    unloader.start()
    deadline = time.monotonic() + 10
    while mv.state != "UNLOADING" and time.monotonic() < deadline:  # bounded wait, no fixed sleep
        time.sleep(0.01)
    time.sleep(0.1)
    assert mv.state == "UNLOADING" and unloader.is_alive(), "unload must wait for the in-flight request"
    with pytest.raises(NotFoundError, match="has no available versions"):  # as Triton
        host.infer(request("slow", [1]))
    GATES["slow"].set()
    t.join(5)
    unloader.join(5)
    assert result and result[0].output("OUT").data.tolist() == [2]
    assert "model_finalize slow v1" in EVENTS
    host.stop()


# --- versions and control modes ----------------------------------------------------------------

@pytest.mark.parametrize("policy,expected", [
    ("", ["3"]),
    ("version_policy: { latest: { num_versions: 2 } }", ["2", "3"]),
    ("version_policy: { all: {} }", ["1", "2", "3"]),
    ("version_policy: { specific: { versions: [1, 3] } }", ["1", "3"]),
])
def test_version_policies(tmp_path, policy, expected):
    write_model(tmp_path, "v", versions=(1, 2, 3), extra=policy)
    host = make_host(tmp_path)
    host.start()
    assert host.model_metadata("v")["versions"] == expected
    assert host.infer(request("v", [1])).model_version == expected[-1]
    if "1" not in expected:
        with pytest.raises(NotFoundError, match="'v' version 1 is not found"):
            host.infer(request("v", [1], version=1))
    host.stop()


def test_version_folders_as_triton_reads_them(tmp_path):
    # a specific version without a folder is skipped (Triton logs it); none at all fails the load
    write_model(tmp_path, "some", versions=(1, 3), extra="version_policy: { specific: { versions: [1, 2, 3] } }")
    write_model(tmp_path, "none", versions=(1,), extra="version_policy: { specific: { versions: [2] } }")
    write_model(tmp_path, "empty", versions=())
    write_model(tmp_path, "zeros", versions=(2,))
    (tmp_path / "zeros" / "07").mkdir()  # leading zeros: not a version folder, as in Triton
    host = make_host(tmp_path)
    host.start()
    rows = {r["name"]: r for r in host.repository_index()}
    assert host.model_metadata("some")["versions"] == ["1", "3"]
    for name in ("none", "empty"):
        assert rows[name]["state"] == "UNAVAILABLE"
        assert rows[name]["reason"].endswith(
            f"at least one version must be available under the version policy of model '{name}'")
    assert host.model_metadata("zeros")["versions"] == ["2"]
    host.stop()


def test_configuration_is_checked_before_versions_and_backend(tmp_path):
    """As Triton polls: the backend fields are completed and the configuration validated before
    version folders are looked for or a backend loaded, so its own error is the one reported."""
    (tmp_path / "bad_batch").mkdir()  # no version folder, and a configuration Triton refuses
    (tmp_path / "bad_batch" / "config.pbtxt").write_text('backend: "nowhere"\nmax_batch_size: -3\n')
    (tmp_path / "bad_pair" / "1").mkdir(parents=True)  # the backend comes from the file name
    (tmp_path / "bad_pair" / "config.pbtxt").write_text(
        'platform: "onnxruntim"\ndefault_model_filename: "model.onnx"\n')
    host = make_host(tmp_path)
    host.start()
    rows = {r["name"]: r for r in host.repository_index()}
    assert "'max_batch_size' must be non-negative value for bad_batch" in rows["bad_batch"]["reason"]
    assert "unexpected 'platform' and 'backend' pair, got:onnxruntim, onnxruntime" in rows["bad_pair"]["reason"]
    host.stop()


def test_default_model_filename_and_missing_config_autocomplete(tmp_path):
    (tmp_path / "auto" / "1").mkdir(parents=True)
    (tmp_path / "auto" / "1" / "model.py").write_text("")
    host = make_host(tmp_path)
    host.start()
    rows = {r["name"]: r for r in host.repository_index()}
    # no config.pbtxt: name and backend (python, from model.py) were filled in; python is blocked
    # here, so the load fails naming that backend
    assert "backend 'python'" in rows["auto"]["reason"]
    host.stop()


def test_explicit_mode_load_unload_and_json_override(tmp_path):
    write_model(tmp_path, "m", versions=(1, 2))
    write_model(tmp_path, "other")
    host = make_host(tmp_path, model_control_mode="explicit", load_models=["m"])
    host.start()
    assert [r.get("state") for r in host.repository_index() if r["name"] == "other"] == [None]
    assert host.model_metadata("m")["versions"] == ["2"]
    override = ('{"name": "m", "backend": "rec", "version_policy": {"all": {}}, '
                '"input": [{"name": "IN", "data_type": "TYPE_INT32", "dims": [-1]}], '
                '"output": [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [-1]}]}')
    host.load_model("m", config=override)
    assert host.model_metadata("m")["versions"] == ["1", "2"]
    host.unload_model("m")
    assert not host.model_ready("m")
    assert {r["name"]: r for r in host.repository_index()}["m"]["state"] == "UNAVAILABLE"
    with pytest.raises(InternalError, match="failed to load 'absent', failed to poll from model repository"):
        host.load_model("absent")  # Triton's poll failure
    host.stop()


def test_none_mode_rejects_load_api(tmp_path):
    write_model(tmp_path, "m")
    host = make_host(tmp_path)
    host.start()
    with pytest.raises(UnavailableError, match="not allowed if polling is enabled"):
        host.load_model("m")
    host.stop()


def test_poll_mode_adds_changes_and_removes(tmp_path):
    import shutil

    write_model(tmp_path, "p")
    host = make_host(tmp_path, model_control_mode="poll", repository_poll_secs=3600)
    host.start()
    assert host.model_ready("p") and not host.model_ready("q")
    write_model(tmp_path, "q")
    (tmp_path / "p" / "2").mkdir()
    host.manager.poll()
    assert host.model_ready("q") and host.model_metadata("p")["versions"] == ["2"]
    shutil.rmtree(tmp_path / "q")
    host.manager.poll()
    assert not host.model_ready("q") and "q" not in [r["name"] for r in host.repository_index()]
    host.stop()


def test_several_repositories_and_duplicate_names(tmp_path):
    r1, r2 = tmp_path / "r1", tmp_path / "r2"
    write_model(r1, "a")
    write_model(r2, "b")
    write_model(r2, "a")
    host = Host(ServerOptions(model_repositories=[r1, r2]),
                plugins=get_plugin_manager(blocked=["python"], extra=[RecPlugin()]))
    errors = host.start()
    assert host.model_ready("b") and "multiple model repositories" in errors["a"]
    host.stop()


# --- plugins -----------------------------------------------------------------------------------

def test_two_plugins_one_backend_name_is_an_error_naming_both():
    class Other:
        __name__ = "other"

        @hookimpl
        def modelhost_register_backends(self, registry):
            registry.add_backend("rec", RecBackend)

    with pytest.raises(AlreadyExistsError, match="'rec'.*'other'|'other'.*'rec'"):
        get_plugin_manager(blocked=["python"], extra=[RecPlugin(), Other()])


def test_broken_entry_point_is_logged_and_blocked(tmp_path, monkeypatch, caplog):
    dist = tmp_path / "broken_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[modelhost]\nbroken = no_such_module_for_modelhost\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins = get_plugin_manager()
    info = {p.name: p for p in plugins.found}
    assert info["broken"].status == "failed" and "no_such_module_for_modelhost" in info["broken"].error
    assert info["broken"].distribution == "broken-plugin" and info["broken"].version == "1.0"
    assert "python" in plugins.registry.backends  # the others still load
    assert "failed to load and is blocked" in caplog.text


def test_plugin_blocked_by_flag_and_env(monkeypatch):
    assert "python" not in get_plugin_manager(blocked=["python"]).registry.backends
    monkeypatch.setenv("MODELHOST_BLOCK_PLUGINS", "python")
    plugins = get_plugin_manager()
    assert "python" not in plugins.registry.backends
    assert {p.name: p.status for p in plugins.found}["python"] == "blocked"


def test_plugins_command_lists_versions(capsys):
    from host.cli import main

    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "python" in out and "modelhost" in out and "backend:python" in out
