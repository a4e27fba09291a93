"""Stateful models (sequence batching), with the real tritonclient against a real `modelhost serve`:
interleaved sequences over a gRPC stream and over HTTP, both strategies (batch composition read
back from the statistics), every control input form, string and integer correlation ids, the idle
timeout, the backlog, implicit state (python and a native C backend), and Triton's errors."""

from __future__ import annotations

import queue
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from host.native.testing import build_library, compiler
from host.testing import serve

pytestmark = pytest.mark.modelhost_only

ROOT = Path(__file__).resolve().parent.parent
MODELS = Path(__file__).resolve().parent / "sequence_models"
EXAMPLES = ("sequence_accumulator", "sequence_dyna_string", "sequence_implicit_state")

CONTROLS = """
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START {kind}: [ {false}, {true} ] }} ] }},
    {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END {kind}: [ {false}, {true} ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY {kind}: [ {false}, {true} ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid} }} ] }}
  ]"""

ECHO = """
backend: "python"
max_batch_size: {max_batch}
sequence_batching {{ {controls} }}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""

REPORT = """
backend: "python"
max_batch_size: {max_batch}
sequence_batching {{
  max_sequence_idle_microseconds: {idle}
  {strategy}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }}
  ]
}}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }},
         {{ name: "ROWS" data_type: TYPE_INT32 dims: [ 1 ] }},
         {{ name: "READY_ROWS" data_type: TYPE_INT32 dims: [ -1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""

STATE_FILE = """
backend: "python"
max_batch_size: 0
sequence_batching {
  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ]
            initial_state: { name: "hundred" data_type: TYPE_INT32 dims: [ 1 ]
                             data_file: "hundred.bin" } } ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

NATIVE = """
backend: "stateful"
max_batch_size: 0
sequence_batching {
  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ]
            initial_state: { name: "zero" data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } } ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "FLAGS" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "CORRID" data_type: TYPE_UINT64 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 2 } ]
"""

SINGLE_STATE = """
backend: "single_state"
max_batch_size: 0
sequence_batching {{
  state [ {{ input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ]
             use_same_buffer_for_input_output: {same} }} ]
}}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""

ITERATIVE = """
backend: "iterative"
max_batch_size: 1
model_transaction_policy {{ decoupled: true }}
sequence_batching {{ {sequence} }}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }},
         {{ name: "FLAGS" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""

PY_ITERATIVE = """
backend: "python"
max_batch_size: 0
{policy}
sequence_batching {{ iterative_sequence: true }}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""

# Decoupled: IN responses counting down, one a run, the request rescheduled until the last.
# Non-decoupled ("once"): the first run of each request is rescheduled without an answer, the
# second answers OUT = IN + runs so far; "wrong" returns a response for a rescheduled request.
PY_ITERATIVE_CODE = """
import numpy as np
import triton_python_backend_utils as pb_utils

RESCHEDULE = pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]
        self.left = {}
        self.runs = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            value = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            key = request.correlation_id()
            self.runs += 1
            if self.name == "py_iterative":
                left = self.left.get(key, value) - 1
                self.left[key] = left
                out = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([left], np.int32))])
                if left > 0:
                    request.set_release_flags(RESCHEDULE)
                    request.get_response_sender().send(out)
                else:
                    del self.left[key]
                    request.get_response_sender().send(
                        out, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            out = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value + self.runs], np.int32))])
            if key not in self.left:
                self.left[key] = 1
                request.set_release_flags(RESCHEDULE)
                responses.append(out if self.name == "py_wrong" else None)
            else:
                del self.left[key]
                responses.append(out)
        return None if self.name == "py_iterative" else responses
"""

ONNX_STATE = """
backend: "onnxruntime"
max_batch_size: 4
sequence_batching {
  control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]
  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


def _onnx_accumulator(path: Path) -> None:
    """OUTPUT = STATE_OUT = INPUT + STATE_IN * (1 - START): a graph with a control input and an
    implicit state, as Triton's ONNX sequence models have them."""
    import onnx
    from onnx import TensorProto, helper

    def tensor(name):
        return helper.make_tensor_value_info(name, TensorProto.INT32, [None, 1])

    one = helper.make_tensor("one", TensorProto.INT32, [1], [1])
    nodes = [helper.make_node("Sub", ["one", "START"], ["keep"]),
             helper.make_node("Mul", ["STATE_IN", "keep"], ["kept"]),
             helper.make_node("Add", ["INPUT", "kept"], ["OUTPUT"]),
             helper.make_node("Identity", ["OUTPUT"], ["STATE_OUT"])]
    graph = helper.make_graph(nodes, "accumulator", [tensor("INPUT"), tensor("START"), tensor("STATE_IN")],
                              [tensor("OUTPUT"), tensor("STATE_OUT")], initializer=[one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))


def _has_onnx() -> bool:
    try:
        import modelhost_onnxruntime  # noqa: F401
        import onnx  # noqa: F401
    except ImportError:
        return False
    return True


def _model(repo: Path, name: str, config: str, source: Path) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(f'name: "{name}"\n' + config)
    shutil.copy(source, repo / name / "1" / "model.py")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("sequence-repo")
    for name in EXAMPLES:
        shutil.copytree(ROOT / "model_repository" / name, repo / name)
    echo = MODELS / "echo_controls.py"
    _model(repo, "echo_int32", ECHO.format(max_batch=4, controls=CONTROLS.format(
        kind="int32_false_true", false=0, true=1, corrid="TYPE_UINT64")), echo)
    _model(repo, "echo_fp32", ECHO.format(max_batch=0, controls=CONTROLS.format(
        kind="fp32_false_true", false=0.5, true=2.5, corrid="TYPE_INT32")), echo)
    _model(repo, "echo_bool", ECHO.format(max_batch=2, controls=CONTROLS.format(
        kind="bool_false_true", false="false", true="true", corrid="TYPE_UINT32")), echo)
    _model(repo, "echo_int64", ECHO.format(max_batch=0, controls=CONTROLS.format(
        kind="int32_false_true", false=5, true=7, corrid="TYPE_INT64")), echo)
    _model(repo, "echo_string", ECHO.format(max_batch=0, controls=CONTROLS.format(
        kind="int32_false_true", false=0, true=1, corrid="TYPE_STRING")), echo)
    report = MODELS / "batch_report.py"
    # direct: 4 slots, a batch waits (up to 5 s) until every slot has a request
    _model(repo, "direct_full", REPORT.format(max_batch=4, idle=60_000_000, strategy=(
        "direct { max_queue_delay_microseconds: 5000000 minimum_slot_utilization: 1.0 }")), report)
    _model(repo, "direct_pad", REPORT.format(max_batch=4, idle=60_000_000, strategy="direct { }"),
           report)
    _model(repo, "oldest", REPORT.format(max_batch=4, idle=60_000_000, strategy=(
        "oldest { max_candidate_sequences: 8 preferred_batch_size: [ 3 ] "
        "max_queue_delay_microseconds: 5000000 }")), report)
    _model(repo, "one_slot", REPORT.format(max_batch=1, idle=60_000_000, strategy=""), report)
    _model(repo, "idle", REPORT.format(max_batch=1, idle=300_000, strategy=""), report)
    _model(repo, "state_file", STATE_FILE, ROOT / "model_repository" / "sequence_implicit_state"
           / "1" / "model.py")
    (repo / "state_file" / "initial_state").mkdir()
    (repo / "state_file" / "initial_state" / "hundred.bin").write_bytes(
        np.array([100], dtype=np.int32).tobytes())
    for name, policy in (("py_iterative", "model_transaction_policy { decoupled: true }"),
                         ("py_once", ""), ("py_wrong", "")):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\n' + PY_ITERATIVE.format(policy=policy))
        (repo / name / "1" / "model.py").write_text(PY_ITERATIVE_CODE)
    _model(repo, "cached", REPORT.format(max_batch=1, idle=1_000_000, strategy="")
           + "response_cache { enable: true }", report)
    if _has_onnx():
        (repo / "onnx_state" / "1").mkdir(parents=True)
        (repo / "onnx_state" / "config.pbtxt").write_text('name: "onnx_state"\n' + ONNX_STATE)
        _onnx_accumulator(repo / "onnx_state" / "1" / "model.onnx")
    if compiler() is not None:
        (repo / "native_state" / "1").mkdir(parents=True)
        (repo / "native_state" / "config.pbtxt").write_text('name: "native_state"\n' + NATIVE)
        build_library(Path(__file__).parent / "native" / "stateful.c",
                      repo / "native_state" / "libtriton_stateful.so")
        for name, sequence in (("iterative", "iterative_sequence: true"),
                               ("not_iterative", "direct { }")):
            (repo / name / "1").mkdir(parents=True)
            (repo / name / "config.pbtxt").write_text(
                f'name: "{name}"\n' + ITERATIVE.format(sequence=sequence))
            build_library(Path(__file__).parent / "native" / "iterative.c",
                          repo / name / "libtriton_iterative.so")
        for name, same in (("single_buffer", "true"), ("two_buffers", "false")):
            (repo / name / "1").mkdir(parents=True)
            (repo / name / "config.pbtxt").write_text(f'name: "{name}"\n' + SINGLE_STATE.format(same=same))
            build_library(Path(__file__).parent / "native" / "single_state.c",
                          repo / name / "libtriton_single_state.so")
    with serve(repo) as process:
        yield process


@pytest.fixture
def http(server):
    return httpclient.InferenceServerClient(server.url, network_timeout=60)


@pytest.fixture
def grpc(server):
    return grpcclient.InferenceServerClient(server.grpc_url)


def _input(module, value: int, batch: bool = True):
    shape = [1, 1] if batch else [1]
    tensor = module.InferInput("INPUT", shape, "INT32")
    tensor.set_data_from_numpy(np.full(shape, value, dtype=np.int32))
    return tensor


def _infer(http, model, value, sequence_id, start=False, end=False, batch=True):
    return http.infer(model, [_input(httpclient, value, batch)], sequence_id=sequence_id,
                      sequence_start=start, sequence_end=end)


def _error(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


def _batches(http, model) -> dict[int, int]:
    stats = http.get_inference_statistics(model)["model_stats"][0]
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}


# --- interleaved sequences -------------------------------------------------------------------

def test_interleaved_sequences_over_http(http):
    sums = {}
    for step in range(4):  # three sequences, one request of each in turn
        for sid in (1001, 1002, 2**64 - 1):
            r = _infer(http, "sequence_accumulator", sid % 100 + step, sid, start=step == 0,
                       end=step == 3)
            sums[sid] = sums.get(sid, 0) + sid % 100 + step
            assert r.as_numpy("OUTPUT").item() == sums[sid]
    assert sums == {1001: 10, 1002: 14, 2**64 - 1: 66}


def test_interleaved_sequences_on_one_grpc_stream(grpc):
    results: queue.SimpleQueue = queue.SimpleQueue()
    grpc.start_stream(callback=lambda result, error: results.put((result, error)))
    values = [11, 7, 5, 3, 2, 0, 1]
    for k, value in enumerate(values):
        for sid, sign in ((3001, 1), (3002, -1)):
            grpc.async_stream_infer("sequence_accumulator", [_input(grpcclient, sign * value)],
                                    request_id=f"{sid}_{k}", sequence_id=sid,
                                    sequence_start=k == 0, sequence_end=k == len(values) - 1)
    grpc.stop_stream()
    got: dict[str, list[int]] = {"3001": [], "3002": []}
    while not results.empty():
        result, error = results.get()
        assert error is None, error
        sid, k = result.get_response().id.split("_")
        got[sid].append((int(k), result.as_numpy("OUTPUT").item()))
    running = list(np.cumsum(values))
    assert [v for _, v in sorted(got["3001"])] == running
    assert [v for _, v in sorted(got["3002"])] == [-v for v in running]


def test_string_ids_over_grpc_and_http(http, grpc):
    for step, value in enumerate([4, 5, 6]):
        kwargs = dict(sequence_id="session-α", sequence_start=step == 0, sequence_end=step == 2)
        result = grpc.infer("sequence_dyna_string", [_input(grpcclient, value)], **kwargs)
        other = http.infer("sequence_dyna_string", [_input(httpclient, 10 * value)],
                           sequence_id="other", sequence_start=step == 0, sequence_end=step == 2)
        assert result.as_numpy("SEQUENCE").item() == "session-α".encode()
        assert other.as_numpy("SEQUENCE").item() == b"other"
    assert result.as_numpy("OUTPUT").item() == 15
    assert other.as_numpy("OUTPUT").item() == 150


# --- control inputs ----------------------------------------------------------------------------

@pytest.mark.parametrize("model, batch, sequence_id, dtype, false, true, corrid", [
    ("echo_int32", True, 2**40 + 3, np.int32, 0, 1, 2**40 + 3),
    ("echo_fp32", False, 2**32 + 9, np.float32, 0.5, 2.5, 9),          # INT32 keeps the low bits
    ("echo_bool", True, 2**32 + 2**31, np.bool_, False, True, 2**31),  # UINT32 likewise
    ("echo_int64", False, 2**64 - 2, np.int32, 5, 7, -2),              # two's complement
    ("echo_string", False, "abc", np.int32, 0, 1, b"abc"),
])
def test_control_inputs_in_every_form(http, model, batch, sequence_id, dtype, false, true, corrid):
    shape = (1, 1) if batch else (1,)
    seen = []
    for start, end in ((True, False), (False, False), (False, True)):
        r = _infer(http, model, 1, sequence_id, start=start, end=end, batch=batch)
        controls = {n: r.as_numpy("SEEN_" + n) for n in ("START", "END", "READY", "CORRID")}
        for name, array in controls.items():
            assert array.shape == shape, name
        assert controls["START"].dtype == dtype
        assert controls["CORRID"].item() == corrid
        assert r.as_numpy("SEEN_ID").item() == str(sequence_id).encode()  # request.correlation_id()
        seen.append((controls["START"].item(), controls["END"].item(), controls["READY"].item(),
                     int(r.as_numpy("SEEN_FLAGS").item())))
    assert seen == [(true, false, true, 1), (false, false, true, 0), (false, true, true, 2)]


# --- strategies and batch composition ------------------------------------------------------------

def _client(server) -> httpclient.InferenceServerClient:
    """A client of its own for each thread (tritonclient.http's connections are per thread)."""
    return httpclient.InferenceServerClient(server.url, network_timeout=60)


def _concurrently(calls) -> list:
    out: list = [None] * len(calls)

    def run(i, call):
        try:
            out[i] = call()
        except Exception as exc:  # reported by the assertions below
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_direct_strategy_fills_every_slot_then_runs_one_batch(server):
    for step in range(2):
        results = _concurrently([
            (lambda sid=sid: _infer(_client(server), "direct_full", sid, sid, start=step == 0,
                                    end=step == 1))
            for sid in (11, 12, 13, 14)])
        for sid, r in zip((11, 12, 13, 14), results):
            assert not isinstance(r, Exception), r
            assert r.as_numpy("ROWS").item() == 4
            assert r.as_numpy("OUTPUT").item() == sid * (step + 1)
    assert _batches(_client(server), "direct_full") == {4: 2}


def test_direct_strategy_pads_empty_slots_with_not_ready_rows(http):
    _infer(http, "direct_pad", 1, 21, start=True)   # slot 0
    _infer(http, "direct_pad", 1, 22, start=True)   # slot 1, with a padding row 0
    _infer(http, "direct_pad", 1, 21, end=True)     # slot 0 is free again
    r = _infer(http, "direct_pad", 5, 22)           # slot 1 alone: row 0 is padding
    assert r.as_numpy("READY_ROWS").tolist() == [[0, 1]]
    assert r.as_numpy("OUTPUT").item() == 6
    stats = http.get_inference_statistics("direct_pad")["model_stats"][0]
    assert _batches(http, "direct_pad") == {1: 2, 2: 2}  # padding rows count in the batch size
    assert stats["inference_count"] == 4 and stats["execution_count"] == 4


def test_oldest_strategy_batches_across_sequences(server):
    for step in range(2):
        results = _concurrently([
            (lambda sid=sid: _infer(_client(server), "oldest", step + 1, sid, start=step == 0,
                                    end=step == 1))
            for sid in ("a", "b", "c")])
        assert [r.as_numpy("ROWS").item() for r in results] == [3, 3, 3]
        assert [r.as_numpy("OUTPUT").item() for r in results] == [1 + 2 * step] * 3
    assert _batches(_client(server), "oldest") == {3: 2}


def _in_background(call) -> tuple[threading.Event, list]:
    done, out = threading.Event(), []

    def run():
        try:
            out.append(call())
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    return done, out


def test_new_sequences_wait_for_a_slot(http, server):
    _infer(http, "one_slot", 1, 31, start=True)
    done, out = _in_background(lambda: _infer(_client(server), "one_slot", 2, 32, start=True, end=True))
    assert not done.wait(0.3)  # in the backlog: the only slot belongs to sequence 31
    _infer(http, "one_slot", 1, 31, end=True)
    assert done.wait(30)
    assert out[0].as_numpy("OUTPUT").item() == 2


def test_idle_sequence_is_released_and_then_refused(http, server):
    _infer(http, "idle", 1, 41, start=True)   # and the client goes away
    other = _client(server)
    # the only slot is taken: this waits until the idle timeout (0.3 s) frees it
    assert _infer(other, "idle", 3, 42, start=True, end=True).as_numpy("OUTPUT").item() == 3
    error = _error(lambda: _infer(http, "idle", 1, 41))
    assert error.status() == "400"
    assert error.message() == ("inference request for sequence 41 to model 'idle' must specify "
                               "the START flag on the first request of the sequence")


def test_a_stream_closed_mid_sequence_frees_its_slot(grpc, http):
    grpc.start_stream(callback=lambda result, error: None)
    grpc.async_stream_infer("idle", [_input(grpcclient, 1)], sequence_id=43, sequence_start=True)
    grpc.stop_stream(cancel_requests=True)  # gone without its END
    # the only slot frees after the idle timeout, and the next sequence runs in it
    assert _infer(http, "idle", 5, 44, start=True, end=True).as_numpy("OUTPUT").item() == 5
    assert "43" in _error(lambda: _infer(http, "idle", 1, 43)).message()


# --- implicit state ----------------------------------------------------------------------------

def test_python_implicit_state_is_carried_and_reset_at_start(http, grpc):
    def send(value, sid, **flags):
        r = http.infer("sequence_implicit_state", [_input(httpclient, value, False)],
                       sequence_id=sid, **flags)
        assert [o["name"] for o in r.get_response()["outputs"]] == ["OUTPUT"]  # state stays inside
        return r.as_numpy("OUTPUT").item()

    assert [send(5, 51, sequence_start=True), send(6, 51), send(7, 51)] == [5, 11, 18]
    assert send(1, 52, sequence_start=True) == 1  # another sequence starts from zeros
    assert send(2, 51, sequence_start=True) == 2  # START again: back to the initial state
    assert send(3, 51, sequence_end=True) == 5


def test_initial_state_from_a_file_and_the_state_as_a_debug_output(http):
    first = _infer(http, "state_file", 1, 61, start=True, batch=False)
    second = _infer(http, "state_file", 2, 61, end=True, batch=False)
    assert first.as_numpy("OUTPUT").item() == 101
    assert second.as_numpy("OUTPUT").item() == 103
    assert second.as_numpy("STATE_OUT").item() == 103  # listed as an output: the client may read it


@pytest.mark.skipif(not _has_onnx(), reason="needs onnx and the onnxruntime plugin")
def test_onnx_model_with_control_input_and_implicit_state(grpc, http, server):
    # The load's reason and the server's log, should the model not have loaded (a CI run once
    # found it UNAVAILABLE with neither in sight).
    entry = {m["name"]: m for m in http.get_model_repository_index()}["onnx_state"]
    assert entry.get("state") == "READY", f"{entry}\n{server.log_text()[-6000:]}"

    def send(value, sid, start=False, end=False):
        r = grpc.infer("onnx_state", [_input(grpcclient, value)], sequence_id=sid,
                       sequence_start=start, sequence_end=end)
        assert [o.name for o in r.get_response().outputs] == ["OUTPUT"]
        return r.as_numpy("OUTPUT").item()

    assert [send(3, 91, start=True), send(4, 91), send(5, 91, end=True)] == [3, 7, 12]
    assert [send(1, 91, start=True), send(1, 91, end=True)] == [1, 2]


@pytest.mark.skipif(compiler() is None, reason="no C compiler to build the stateful backend")
def test_native_backend_state_flags_and_correlation_ids(http, grpc):
    def send(value, sid, start=False, end=False):
        r = grpc.infer("native_state", [_input(grpcclient, value, False)], sequence_id=sid,
                       sequence_start=start, sequence_end=end)
        return [r.as_numpy(n).item() for n in ("OUTPUT", "FLAGS", "CORRID")]

    assert send(5, 71, start=True) == [5, 1, 71]
    assert send(6, "seventy-two", start=True) == [6, 1, 1_000_000 + len("seventy-two")]
    assert send(7, 71) == [12, 0, 71]
    assert send(8, 71, end=True) == [20, 2, 71]
    assert send(1, "seventy-two", end=True) == [7, 2, 1_000_000 + len("seventy-two")]
    send(3, 73, start=True)
    error = _error(lambda: send(-1, 73))
    assert "state 'NO_SUCH_STATE' is not a valid state name." in error.message()


@pytest.mark.skipif(compiler() is None, reason="no C compiler to build the single_state backend")
def test_a_single_state_buffer_is_written_in_place_and_read_back_as_the_next_input(grpc):
    """use_same_buffer_for_input_output: the backend writes the next state into the buffer
    TRITONBACKEND_StateBuffer gives, without StateUpdate, and finds it as the next STATE_IN (the
    same memory, as Triton's single_state_buffer QA model checks)."""
    def send(model, value, sid, start=False, end=False):
        return grpc.infer(model, [_input(grpcclient, value, False)], sequence_id=sid,
                          sequence_start=start, sequence_end=end).as_numpy("OUTPUT").item()

    assert [send("single_buffer", v, 81, start=v == 1, end=v == 4) for v in (1, 2, 3, 4)] == [1, 3, 6, 10]
    assert [send("single_buffer", v, 82, start=v == 5, end=v == 6) for v in (5, 6)] == [5, 11]
    # Without it the state is a copy: the buffer is not the next input (and, with no StateUpdate
    # call, the value is not carried either).
    send("two_buffers", 1, 83, start=True)
    error = _error(lambda: send("two_buffers", 2, 83, end=True))
    assert error.message() == "Input and output state are using different buffers."


def _stream(grpc, model, requests):
    """Send `requests` (request id -> INPUT value, and sequence kwargs) on one gRPC stream; the
    responses of each request, (OUTPUT, FLAGS, final) in order, or its error text."""
    results: queue.Queue = queue.Queue()
    grpc.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for request_id, (value, kwargs) in requests.items():
            grpc.async_stream_infer(model, [_input(grpcclient, value)], request_id=request_id,
                                    enable_empty_final_response=True, **kwargs)
        got: dict[str, list] = {r: [] for r in requests}
        finished = set()
        while len(finished) < len(requests):
            result, error = results.get(timeout=30)
            if error is not None:
                request_id = next(r for r in requests if r not in finished)
                got[request_id] = error.message()
                finished.add(request_id)
                continue
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param
            got[response.id].append((int(result.as_numpy("OUTPUT").item()),
                                     int(result.as_numpy("FLAGS").item()), final))
            if final:
                finished.add(response.id)
        return got
    finally:
        grpc.stop_stream()


@pytest.mark.skipif(compiler() is None, reason="no C compiler to build the iterative backend")
def test_iterative_sequences_run_a_request_again_until_its_backend_is_done(grpc):
    """iterative_sequence: a request without a correlation id starts a sequence of its own; its
    backend releases it with RESCHEDULE and it runs again (neither START nor END), one response
    a run, until the final one. Two requests on one stream, with one batch slot: the second
    waits in the backlog until the first sequence ends."""
    got = _stream(grpc, "iterative", {"a": (3, {}), "b": (2, {})})
    for request_id, runs in (("a", 3), ("b", 2)):
        responses = got[request_id]
        assert [(out % 1000, flags, final) for out, flags, final in responses] == \
            [(runs - 1 - k, 1 if k == 0 else 0, k == runs - 1) for k in range(runs)]
        assert len({out // 1000 for out, _, _ in responses}) == 1  # one correlation id a request
    assert got["a"][0][0] // 1000 != got["b"][0][0] // 1000 > 0
    # the slots are free again: a third request runs at once
    assert [out % 1000 for out, _, _ in _stream(grpc, "iterative", {"c": (1, {})})["c"]] == [0]


@pytest.mark.skipif(compiler() is None, reason="no C compiler to build the iterative backend")
def test_rescheduling_a_request_of_a_model_that_is_not_iterative_is_tritons_error(grpc):
    got = _stream(grpc, "not_iterative", {"x": (2, dict(sequence_id=61, sequence_start=True,
                                                        sequence_end=True))})
    assert got["x"] == ("Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while "
                        "the model is not configured to handle such a flag.")


def test_python_models_reschedule_requests_of_iterative_sequences(grpc, http):
    """pb_utils request.set_release_flags(RESCHEDULE), as Triton's python backend: a decoupled
    model answers a run at a time; a non-decoupled one returns None for the rescheduled request
    and answers on a later run; returning a response for it is Triton's error."""
    results: queue.Queue = queue.Queue()
    grpc.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        value = grpcclient.InferInput("IN", [1], "INT32")
        value.set_data_from_numpy(np.array([3], dtype=np.int32))
        grpc.async_stream_infer("py_iterative", [value])
        got = []
        for _ in range(3):
            result, error = results.get(timeout=30)
            assert error is None, error
            got.append(int(result.as_numpy("OUT")[0]))
        assert got == [2, 1, 0]
    finally:
        grpc.stop_stream()
    value = httpclient.InferInput("IN", [1], "INT32")
    value.set_data_from_numpy(np.array([10], dtype=np.int32))
    runs = [int(http.infer("py_once", [value]).as_numpy("OUT")[0]) - 10 for _ in range(2)]
    assert runs == [2, 4]  # answered on each request's second run
    error = _error(lambda: http.infer("py_wrong", [value]))
    assert "Expected a None object in the execute function return list for reschduled request" \
        in error.message()


def test_the_response_cache_is_refused_for_sequence_models(http):
    reasons = {m["name"]: m.get("reason", "") for m in http.get_model_repository_index()}
    # Triton refuses it when it polls the repository (ValidateModelConfig), with this text.
    assert reasons["cached"].endswith(
        "Response Cache does not currently support model cached with sequence batching "
        "scheduler. Please disable the response cache.")


# --- errors ------------------------------------------------------------------------------------

def test_triton_errors_for_bad_sequence_requests(http, grpc):
    cases = [
        (dict(), "inference request to model 'sequence_accumulator' must specify a non-zero or "
                 "non-empty correlation ID"),
        (dict(sequence_id=0, sequence_start=True),
         "inference request to model 'sequence_accumulator' must specify a non-zero or non-empty "
         "correlation ID"),
        (dict(sequence_id=81), "inference request for sequence 81 to model 'sequence_accumulator' "
                               "must specify the START flag on the first request of the sequence"),
        (dict(sequence_id="x", sequence_start=True),
         "[request id: <id_unknown>] sequence batching control 'CORRID' data-type is 'BYTES', but "
         "model 'sequence_accumulator' expects 'UINT64'"),
    ]
    def counts():
        stats = http.get_inference_statistics("sequence_accumulator")["model_stats"][0]
        return {k: stats["inference_stats"][k]["count"] for k in ("success", "fail", "queue")}

    before = counts()
    for kwargs, message in cases:
        for module, client in ((httpclient, http), (grpcclient, grpc)):
            error = _error(lambda: client.infer("sequence_accumulator", [_input(module, 1)],
                                                **kwargs))
            assert error.message() == message
            assert error.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    error = _error(lambda: http.infer("sequence_dyna_string", [_input(httpclient, 1)],
                                      sequence_id=5, sequence_start=True, request_id="r1"))
    assert error.message() == ("[request id: r1] sequence batching control 'CORRID' data-type is "
                               "'UINT64', but model 'sequence_dyna_string' expects 'BYTES'")
    two = httpclient.InferInput("INPUT", [2, 1], "INT32")
    two.set_data_from_numpy(np.ones((2, 1), dtype=np.int32))
    error = _error(lambda: http.infer("sequence_accumulator", [two], sequence_id=82,
                                      sequence_start=True))
    assert error.message() == ("inference request to model 'sequence_accumulator' must specify "
                               "batch-size 1 due to requirements of sequence batcher")
    # Refused by the sequence batcher, they never were the model's requests: as in Triton, they
    # count neither as failures nor as successes.
    assert counts() == before
    error = _error(lambda: http.infer("sequence_dyna_string", [_input(httpclient, 1)],
                                      sequence_id="x" * 129, sequence_start=True))
    assert error.message() == "string correlation ID cannot be longer than 128 characters"
    # and the server keeps serving
    assert _infer(http, "sequence_accumulator", 4, 83, start=True, end=True).as_numpy(
        "OUTPUT").item() == 4


# --- implicit state: Triton's load-time checks of `initial_state` -------------------------------

@pytest.mark.parametrize("state, message", [
    ('initial_state: [ { name: "a" data_type: TYPE_INT32 dims: [ 1 ] zero_data: true }, '
     '{ name: "b" data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } ]',
     "initial_state field for state input 'S_IN' must contain exactly one or zero element. "
     "Found '2' elements."),
    ('initial_state: { name: "a" data_type: TYPE_FP32 dims: [ 1 ] zero_data: true }',
     "The data type used for 'initial_state' field of state 'S_IN' does not match the state "
     "data type."),
    ('initial_state: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true }',
     "Field 'name' must be set when using initial_state for state input 'S_IN'."),
    ('initial_state: { name: "a" data_type: TYPE_INT32 dims: [ 1, 1 ] zero_data: true }',
     "Number of dimensions in 'initial_state' doesn't match the size of 'state' dimensions for "
     "state input 'S_IN'. 2 != 1"),
    ('initial_state: { name: "a" data_type: TYPE_INT32 dims: [ -1 ] zero_data: true }',
     "'initial_state' field for state input name 'S_IN' contains variable dimensions."),
    ('initial_state: { name: "a" data_type: TYPE_INT32 dims: [ 3 ] data_file: "two_ints" }',
     "initial_state setting expects 12 bytes, but the data provided from two_intsonly has 8 "
     "bytes."),
    ('initial_state: { name: "a" data_type: TYPE_INT32 dims: [ 3 ] }',
     "initial_state setting expects state'S_IN' to have state_data set"),
])
def test_initial_state_checks(tmp_path, state, message):
    from google.protobuf import text_format

    from host.errors import InvalidArgumentError
    from host.proto.model_config_pb2 import ModelConfig
    from host.sequence.state import StateSpecs

    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "two_ints").write_bytes(np.array([1, 2], np.int32).tobytes())
    config = text_format.Parse(
        'name: "m" max_batch_size: 0 sequence_batching { state [ { input_name: "S_IN" '
        f'output_name: "S_OUT" data_type: TYPE_INT32 dims: [ -1 ] {state} }} ] }}', ModelConfig())
    with pytest.raises(InvalidArgumentError) as info:
        StateSpecs(config, tmp_path)
    assert str(info.value) == message


def test_initial_state_shapes(tmp_path):
    from google.protobuf import text_format

    from host.proto.model_config_pb2 import ModelConfig
    from host.sequence.state import StateSpecs

    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "f").write_bytes(np.arange(6, dtype=np.float32).tobytes())
    config = text_format.Parse(
        'name: "m" max_batch_size: 4 sequence_batching { state [ '
        '{ input_name: "A" output_name: "A_OUT" data_type: TYPE_FP32 dims: [ -1, 3 ] '
        '  initial_state: { name: "f" data_type: TYPE_FP32 dims: [ 2, 3 ] data_file: "f" } }, '
        '{ input_name: "B" output_name: "B_OUT" data_type: TYPE_INT64 dims: [ -1, 2 ] } ] }',
        ModelConfig())
    states = StateSpecs(config, tmp_path).new()
    inputs: dict = {}
    states.add_to(inputs)
    assert inputs["A"].shape == [1, 2, 3] and inputs["A"].data.tolist() == [[[0, 1, 2], [3, 4, 5]]]
    assert inputs["B"].shape == [1, 1, 2] and inputs["B"].data.dtype == np.int64
    assert not inputs["B"].data.any()  # no initial_state: zeros, variable dims as 1


# --- Triton's scheduler testing hooks ------------------------------------------------------------

def test_triton_delay_scheduler_hook_holds_batches_until_enough_requests_are_queued(tmp_path):
    """TRITONSERVER_DELAY_SCHEDULER=N (Triton's QA sets it to see known batches): the sequence
    batcher and the dynamic batcher form no batch until N requests are queued, once."""
    for name in ("sequence_accumulator", "batched_add"):
        shutil.copytree(ROOT / "model_repository" / name, tmp_path / name)
    with serve(tmp_path, env={"TRITONSERVER_DELAY_SCHEDULER": "3"}) as server:
        http = httpclient.InferenceServerClient(server.url, concurrency=3, network_timeout=60)
        x = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        x.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
        pending = [http.async_infer("batched_add", [x]) for _ in range(3)]
        assert [int(p.get_result().as_numpy("BATCH").item()) for p in pending] == [3, 3, 3]
        pending = [http.async_infer("sequence_accumulator", [_input(httpclient, k + 1)],
                                    sequence_id=300 + k, sequence_start=True)
                   for k in range(3)]
        assert sorted(int(p.get_result().as_numpy("OUTPUT").item()) for p in pending) == [1, 2, 3]
        assert _batches(http, "sequence_accumulator") == {3: 1}  # the three in one execute
        http.close()


# --- requests that arrive together share an execute (host.scheduler.defer) ------------------

BLS_TO_SEQUENCE = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().reshape(1, 1)
            # a sequence of two: the second request continues it (no new slot to assign)
            for flags in (pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
                          pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END):
                called = pb_utils.InferenceRequest(
                    model_name="direct_pad", inputs=[pb_utils.Tensor("INPUT", x)],
                    requested_output_names=["OUTPUT"], correlation_id=int(x.item()) + 500,
                    flags=flags).exec()
                if called.has_error():
                    raise pb_utils.TritonModelException(called.error().message())
            y = pb_utils.get_output_tensor_by_name(called, "OUTPUT").as_numpy().reshape(1)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", y)]))
        return out
'''


def test_a_round_of_requests_deferred_by_an_event_loop_shares_one_execute(tmp_path):
    """The gRPC pollers' rule, in process: a sequence request submitted by a thread that reads
    events (and does not wait for the answer) runs at the end of the thread's round, with the
    requests of the other slots that came in the same round: one execute, no padding rows."""
    from host import scheduler
    from host.core import Host
    from host.inference import InferenceRequest, Tensor
    from host.options import ServerOptions

    _model(tmp_path, "direct_pad", REPORT.format(max_batch=4, idle=60_000_000, strategy="direct { }"),
           MODELS / "batch_report.py")
    host = Host(ServerOptions(model_repositories=[tmp_path]))
    host.start()
    try:
        def request(sid: int, value: int, start: bool, end: bool) -> InferenceRequest:
            return InferenceRequest("direct_pad", inputs={"INPUT": Tensor(
                "INPUT", "INT32", [1, 1], np.full((1, 1), value, np.int32))},
                sequence_id=sid, sequence_start=start, sequence_end=end)

        def out(response, name):
            return next(t.data for t in response.outputs if t.name == name)

        answers: list = []

        def event_loop() -> None:
            runs = scheduler.open_deferral()
            for step in range(2):
                for sid in (1, 2, 3, 4):
                    host.infer_async(request(sid, sid * 10, step == 0, step == 1), answers.append)
                answers.append(f"round {step} read")  # nothing ran yet
                scheduler.run_deferred(runs)

        thread = threading.Thread(target=event_loop)
        thread.start()
        thread.join(30)
        assert not thread.is_alive()
        for step in range(2):
            round_ = answers[step * 5:(step + 1) * 5]
            assert round_[0] == f"round {step} read"
            assert [out(r, "ROWS").item() for r in round_[1:]] == [4] * 4
            assert [out(r, "READY_ROWS").tolist() for r in round_[1:]] == [[[1, 1, 1, 1]]] * 4
            assert [out(r, "OUTPUT").item() for r in round_[1:]] == [
                sid * 10 * (step + 1) for sid in (1, 2, 3, 4)]
        stats = host.statistics("direct_pad")["model_stats"][0]
        assert stats["inference_count"] == 8 and stats["execution_count"] == 2
        # A thread that waits for its answer (Host.infer, a BLS call) never defers.
        runs = scheduler.open_deferral()
        try:
            r = host.infer(request(9, 5, True, True))
            assert out(r, "OUTPUT").item() == 5 and not runs
        finally:
            scheduler._deferral.runs = None
    finally:
        host.stop()


def test_a_bls_call_to_a_sequence_model_from_a_grpc_poller_is_not_deferred(tmp_path):
    """A python model run by a gRPC polling thread (no batching: in place) that calls a sequence
    model through BLS and waits for it: the call runs at once, it is not left for the end of the
    poller's round (which would never come while the poller waits)."""
    _model(tmp_path, "direct_pad", REPORT.format(max_batch=4, idle=60_000_000, strategy="direct { }"),
           MODELS / "batch_report.py")
    (tmp_path / "bls_seq" / "1").mkdir(parents=True)
    (tmp_path / "bls_seq" / "1" / "model.py").write_text(BLS_TO_SEQUENCE)
    (tmp_path / "bls_seq" / "config.pbtxt").write_text(
        'name: "bls_seq"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n')
    with serve(tmp_path) as process:
        client = grpcclient.InferenceServerClient(process.grpc_url)
        for value in (3, 4):
            tensor = grpcclient.InferInput("INPUT", [1], "INT32")
            tensor.set_data_from_numpy(np.array([value], np.int32))
            result = client.infer("bls_seq", [tensor], client_timeout=20)
            assert result.as_numpy("OUTPUT").tolist() == [2 * value]
