"""Ensemble behaviours that Triton's own QA (L0_simple_ensemble, L0_decoupled) checks, against a
real `modelhost serve` and the real tritonclient.

The models are written here: a two-version add/sub model whose steps read one ensemble tensor
through two inputs, a model that leaves out one of its outputs, a decoupled producer whose final
flag comes on its own (as Triton's python examples send it), and a consumer that records how
many of its executions overlap (for `max_inflight_requests`).
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from host.config.parse import parse_config_text
from host.ensemble.scheduler import StepLimiter
from host.errors import InvalidArgumentError
from host.inference import InferenceRequest
from host.testing import serve

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ADD_SUB = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy()
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", (a + b).astype(np.int32)),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(np.int32))]))
        return out
'''

ONLY_SUM = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a + b)]))
        return out
'''

IO_INT32 = '''
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 4 ] } ]
'''


def _step(model: str, version: int, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    maps = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    maps += " " + " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: {version} {maps} }}'


# Each of the first two steps reads one ensemble tensor through both its inputs, and that tensor
# has other readers too (Triton's L0_simple_ensemble add_sub ensemble has this shape).
ADD_SUB_ENSEMBLE = [
    _step("qa_add_sub", -1, {"INPUT0": "INPUT0", "INPUT1": "INPUT0"}, {"OUTPUT0": "double0"}),
    _step("qa_add_sub", 1, {"INPUT0": "INPUT1", "INPUT1": "INPUT1"}, {"OUTPUT0": "double1"}),
    _step("qa_add_sub", -1, {"INPUT0": "double0", "INPUT1": "INPUT0"}, {"OUTPUT1": "val0"}),
    _step("qa_add_sub", 1, {"INPUT0": "double1", "INPUT1": "INPUT1"}, {"OUTPUT1": "val1"}),
    _step("qa_add_sub", -1, {"INPUT0": "val0", "INPUT1": "INPUT1"}, {"OUTPUT0": "OUTPUT0"}),
    _step("qa_add_sub", 1, {"INPUT0": "INPUT0", "INPUT1": "val1"}, {"OUTPUT1": "OUTPUT1"}),
]

PRODUCER = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().item())
            sender = request.get_response_sender()
            for i in range(count):
                value = np.array([[float(i)]], dtype=np.float32)
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]))
            # The final flag on its own, as Triton's examples send it.
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

# Counts executions that overlap, in files (instances may not share Python state): each
# execution creates a file while it runs, and records how many it saw at once.
OVERLAP = '''
import os
import time
import uuid

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        import json
        params = json.loads(args["model_config"])["parameters"]
        self.folder = params["folder"]["string_value"]

    def execute(self, requests):
        mark = os.path.join(self.folder, "running-" + uuid.uuid4().hex)
        open(mark, "w").close()
        try:
            for _ in range(10):
                seen = sum(n.startswith("running-") for n in os.listdir(self.folder))
                with open(os.path.join(self.folder, "seen-" + uuid.uuid4().hex), "w") as f:
                    f.write(str(seen))
                time.sleep(0.02)
        finally:
            os.remove(mark)
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
'''


def _write(root: Path, name: str, config: str, model: str | None = None,
           versions: tuple[int, ...] = (1,)) -> None:
    folder = root / name
    for v in versions:
        (folder / str(v)).mkdir(parents=True)
        if model is not None:
            (folder / str(v) / "model.py").write_text(model)
    (folder / "config.pbtxt").write_text(f'name: "{name}"\n{config}')


def _consumer(name: str, folder: Path) -> str:
    return f'''backend: "python" max_batch_size: 2
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: 4 kind: KIND_CPU }} ]
parameters {{ key: "folder" value: {{ string_value: "{folder}" }} }}'''


def _decoupled_ensemble(consumer: str, limit: int) -> str:
    head = f"max_inflight_requests: {limit}" if limit else ""
    return f'''platform: "ensemble" max_batch_size: 2
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
ensemble_scheduling {{ {head} step [
  {_step("qa_producer", -1, {"IN": "IN"}, {"OUT": "produced"})},
  {_step(consumer, -1, {"INPUT0": "produced"}, {"OUTPUT0": "OUT"})} ] }}'''


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("qa_ensemble") / "models"
    root.mkdir()
    _write(root, "qa_add_sub", f'backend: "python" max_batch_size: 8 version_policy: {{ all {{}} }}'
           f"{IO_INT32}", ADD_SUB, versions=(1, 2))
    _write(root, "qa_add_sub_ensemble", f'platform: "ensemble" max_batch_size: 8 {IO_INT32}'
           f"ensemble_scheduling {{ step [ {', '.join(ADD_SUB_ENSEMBLE)} ] }}")
    _write(root, "qa_only_sum", f'backend: "python" max_batch_size: 8 {IO_INT32}', ONLY_SUM)
    _write(root, "qa_partial_ensemble", f'platform: "ensemble" max_batch_size: 8 {IO_INT32}'
           "ensemble_scheduling { step [ "
           + _step("qa_add_sub", -1, {"INPUT0": "INPUT1", "INPUT1": "INPUT1"},
                   {"OUTPUT1": "zero"}) + ", "
           + _step("qa_only_sum", -1, {"INPUT0": "INPUT0", "INPUT1": "zero"},
                   {"OUTPUT0": "OUTPUT0", "OUTPUT1": "OUTPUT1"}) + " ] }")
    _write(root, "qa_producer", '''backend: "python" max_batch_size: 2
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }''', PRODUCER)
    folders = {}
    for consumer in ("qa_consumer_free", "qa_consumer_limited"):
        folders[consumer] = tmp_path_factory.mktemp(consumer)
        _write(root, consumer, _consumer(consumer, folders[consumer]), OVERLAP)
    _write(root, "qa_stream_free", _decoupled_ensemble("qa_consumer_free", 0))
    _write(root, "qa_stream_limited", _decoupled_ensemble("qa_consumer_limited", 1))
    with serve(root, "--log-verbose", "1") as s:
        s.folders = folders
        yield s


@pytest.fixture
def http(server):
    client = httpclient.InferenceServerClient(server.url)
    yield client
    client.close()


def _int_inputs(module, a: np.ndarray, b: np.ndarray) -> list:
    inputs = [module.InferInput("INPUT0", list(a.shape), "INT32"),
              module.InferInput("INPUT1", list(b.shape), "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def _success_by_version(http, model: str) -> dict[str, int]:
    stats = http.get_inference_statistics(model)["model_stats"]
    return {s["version"]: s["inference_stats"]["success"]["count"] for s in stats}


# --- a tensor read through two inputs of one step ---------------------------------------------

@pytest.mark.parametrize("batch", [1, 8])
def test_tensor_mapped_to_two_inputs_of_one_step(http, batch) -> None:
    # Triton's L0_simple_ensemble add_sub ensemble: it failed with "unexpected deadlock" when the
    # value read through two inputs was dropped after its first read.
    rng = np.random.default_rng(batch)
    a = rng.integers(0, 100, (batch, 4), dtype=np.int32)
    b = rng.integers(0, 100, (batch, 4), dtype=np.int32)
    before = _success_by_version(http, "qa_add_sub")
    result = http.infer("qa_add_sub_ensemble", _int_inputs(httpclient, a, b))
    # double0 = 2a, val0 = 2a - a = a, OUTPUT0 = a + b; double1 = 2b, val1 = b, OUTPUT1 = a - b
    assert result.as_numpy("OUTPUT0").tolist() == (a + b).tolist()
    assert result.as_numpy("OUTPUT1").tolist() == (a - b).tolist()
    after = _success_by_version(http, "qa_add_sub")
    # Three steps on the latest version (2), three pinned to version 1.
    assert after["1"] - before["1"] == 3
    assert after["2"] - before["2"] == 3


def test_one_output_requested_runs_only_its_steps(http) -> None:
    a = np.arange(4, dtype=np.int32).reshape(1, 4)
    b = np.ones((1, 4), dtype=np.int32)
    before = _success_by_version(http, "qa_add_sub")
    result = http.infer("qa_add_sub_ensemble", _int_inputs(httpclient, a, b),
                        outputs=[httpclient.InferRequestedOutput("OUTPUT0")])
    assert result.as_numpy("OUTPUT0").tolist() == (a + b).tolist()
    assert result.as_numpy("OUTPUT1") is None
    after = _success_by_version(http, "qa_add_sub")
    assert after["1"] == before["1"]  # the version-1 steps feed only OUTPUT1
    assert after["2"] - before["2"] == 3


def test_output_a_composing_model_did_not_produce(server) -> None:
    a = np.arange(4, dtype=np.int32).reshape(1, 4)
    b = np.full((1, 4), 7, dtype=np.int32)
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0"),
               grpcclient.InferRequestedOutput("OUTPUT1")]
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        result = client.infer("qa_partial_ensemble", _int_inputs(grpcclient, a, b),
                              outputs=outputs)
    assert result.as_numpy("OUTPUT0").tolist() == a.tolist()
    assert result.as_numpy("OUTPUT1") is None
    # Triton's verbose line, which its QA looks for in the server log.
    assert "Composing models did not output tensor OUTPUT1" in server.log_path.read_text()


# --- decoupled ensembles: the final flag ------------------------------------------------------

def _stream(server, model: str, count: int, empty_final: bool) -> list:
    """(values, final flag) of each response of one streamed request, until the final one."""
    responses: queue.Queue = queue.Queue()
    x = np.array([[count]], dtype=np.int32)
    tensor = grpcclient.InferInput("IN", [1, 1], "INT32")
    tensor.set_data_from_numpy(x)
    got = []
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(lambda result, error: responses.put((result, error)))
        try:
            client.async_stream_infer(model, [tensor], enable_empty_final_response=empty_final)
            while True:
                result, error = responses.get(timeout=30)
                if error is not None:
                    raise error
                response = result.get_response()
                final = response.parameters["triton_final_response"].bool_param
                out = result.as_numpy("OUT")
                got.append((None if out is None else out.ravel().tolist(), final))
                if final:
                    return got
        finally:
            client.stop_stream()


def test_decoupled_ensemble_last_response_is_final(server) -> None:
    # The producer sends its final flag on its own; the ensemble's last response still carries
    # it (Triton's FinishEnsemble), so a client that does not ask for empty final responses
    # sees the request end.
    got = _stream(server, "qa_stream_free", 3, empty_final=False)
    # Four consumer instances: the responses may come in any order.
    assert sorted(v for v, _ in got) == [[0.0], [1.0], [2.0]]
    assert [f for _, f in got] == [False, False, True]


def test_decoupled_ensemble_no_response_sends_flags_only(server) -> None:
    got = _stream(server, "qa_stream_free", 0, empty_final=True)
    assert got == [(None, True)]


# --- max_inflight_requests --------------------------------------------------------------------

def _max_overlap(folder: Path) -> int:
    return max(int(p.read_text()) for p in folder.glob("seen-*"))


def test_max_inflight_requests_limits_a_step(server) -> None:
    log = server.log_path.read_text()
    assert "Ensemble model 'qa_stream_limited' configured with max_inflight_requests: 1" in log
    assert "'qa_stream_free' configured with max_inflight_requests" not in log
    got = _stream(server, "qa_stream_limited", 6, empty_final=False)
    assert sorted(v for v, _ in got) == [[float(i)] for i in range(6)]
    assert [f for _, f in got] == [False] * 5 + [True]
    # Four instances, but at most one request of the step in flight at a time.
    assert _max_overlap(server.folders["qa_consumer_limited"]) == 1


def test_step_limiter_waits_for_a_slot_unless_cancelled() -> None:
    limiter = StepLimiter(1)
    request = InferenceRequest(model_name="m")
    limiter.acquire(request, "e", 0)
    entered = threading.Event()

    def second() -> None:
        limiter.acquire(request, "e", 0)
        entered.set()

    thread = threading.Thread(target=second)
    thread.start()
    assert not entered.wait(0.3)  # the one slot is taken
    limiter.release()
    assert entered.wait(10)
    thread.join()
    # A cancelled request does not wait (its step then fails as cancelled).
    waiting = InferenceRequest(model_name="m")
    done = threading.Event()
    thread = threading.Thread(target=lambda: (limiter.acquire(waiting, "e", 0), done.set()))
    thread.start()
    time.sleep(0.05)
    waiting.cancel()
    assert done.wait(10)
    thread.join()
    assert limiter.count == 2  # the second acquire's slot and the cancelled one's
    for _ in range(2):
        limiter.release()
    limiter.release()  # underflow is logged, not counted
    assert limiter.count == 0


# --- the C++ parser's words for integer errors ------------------------------------------------

@pytest.mark.parametrize("value, text", [
    ("-5", "Expected integer, got: -"),
    ('"invalid_value"', 'Expected integer, got: "invalid_value"'),
    ("12345678901", "Integer out of range (12345678901)"),
    ("1.5", "Expected integer, got: 1.5"),
])
def test_config_integer_errors_as_triton_words_them(value, text) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        parse_config_text(f'name: "e" ensemble_scheduling {{ max_inflight_requests: {value} }}',
                          "config.pbtxt")
    assert str(info.value.message).startswith("failed to read text proto from config.pbtxt")
    assert info.value.message.endswith(text)


def test_unary_call_to_decoupled_ensemble_refused(http) -> None:
    x = np.array([[1]], dtype=np.int32)
    tensor = httpclient.InferInput("IN", [1, 1], "INT32")
    tensor.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as info:
        http.infer("qa_stream_free", [tensor])
    assert "doesn't support models with decoupled transaction policy" in str(info.value)


# --- a non-decoupled model that sends several responses (L0_grpc_state_cleanup) ---------------

@pytest.fixture(scope="module")
def native_server(tmp_path_factory):
    from host.native.testing import build_library, compiler

    if compiler() is None:
        pytest.skip("no C compiler to build the test backend")
    root = tmp_path_factory.mktemp("qa_native")
    source = Path(__file__).resolve().parent / "native" / "repeat.c"
    folder = root / "models" / "repeat_not_decoupled"
    (folder / "1").mkdir(parents=True)
    # The native test backend sends one response per element of IN, then the final flag; this
    # model does not declare itself decoupled.
    build_library(source, folder / "1" / "libtriton_repeat.so")
    (folder / "config.pbtxt").write_text('''backend: "repeat"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "IDX" data_type: TYPE_INT32 dims: [ 1 ] } ]''')
    # A backend that takes a response factory and lets it go without answering.
    silent = root / "silent.c"
    silent.write_text('''#include "triton/core/tritonbackend.h"
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(
    TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests, const uint32_t n) {
  for (uint32_t i = 0; i < n; i++) {
    TRITONBACKEND_ResponseFactory* factory;
    TRITONBACKEND_ResponseFactoryNew(&factory, requests[i]);
    TRITONBACKEND_RequestRelease(requests[i], TRITONSERVER_REQUEST_RELEASE_ALL);
    TRITONBACKEND_ResponseFactoryDelete(factory);
  }
  return NULL;
}
''')
    folder = root / "models" / "silent"
    (folder / "1").mkdir(parents=True)
    build_library(silent, folder / "1" / "libtriton_silent.so")
    (folder / "config.pbtxt").write_text('''backend: "silent"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]''')
    with serve(root / "models") as s:
        yield s


def test_stream_sends_the_first_of_several_non_decoupled_responses(native_server) -> None:
    responses: queue.Queue = queue.Queue()
    x = np.array([100, 101, 102, 103], dtype=np.int32)
    tensor = grpcclient.InferInput("IN", [4], "INT32")
    tensor.set_data_from_numpy(x)
    with grpcclient.InferenceServerClient(native_server.grpc_url) as client:
        client.start_stream(lambda result, error: responses.put((result, error)))
        client.async_stream_infer("repeat_not_decoupled", [tensor], request_id="0")
        client.stop_stream()  # waits until the server ended the stream
    got = []
    while not responses.empty():
        result, error = responses.get()
        assert error is None, str(error)
        got.append((result.as_numpy("OUT").tolist(), result.as_numpy("IDX").tolist()))
    assert got == [([100], [0])]  # Triton's stream handler keeps the first response


def test_non_decoupled_native_responses_after_execute(native_server) -> None:
    # The repeat backend answers from a thread of its own after execute returned; Triton's
    # repeat backend does so too when it is not decoupled (L0_decoupled's NonDecoupledTest).
    x = np.array([7], dtype=np.int32)
    tensor = httpclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(x)
    with httpclient.InferenceServerClient(native_server.url) as client:
        result = client.infer("repeat_not_decoupled", [tensor])
        assert result.as_numpy("OUT").tolist() == [7]
        assert result.as_numpy("IDX").tolist() == [0]
        # A backend that lets its response factory go unanswered: the request fails, it does
        # not hang.
        with pytest.raises(InferenceServerException) as info:
            client.infer("silent", [tensor])
        assert "model 'silent' sent no response for the request" in str(info.value)
