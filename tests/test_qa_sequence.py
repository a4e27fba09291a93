"""Sequence batching as Triton's sequence-batcher QA suites check it (L0_sequence_batcher,
L0_implicit_state, L0_sequence_corrid_batcher), with small python models of our own:

- a request `timeout` applies to a sequence waiting in the backlog: when it runs out the whole
  backlogged sequence is rejected (UNAVAILABLE "timeout of the corresponding sequence has been
  expired") and forgotten, so a later request of it needs START again
  (SequenceBatcherRequestTimeoutTest); a sequence that has a slot is never timed out;
- a new sequence takes the lowest free slot (Triton's ready-slot priority queue), so no padding
  row sits below it (test_backlog);
- an ONNX sequence model never batches requests of different shapes (test_ragged_batch);
- an ensemble step's error is "in ensemble 'E', <message>", nothing in between (ensemble trials);
- a model that failed to load answers NOT_FOUND (HTTP 404) "has no available versions", as
  Triton's model lookup does;
- the server flags L0_sequence_stress and L0_iterative_sequence pass (--grpc-infer-thread-count,
  --model-control-mode=EXPLICIT).

Real Triton 2.51 answers these the same way (checked with its `identity`/`sequence` test
backends)."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from host.testing import serve

pytestmark = pytest.mark.modelhost_only

# A running sum per sequence (the state lives in the model, keyed by correlation id), one
# batch slot: a second sequence waits in the backlog until the first one ends.
ACCUMULATE = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            cid = request.correlation_id()
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if pb_utils.get_input_tensor_by_name(request, "START").as_numpy().item():
                self.sums[cid] = 0
            self.sums[cid] = self.sums.get(cid, 0) + int(x.sum())
            out = np.full(x.shape, self.sums[cid], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out)]))
        return responses
'''

ONE_SLOT = """
name: "one_slot"
backend: "python"
max_batch_size: 1
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 60000000
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }
  ]
}
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

# Fails to load: a KIND_GPU group on a host without GPUs.
BROKEN = """
name: "broken"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_GPU count: 1 gpus: [ 99 ] } ]
"""

# Two batch slots (direct strategy): OUTPUT0 is the number of rows of the execute that ran the
# request (a padding row for each free slot below the highest busy one).
ROWS = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        rows = np.array([[len(requests)]], dtype=np.int32)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", rows)]) for _ in requests]
'''

TWO_SLOTS = """
name: "two_slots"
backend: "python"
max_batch_size: 2
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 60000000
  control_input [
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }
  ]
}
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

# An ensemble over the one-slot sequence model (L0_sequence_batcher's simple_* ensembles).
ENSEMBLE = """
name: "ens_seq"
platform: "ensemble"
max_batch_size: 1
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "one_slot" model_version: -1
  input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT" } } ] }
"""

EXPIRED = "timeout of the corresponding sequence has been expired"
NO_START = "must specify the START flag on the first request of the sequence"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("qa-sequence") / "models"
    for name, config, model in (("one_slot", ONE_SLOT, ACCUMULATE), ("broken", BROKEN, ACCUMULATE),
                                ("two_slots", TWO_SLOTS, ROWS)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
        (repo / name / "1" / "model.py").write_text(model)
    (repo / "ens_seq" / "1").mkdir(parents=True)
    (repo / "ens_seq" / "config.pbtxt").write_text(ENSEMBLE)
    with serve(repo) as process:
        yield process


def _grpc_infer(client, value: int, **kwargs):
    x = grpcclient.InferInput("INPUT0", [1, 1], "INT32")
    x.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    return client.infer("one_slot", [x], **kwargs)


def _http_input(value: int):
    x = httpclient.InferInput("INPUT0", [1, 1], "INT32")
    x.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    return [x]


def test_backlogged_sequence_expires_with_its_request_timeout(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        # Sequence 1 holds the only slot (it has not ended); its own request timeout is never
        # applied, since it is not in the backlog.
        assert _grpc_infer(client, 5, sequence_id=1, sequence_start=True,
                           timeout=1000).as_numpy("OUTPUT0").item() == 5
        # Sequence 2 waits in the backlog and is rejected once 50 ms have passed.
        with pytest.raises(InferenceServerException, match=EXPIRED) as e:
            _grpc_infer(client, 7, sequence_id=2, sequence_start=True, timeout=50_000)
        assert e.value.status() == "StatusCode.UNAVAILABLE"
        # The backlogged sequence was forgotten: continuing it needs START again.
        with pytest.raises(InferenceServerException, match=NO_START) as e:
            _grpc_infer(client, 1, sequence_id=2, sequence_end=True)
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
        # Sequence 1 still has its slot and its sum.
        assert _grpc_infer(client, 2, sequence_id=1, sequence_end=True,
                           timeout=1000).as_numpy("OUTPUT0").item() == 7
    finally:
        client.close()


def test_backlogged_sequence_expires_over_http(server):
    client = httpclient.InferenceServerClient(server.url, concurrency=2, network_timeout=60)
    try:
        assert client.infer("one_slot", _http_input(3), sequence_id=11,
                            sequence_start=True).as_numpy("OUTPUT0").item() == 3
        with pytest.raises(InferenceServerException, match=EXPIRED) as e:
            client.infer("one_slot", _http_input(4), sequence_id=12, sequence_start=True,
                         timeout=50_000)
        assert e.value.status() == "503"
        client.infer("one_slot", _http_input(1), sequence_id=11, sequence_end=True)
    finally:
        client.close()


def test_backlogged_sequence_without_timeout_runs_when_a_slot_frees(server):
    client = httpclient.InferenceServerClient(server.url, concurrency=2, network_timeout=60)
    try:
        client.infer("one_slot", _http_input(1), sequence_id=21, sequence_start=True)
        waiting = client.async_infer("one_slot", _http_input(10), sequence_id=22,
                                     sequence_start=True, sequence_end=True)
        assert client.infer("one_slot", _http_input(1), sequence_id=21,
                            sequence_end=True).as_numpy("OUTPUT0").item() == 2
        assert waiting.get_result().as_numpy("OUTPUT0").item() == 10
    finally:
        client.close()


def test_new_sequence_takes_the_lowest_free_slot(server):
    # L0_sequence_batcher test_backlog: slots 0 and 1 were freed (in that order); the next sequence
    # takes slot 0, as in Triton, so its executes have one row, not a padding row below it.
    client = httpclient.InferenceServerClient(server.url)
    try:
        def rows(sequence_id, **flags):
            return client.infer("two_slots", _http_input(1), sequence_id=sequence_id,
                                **flags).as_numpy("OUTPUT0").item()
        assert rows(31, sequence_start=True) == 1  # slot 0
        assert rows(32, sequence_start=True) == 2  # slot 1: padding row for slot 0
        assert rows(31, sequence_end=True) == 1  # slot 1 has no request: no row for it
        assert rows(32, sequence_end=True) == 2
        assert rows(33, sequence_start=True) == 1  # slot 0 again
        assert rows(33, sequence_end=True) == 1
    finally:
        client.close()


def _onnx_times_three(path):
    """OUTPUT = INPUT * 3 over INT32 [N, -1]; the START control is an input the graph ignores."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper
    three = numpy_helper.from_array(np.array(3, dtype=np.int32), "three")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["INPUT", "three"], ["OUTPUT"])], "times_three",
        [helper.make_tensor_value_info("INPUT", TensorProto.INT32, ["N", "K"]),
         helper.make_tensor_value_info("START", TensorProto.INT32, ["N", 1])],
        [helper.make_tensor_value_info("OUTPUT", TensorProto.INT32, ["N", "K"])],
        initializer=[three])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())


def test_onnx_sequence_model_never_batches_requests_of_different_shapes(tmp_path):
    # L0_sequence_batcher test_ragged_batch (variable-shape ONNX models): Triton's core gives one
    # execute only requests of equal shapes, whatever the backend; the direct strategy pads the
    # slot of a request of another shape and runs it next.
    _onnx_times_three(tmp_path / "seq_onnx" / "1" / "model.onnx")
    (tmp_path / "seq_onnx" / "config.pbtxt").write_text("""
name: "seq_onnx"
backend: "onnxruntime"
max_batch_size: 2
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 60000000
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }
  ]
}
instance_group [ { kind: KIND_CPU count: 1 } ]
""")
    # The first batch waits until both requests are queued (Triton's testing hook).
    with serve(tmp_path, env={"TRITONSERVER_DELAY_SCHEDULER": "2"}) as onnx_server:
        client = httpclient.InferenceServerClient(onnx_server.url, concurrency=2)
        try:
            pending = []
            for sequence_id, width in ((41, 3), (42, 1)):
                x = httpclient.InferInput("INPUT", [1, width], "INT32")
                x.set_data_from_numpy(np.full((1, width), sequence_id, dtype=np.int32))
                pending.append(client.async_infer("seq_onnx", [x], sequence_id=sequence_id,
                                                  sequence_start=True))
            outputs = [p.get_result().as_numpy("OUTPUT").tolist() for p in pending]
            assert outputs == [[[123, 123, 123]], [[126]]]
            stats = client.get_inference_statistics("seq_onnx")["model_stats"][0]
        finally:
            client.close()
    assert stats["inference_count"] == 2
    assert stats["execution_count"] == 2
    assert {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]} == {2: 2}


def test_ensemble_step_error_is_prefixed_as_triton_prefixes_it(server):
    # "in ensemble 'E', " and then the step's own message, nothing in between (Triton's QA
    # compares the text from its start).
    client = httpclient.InferenceServerClient(server.url)
    try:
        x = httpclient.InferInput("IN", [1, 1], "INT32")
        x.set_data_from_numpy(np.array([[1]], dtype=np.int32))
        with pytest.raises(InferenceServerException) as e:
            client.infer("ens_seq", [x])
        assert e.value.message().startswith(
            "in ensemble 'ens_seq', inference request to model 'one_slot' must specify a "
            "non-zero or non-empty correlation ID")
        with pytest.raises(InferenceServerException) as e:
            client.infer("ens_seq", [x], sequence_id=51)
        assert e.value.message().startswith(
            "in ensemble 'ens_seq', inference request for sequence 51 to model 'one_slot' "
            "must specify the START flag on the first request of the sequence")
    finally:
        client.close()


def test_model_that_failed_to_load_is_not_found(server):
    client = httpclient.InferenceServerClient(server.url)
    try:
        with pytest.raises(InferenceServerException,
                           match="Request for unknown model: 'broken' has no available versions") as e:
            client.infer("broken", _http_input(1))
        assert e.value.status() == "404"
    finally:
        client.close()
    gclient = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        x = grpcclient.InferInput("INPUT0", [1], "INT32")
        x.set_data_from_numpy(np.array([1], dtype=np.int32))
        with pytest.raises(InferenceServerException, match="has no available versions") as e:
            gclient.infer("broken", [x])
        assert e.value.status() == "StatusCode.NOT_FOUND"
    finally:
        gclient.close()


@pytest.mark.parametrize("count", ["-1", "0", "1", "129"])
def test_grpc_infer_thread_count_out_of_range_stops_the_server(tmp_path, count):
    # L0_sequence_stress: the server must not start with these values, and starts with 128.
    from host import cli
    args = cli.parse_serve_args(cli.build_parser(), [
        "--model-repository", str(tmp_path), f"--grpc-infer-thread-count={count}"])
    with pytest.raises(SystemExit, match=r"invalid argument for --grpc_infer_thread_count\. "
                                         r"Must be in the range 2 to 128\."):
        cli.options_from_args(args)


def test_grpc_infer_thread_count_in_range_is_accepted(tmp_path):
    from host import cli
    for count in ("2", "128"):
        args = cli.parse_serve_args(cli.build_parser(), [
            "--model-repository", str(tmp_path), f"--grpc-infer-thread-count={count}",
            "--grpc-infer-allocation-pool-size=16"])
        assert cli.options_from_args(args).grpc_infer_thread_count == int(count)


def test_model_control_mode_is_case_insensitive(tmp_path):
    # L0_iterative_sequence starts the server with --model-control-mode=EXPLICIT (Triton
    # lower-cases the value, and --rate-limit's).
    from host import cli
    args = cli.parse_serve_args(cli.build_parser(), [
        "--model-repository", str(tmp_path), "--model-control-mode=EXPLICIT", "--rate-limit=OFF"])
    assert (args.model_control_mode, args.rate_limit) == ("explicit", "off")
