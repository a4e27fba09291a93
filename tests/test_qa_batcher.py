"""Dynamic batching that Triton's QA tests check (server repo qa/L0_batcher, qa/L0_batch_input).

Each test reproduces, with small models of its own, one thing a QA test found modelhost doing
differently from Triton (checked against Triton 2.51 or the sources of Triton's backend utilities,
BackendInputCollector and BackendOutputResponder):
- L0_batch_input: `batch_input` and `batch_output` were refused at load. Now an ONNX or
  TorchScript model gets
  its ragged input as one flat vector of every request's elements, its batch inputs
  (BATCH_ELEMENT_COUNT, BATCH_ACCUMULATED_ELEMENT_COUNT(_WITH_ZERO),
  BATCH_MAX_ELEMENT_COUNT_AS_SHAPE, BATCH_ITEM_SHAPE(_FLATTEN)) as more model inputs, and a
  BATCH_SCATTER_WITH_INPUT_SHAPE output is cut by each request's input shape. A python model
  with batch inputs loads, and its requests hold only the client's inputs (Triton 2.51: the same).
- L0_infer_reshape / L0_infer_variable: a TorchScript model with TYPE_STRING inputs and outputs
  was refused at load; as Triton's libtorch backend, it now gets each BYTES input as a
  `List[str]` (every element, flat) and a `List[str]` output is a 1-D BYTES tensor of the
  list's length (an output `reshape` applies to it).
- L0_batcher (preserve_ordering): `dynamic_batching { preserve_ordering: true }` with two
  instances was refused at load; responses now leave in the order their requests were taken.
- L0_batcher (verify_timestamps.py): the trace of a request a native backend answers from inside
  its execute had no COMPUTE_* timestamps (the trace was written at the response, before the
  execute's stamps); now it has them, in Triton's order.

TRITONSERVER_DELAY_SCHEDULER=4 holds each dynamic batcher's first batch until four requests are
queued (Triton's testing hook), so that the four requests of a test form one batch.
"""

from __future__ import annotations

import json
import queue
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from host.native.testing import build_library, compiler
from host.testing import ServerProcess, serve, wait_until

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

pytestmark = pytest.mark.modelhost_only

SOURCES = Path(__file__).resolve().parent / "native"
FP32 = TensorProto.FLOAT


def _value(name: str, rank: int) -> Any:
    return helper.make_tensor_value_info(name, FP32, [None] * rank)


def _const(name: str, values: list[int]) -> Any:
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(
        name + "_value", TensorProto.INT64, [len(values)], values))


def _ragged_graph() -> Any:
    """RAGGED_OUTPUT = RAGGED_INPUT (flat); each other <X>_OUTPUT is the batch input <X> as a row,
    repeated once per request (rows = BATCH_ELEMENT_COUNT's length), so that each response
    gets the whole batch input (as Triton's QA model onnx_batch_input does)."""
    nodes = [
        _const("row", [1, -1]), _const("column", [-1, 1]),
        helper.make_node("Identity", ["RAGGED_INPUT"], ["RAGGED_OUTPUT"]),
        # ones: [requests, 1], from the element counts (all > 0)
        helper.make_node("Div", ["COUNT", "COUNT"], ["ones_flat"]),
        helper.make_node("Reshape", ["ones_flat", "column"], ["ones"]),
    ]
    for name in ("COUNT", "ACC", "ACC_ZERO", "MAX"):
        nodes += [helper.make_node("Reshape", [name, "row"], [name + "_row"]),
                  helper.make_node("MatMul", ["ones", name + "_row"], [name + "_OUTPUT"])]
    return helper.make_graph(
        nodes, "ragged",
        [_value(n, 1) for n in ("RAGGED_INPUT", "COUNT", "ACC", "ACC_ZERO", "MAX")],
        [_value("RAGGED_OUTPUT", 1)] + [_value(n + "_OUTPUT", 2)
                                         for n in ("COUNT", "ACC", "ACC_ZERO", "MAX")])


def _item_graph() -> Any:
    """ITEM_OUTPUT = ITEM (BATCH_ITEM_SHAPE: one row per batch item); FLAT_OUTPUT = FLAT as a row
    repeated per batch item."""
    nodes = [
        _const("row", [1, -1]),
        helper.make_node("Identity", ["ITEM"], ["ITEM_OUTPUT"]),
        # ones: [items, 1], from ITEM's first column (every dimension > 0)
        helper.make_node("Div", ["ITEM", "ITEM"], ["ones_all"]),
        helper.make_node("Slice", ["ones_all", "zero", "one", "one"], ["ones"]),
        _const("zero", [0]), _const("one", [1]),
        helper.make_node("Reshape", ["FLAT", "row"], ["FLAT_row"]),
        helper.make_node("MatMul", ["ones", "FLAT_row"], ["FLAT_OUTPUT"]),
    ]
    return helper.make_graph(
        nodes, "item", [_value("RAGGED_INPUT", 1), _value("ITEM", 2), _value("FLAT", 1)],
        [_value("ITEM_OUTPUT", 2), _value("FLAT_OUTPUT", 2)])


def _save(graph: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))


TORCH_CONFIG = """
backend: "pytorch"
max_batch_size: 4
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ -1 ] } ]
batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "INPUT__1"
                data_type: TYPE_FP32 source_input: "INPUT__0" } ]
batch_output [ { target_name: "OUTPUT__0" kind: BATCH_SCATTER_WITH_INPUT_SHAPE
                 source_input: "INPUT__0" } ]
dynamic_batching { max_queue_delay_microseconds: 10000000 }
"""


def _save_torch(path: Path) -> bool:
    """A TorchScript model: OUTPUT__0 = the flat ragged input (scattered back by input shape),
    OUTPUT__1 = the accumulated counts as a row per request. False without torch."""
    try:
        import torch
    except ImportError:
        return False

    class Ragged(torch.nn.Module):
        def forward(self, ragged: torch.Tensor, acc: torch.Tensor):
            return ragged * 2, acc.reshape(1, -1).repeat(acc.shape[0] - 1, 1)

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.script(Ragged()).save(str(path))
    return True


def _save_torch_strings(path: Path) -> None:
    """OUTPUT__0: each string upper-cased; OUTPUT__1: the strings in reverse order."""
    import torch

    class Strings(torch.nn.Module):
        def forward(self, strings: list[str]) -> tuple[list[str], list[str]]:
            return [s.upper() for s in strings], strings[::-1]

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.script(Strings()).save(str(path))


TORCH_STRINGS_CONFIG = """
backend: "pytorch"
max_batch_size: 0
input [ { name: "INPUT__0" data_type: TYPE_STRING dims: [ 2, 2 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_STRING dims: [ 2, 2 ] },
         { name: "OUTPUT__1" data_type: TYPE_STRING dims: [ -1 ] } ]
"""


def _batch_input(kind: str, target: str) -> str:
    return (f'{{ kind: {kind} target_name: "{target}" data_type: TYPE_FP32 '
            'source_input: "RAGGED_INPUT" }')


RAGGED_CONFIG = f"""
backend: "onnxruntime"
max_batch_size: 4
input [ {{ name: "RAGGED_INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }} ]
output [
  {{ name: "RAGGED_OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "COUNT_OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "ACC_OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "ACC_ZERO_OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "MAX_OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] }}
]
batch_input [
  {_batch_input("BATCH_ELEMENT_COUNT", "COUNT")},
  {_batch_input("BATCH_ACCUMULATED_ELEMENT_COUNT", "ACC")},
  {_batch_input("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "ACC_ZERO")},
  {_batch_input("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", "MAX")}
]
batch_output [ {{ target_name: "RAGGED_OUTPUT" kind: BATCH_SCATTER_WITH_INPUT_SHAPE
                  source_input: "RAGGED_INPUT" }} ]
dynamic_batching {{ max_queue_delay_microseconds: 10000000 }}
"""

ITEM_CONFIG = f"""
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "RAGGED_INPUT" data_type: TYPE_FP32 dims: [ -1, -1 ] allow_ragged_batch: true }} ]
output [
  {{ name: "ITEM_OUTPUT" data_type: TYPE_FP32 dims: [ 2 ] }},
  {{ name: "FLAT_OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] }}
]
batch_input [
  {_batch_input("BATCH_ITEM_SHAPE", "ITEM")},
  {_batch_input("BATCH_ITEM_SHAPE_FLATTEN", "FLAT")}
]
dynamic_batching {{ max_queue_delay_microseconds: 10000000 }}
"""

# Prints (to a file named by its "log" parameter) the inputs of each request it gets.
PYTHON_RAGGED = """
import json
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.log = config["parameters"]["log"]["string_value"]

    def execute(self, requests):
        seen = [sorted(t.name() for t in r.inputs()) for r in requests]
        with open(self.log, "a") as f:
            f.write(json.dumps(seen) + "\\n")
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", pb_utils.get_input_tensor_by_name(r, "RAGGED_INPUT").as_numpy())])
            for r in requests]
"""

# Waits as long as its input says (in seconds) before it answers with its input; marks the
# start of each request's execute with a file named after the request, in its "dir" parameter.
SLEEPY = """
import json, pathlib, time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.dir = json.loads(args["model_config"])["parameters"]["dir"]["string_value"]

    def execute(self, requests):
        responses = []
        for r in requests:
            pathlib.Path(self.dir, r.request_id()).touch()
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            time.sleep(float(x.reshape(-1)[0]))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
        return responses
"""

SLEEPY_CONFIG = """
backend: "python"
max_batch_size: 1
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 2 } ]
parameters { key: "dir" value: { string_value: "%s" } }
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    root = tmp_path_factory.mktemp("qa-batcher")
    repo, logs = root / "models", root / "logs"
    logs.mkdir()

    def model(name: str, config: str, files: dict[str, str] | None = None) -> Path:
        folder = repo / name
        (folder / "1").mkdir(parents=True)
        (folder / "config.pbtxt").write_text(f'name: "{name}"\n' + textwrap.dedent(config))
        for relative, text in (files or {}).items():
            (folder / relative).write_text(text)
        return folder

    _save(_ragged_graph(), model("ragged", RAGGED_CONFIG) / "1" / "model.onnx")
    _save(_item_graph(), model("item", ITEM_CONFIG) / "1" / "model.onnx")
    if _save_torch(model("torch_ragged", TORCH_CONFIG) / "1" / "model.pt"):
        _save_torch_strings(model("torch_strings", TORCH_STRINGS_CONFIG) / "1" / "model.pt")
    else:
        (repo / "torch_ragged").rename(root / "torch_ragged")  # no torch: no model
    model("python_ragged", RAGGED_CONFIG.replace('backend: "onnxruntime"', 'backend: "python"')
          .replace("output [", 'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] },', 1)
          .replace('target_name: "RAGGED_OUTPUT"', 'target_name: "OUT"')
          + f'parameters {{ key: "log" value: {{ string_value: "{logs / "python.log"}" }} }}\n',
          {"1/model.py": PYTHON_RAGGED})
    for name, extra in (("ordered", "preserve_ordering: true"), ("unordered", "")):
        (logs / name).mkdir()
        model(name, SLEEPY_CONFIG % (logs / name) + f"dynamic_batching {{ {extra} }}\n",
              {"1/model.py": SLEEPY})
    with serve(repo, env={"TRITONSERVER_DELAY_SCHEDULER": "4"}) as server:
        yield server, logs


def _stream_four(server: ServerProcess, model: str, arrays: list[np.ndarray],
                 outputs: list[str]) -> list[dict[str, np.ndarray]]:
    """Send the arrays as four RAGGED_INPUT requests on one stream (one batch: the delay hook),
    and return each response's outputs, by request."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    try:
        for i, array in enumerate(arrays):
            tensor = grpcclient.InferInput("RAGGED_INPUT", list(array.shape), "FP32")
            tensor.set_data_from_numpy(array)
            client.async_stream_infer(model, [tensor], request_id=str(i),
                                      outputs=[grpcclient.InferRequestedOutput(o) for o in outputs])
        by_id = {}
        for _ in arrays:
            result = answers.get(timeout=30)
            assert not isinstance(result, Exception), result
            by_id[int(result.get_response().id)] = {o: result.as_numpy(o) for o in outputs}
    finally:
        client.stop_stream()
    return [by_id[i] for i in range(len(arrays))]


def test_ragged_input_batch_inputs_and_scatter_output(served):
    server, _ = served
    sizes = [2, 4, 1, 3]
    arrays = [np.full([1, n], n, np.float32) for n in sizes]
    results = _stream_four(server, "ragged", arrays, [
        "RAGGED_OUTPUT", "COUNT_OUTPUT", "ACC_OUTPUT", "ACC_ZERO_OUTPUT", "MAX_OUTPUT"])
    for array, result in zip(arrays, results):
        # BATCH_SCATTER_WITH_INPUT_SHAPE: each request gets its own elements back, in its shape
        np.testing.assert_array_equal(result["RAGGED_OUTPUT"], array)
        np.testing.assert_array_equal(result["COUNT_OUTPUT"], [[2, 4, 1, 3]])
        np.testing.assert_array_equal(result["ACC_OUTPUT"], [[2, 6, 7, 10]])
        np.testing.assert_array_equal(result["ACC_ZERO_OUTPUT"], [[0, 2, 6, 7, 10]])
        assert result["MAX_OUTPUT"].shape == (1, 4)  # only the shape tells: the largest count
    stats = httpclient.InferenceServerClient(server.url).get_inference_statistics("ragged")
    assert stats["model_stats"][0]["execution_count"] == 1  # the four shapes shared one execute


def test_torchscript_ragged_input_and_batch_input(served):
    server, _ = served
    client = httpclient.InferenceServerClient(server.url)
    if not client.is_model_ready("torch_ragged"):
        pytest.skip("torch is not installed")
    sizes = [3, 1, 4, 2]
    arrays = [np.full([1, n], n, np.float32) for n in sizes]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    try:
        for i, array in enumerate(arrays):
            tensor = grpcclient.InferInput("INPUT__0", list(array.shape), "FP32")
            tensor.set_data_from_numpy(array)
            client.async_stream_infer("torch_ragged", [tensor], request_id=str(i))
        results = {}
        for _ in arrays:
            result = answers.get(timeout=30)
            assert not isinstance(result, Exception), result
            results[int(result.get_response().id)] = result
    finally:
        client.stop_stream()
    for i, array in enumerate(arrays):
        np.testing.assert_array_equal(results[i].as_numpy("OUTPUT__0"), array * 2)
        np.testing.assert_array_equal(results[i].as_numpy("OUTPUT__1"), [[0, 3, 4, 8, 10]])


def test_torchscript_string_inputs_and_outputs(served):
    server, _ = served
    client = httpclient.InferenceServerClient(server.url)
    if not client.is_model_ready("torch_strings"):
        pytest.skip("torch is not installed")
    words = np.array([[b"ab", b"cd"], [b"ef", b"gh"]], dtype=object)
    tensor = httpclient.InferInput("INPUT__0", [2, 2], "BYTES")
    tensor.set_data_from_numpy(words)
    result = client.infer("torch_strings", [tensor])
    # as Triton's libtorch backend: the list's length is the shape, whatever the dims say
    assert result.as_numpy("OUTPUT__0").tolist() == [b"AB", b"CD", b"EF", b"GH"]
    assert result.as_numpy("OUTPUT__1").tolist() == [b"gh", b"ef", b"cd", b"ab"]


def test_batch_item_shape_inputs(served):
    server, _ = served
    shapes = [[2, 1, 2], [1, 1, 2], [1, 2, 2], [1, 4, 1]]
    results = _stream_four(server, "item", [np.ones(s, np.float32) for s in shapes],
                           ["ITEM_OUTPUT", "FLAT_OUTPUT"])
    # BATCH_ITEM_SHAPE: one row per batch item (the first request is two items)
    assert [r["ITEM_OUTPUT"].tolist() for r in results] == [
        [[1, 2], [1, 2]], [[1, 2]], [[2, 2]], [[4, 1]]]
    flat = [1, 2, 1, 2, 1, 2, 2, 2, 4, 1]  # BATCH_ITEM_SHAPE_FLATTEN: the same, one vector
    assert [r["FLAT_OUTPUT"].tolist() for r in results] == [[flat, flat], [flat], [flat], [flat]]


def test_python_model_with_batch_inputs_gets_only_its_requests_inputs(served):
    server, logs = served
    sizes = [3, 1, 2, 5]
    arrays = [np.arange(n, dtype=np.float32).reshape(1, n) for n in sizes]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    try:
        for i, array in enumerate(arrays):
            tensor = grpcclient.InferInput("RAGGED_INPUT", list(array.shape), "FP32")
            tensor.set_data_from_numpy(array)
            client.async_stream_infer("python_ragged", [tensor], request_id=str(i))
        results = {}
        for _ in arrays:
            result = answers.get(timeout=30)
            assert not isinstance(result, Exception), result
            results[int(result.get_response().id)] = result.as_numpy("OUT")
    finally:
        client.stop_stream()
    for i, array in enumerate(arrays):
        np.testing.assert_array_equal(results[i], array)
    executes = [json.loads(line) for line in (logs / "python.log").read_text().splitlines()]
    assert executes == [[["RAGGED_INPUT"]] * 4]  # one execute, no batch inputs added


def _arrival_order(server: ServerProcess, started: Path,
                   requests: tuple[tuple[str, float], ...] = (("slow", 1.0), ("fast", 0.0)),
                   ) -> list[str]:
    """Send the requests (id, seconds to wait) one after the other, each once the one before
    started to execute, each alone in a batch (max_batch_size 1) on the model's two instances:
    the ids in the order their responses come."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    order: list[str] = []
    done = threading.Event()

    def callback(result, error):
        order.append(str(error) if error else result.get_response().id)
        if len(order) == len(requests):
            done.set()

    for request_id, seconds in requests:
        tensor = grpcclient.InferInput("IN", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.full([1, 1], seconds, np.float32))
        client.async_infer(started.name, [tensor], callback, request_id=request_id)
        wait_until((started / request_id).exists)
    assert done.wait(30)
    for request_id, _ in requests:
        (started / request_id).unlink()
    return order


def test_preserve_ordering_with_two_instances(served):
    server, logs = served
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue = queue.Queue()
    for model in ("ordered", "unordered"):  # four requests pass the delay hook together
        for i in range(4):
            tensor = grpcclient.InferInput("IN", [1, 1], "FP32")
            tensor.set_data_from_numpy(np.zeros([1, 1], np.float32))
            client.async_infer(model, [tensor], lambda result, error: answers.put(error),
                               request_id=f"warm{i}")
        assert [answers.get(timeout=30) for _ in range(4)] == [None] * 4
    # "slow" runs on one instance, "fast" on the other and ends first: with preserve_ordering
    # its response waits for the one of "slow", taken before it
    assert _arrival_order(server, logs / "unordered") == ["fast", "slow"]
    assert _arrival_order(server, logs / "ordered") == ["slow", "fast"]


# Over HTTP, inside the front end's own activities (HTTP_RECV_* ... HTTP_SEND_*), as Triton's.
TRACE_ORDER = ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START",
               "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END",
               "INFER_RESPONSE_COMPLETE", "REQUEST_END", "HTTP_SEND_START", "HTTP_SEND_END"]


@pytest.mark.skipif(compiler() is None, reason="no C compiler to build the test backend")
def test_trace_of_a_native_model_has_compute_timestamps(tmp_path):
    backends, repo = tmp_path / "backends", tmp_path / "models"
    (backends / "identity").mkdir(parents=True)
    build_library(SOURCES / "identity.c", backends / "identity" / "libtriton_identity.so")
    (repo / "native" / "1").mkdir(parents=True)
    (repo / "native" / "config.pbtxt").write_text(textwrap.dedent("""\
        backend: "identity"
        max_batch_size: 8
        input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]
        dynamic_batching { }
        """))
    trace_file = tmp_path / "trace.json"
    with serve(repo, "--backend-directory", str(backends), "--trace-config",
               f"triton,file={trace_file}", "--trace-config", "level=TIMESTAMPS",
               "--trace-config", "rate=1", "--trace-config", "count=2") as server:
        client = httpclient.InferenceServerClient(server.url)
        for _ in range(2):
            tensor = httpclient.InferInput("INPUT0", [1, 4], "INT32")
            tensor.set_data_from_numpy(np.arange(4, dtype=np.int32).reshape(1, 4))
            client.infer("native", [tensor])
        written = Path(f"{trace_file}.0")
        entries = json.loads(wait_until(lambda: written.exists() and written).read_text())
    stamps: dict[int, list[tuple[str, int]]] = {}
    for entry in entries:
        for stamp in entry.get("timestamps", []):
            stamps.setdefault(entry["id"], []).append((stamp["name"], stamp["ns"]))
    assert len(stamps) == 2
    for trace in stamps.values():
        assert [name for name, _ in trace] == TRACE_ORDER
        times = [ns for _, ns in trace]
        assert times == sorted(times)
