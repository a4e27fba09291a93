"""Process mode of the python backend (docs/process_model.md), through a real `modelhost serve`
and the real tritonclient: every instance runs in a stub process of its own."""

from __future__ import annotations

import json
import os
import queue
import re
import sys
import textwrap
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from host.testing import serve, wait_until

PROCESS = 'parameters { key: "EXECUTION_MODE" value { string_value: "process" } }\n'

TYPES_MODEL = '''
import json, os
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            tensors = []
            for name in ("FP32", "INT64", "BOOL", "STR", "FP16"):
                t = pb_utils.get_input_tensor_by_name(request, name)
                tensors.append(pb_utils.Tensor("OUT_" + name, t.as_numpy()))
            tensors.append(pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64)))
            tensors.append(pb_utils.Tensor(
                "PARAMS", np.array([request.parameters().encode()], dtype=object)))
            # Zero copy: the input is a view of the shared-memory arena, not a private array.
            fp32 = pb_utils.get_input_tensor_by_name(request, "FP32").as_numpy()
            base = fp32
            while isinstance(base, np.ndarray) and not base.flags.owndata:
                base = base.base
            shared = type(base).__name__.startswith("c_char_Array")
            tensors.append(pb_utils.Tensor("SHARED", np.array([shared])))
            out.append(pb_utils.InferenceResponse(tensors))
        return out
'''

TYPES_CONFIG = '''
max_batch_size: 0
input [
  { name: "FP32" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "INT64" data_type: TYPE_INT64 dims: [ 2, 2 ] },
  { name: "BOOL" data_type: TYPE_BOOL dims: [ -1 ] },
  { name: "STR" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "FP16" data_type: TYPE_FP16 dims: [ -1 ] }
]
output [
  { name: "OUT_FP32" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "OUT_INT64" data_type: TYPE_INT64 dims: [ 2, 2 ] },
  { name: "OUT_BOOL" data_type: TYPE_BOOL dims: [ -1 ] },
  { name: "OUT_STR" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "OUT_FP16" data_type: TYPE_FP16 dims: [ -1 ] },
  { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] },
  { name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "SHARED" data_type: TYPE_BOOL dims: [ 1 ] }
]
''' + PROCESS

DECOUPLED_MODEL = '''
import threading
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.stream, args=(request,)).start()
        return None

    def stream(self, request):
        n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
        sender = request.get_response_sender()
        for i in range(n):
            sender.send(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", np.array([i], dtype=np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''

DECOUPLED_CONFIG = '''
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
''' + PROCESS

# Each execute announces its PID in a shared folder, then spins in pure Python (holding its GIL)
# until it sees another execute's announcement, or gives up after a while. Both requests seeing
# each other proves they ran at the same time; with one interpreter, the spin would hold the GIL.
BUSY_MODEL = '''
import os, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.model_dir = args["model_repository"]

    def finalize(self):
        open(os.path.join(self.model_dir, f"finalized.{os.getpid()}"), "w").close()

    def execute(self, requests):
        out = []
        for request in requests:
            folder = pb_utils.get_input_tensor_by_name(request, "DIR").as_numpy()[0].decode()
            mine = os.path.join(folder, str(os.getpid()))
            open(mine, "w").close()
            deadline = time.monotonic() + 20
            overlap = False
            while time.monotonic() < deadline:
                x = 0
                for i in range(20000):
                    x += i * i
                if len(os.listdir(folder)) >= 2:
                    overlap = True
                    break
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64)),
                pb_utils.Tensor("OVERLAP", np.array([overlap], dtype=bool))]))
        return out
'''

BUSY_CONFIG = '''
max_batch_size: 0
input [ { name: "DIR" data_type: TYPE_STRING dims: [ 1 ] } ]
output [
  { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] },
  { name: "OVERLAP" data_type: TYPE_BOOL dims: [ 1 ] }
]
instance_group [ { count: 2 kind: KIND_CPU } ]
''' + PROCESS

CRASH_MODEL = '''
import os
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            if pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0] == 1:
                os._exit(3)
            if pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0] == 2:
                raise SystemExit(4)
            if pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0] == 3:
                return [pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "X must not be 3", pb_utils.TritonError.INVALID_ARG))]
            if pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0] == 4:
                raise ValueError("four is right out")
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64))]) for _ in requests]
'''

CRASH_CONFIG = '''
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
''' + PROCESS

BLS_MODEL = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        # Model control from initialize reaches the server too (BLS requests do not: Triton's
        # rule, "BLS is only supported during the 'execute' function").
        self.ready_at_init = pb_utils.is_model_ready("callee_add")

    def execute(self, requests):
        responses = []
        for request in requests:
            x = int(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0])
            y, msg = 0, ""
            if x == 0:  # one call, two outputs (one BYTES), inputs and outputs through the arenas
                r = pb_utils.InferenceRequest(
                    model_name="callee_add", requested_output_names=["OUT", "NAME"],
                    inputs=[pb_utils.Tensor("IN", np.arange(5, dtype=np.int32))]).exec()
                out = pb_utils.get_output_tensor_by_name(r, "OUT").as_numpy()
                name = pb_utils.get_output_tensor_by_name(r, "NAME").as_numpy()[0]
                y, msg = int(out.sum()), name.decode()
            elif x == 1:
                y = int(pb_utils.is_model_ready("callee_add")) + 10 * int(
                    pb_utils.is_model_ready("no_such_model"))
            elif x == 2:  # a decoupled callee: every response, then the empty final one
                rs = list(pb_utils.InferenceRequest(
                    model_name="callee_stream", requested_output_names=["OUT"],
                    inputs=[pb_utils.Tensor("IN", np.array([4], np.int32))]).exec(decoupled=True))
                y = sum(int(t.as_numpy()[0]) for r in rs for t in r.output_tensors())
                msg = str(len(rs))
            elif x == 3:  # an error comes back as an error response, with the callee's text
                r = pb_utils.InferenceRequest(model_name="no_such_model", requested_output_names=["OUT"],
                                              inputs=[]).exec()
                y, msg = int(r.has_error()), r.error().message()
            elif x == 4:  # a large tensor both ways (4 MiB)
                big = np.ones(1 << 20, np.int32)
                r = pb_utils.InferenceRequest(model_name="callee_add", requested_output_names=["OUT"],
                                              inputs=[pb_utils.Tensor("IN", big)]).exec()
                y = int(r.output_tensors()[0].as_numpy().sum())
            elif x == 5:
                msg = str(self.ready_at_init)
            elif x == 6:  # many calls: the arenas' blocks come back
                for _ in range(300):
                    r = pb_utils.InferenceRequest(
                        model_name="callee_add", requested_output_names=["OUT"],
                        inputs=[pb_utils.Tensor("IN", np.ones(1 << 16, np.int32))]).exec()
                    y += int(r.output_tensors()[0].as_numpy()[0])
            elif x == 7:  # cancel a decoupled call: the callee stops early
                it = pb_utils.InferenceRequest(
                    model_name="callee_slow", requested_output_names=["OUT"],
                    inputs=[pb_utils.Tensor("IN", np.array([500], np.int32))]).exec(decoupled=True)
                first = next(iter(it))
                it.cancel()
                y = 1 + sum(1 for _ in it)
                msg = str(int(first.output_tensors()[0].as_numpy()[0]))
            elif x == 8:  # a call back into this model (one instance): runs as a recursion
                r = pb_utils.InferenceRequest(
                    model_name="proc_bls", requested_output_names=["Y", "MSG"],
                    inputs=[pb_utils.Tensor("X", np.array([0], np.int32))]).exec()
                y = int(pb_utils.get_output_tensor_by_name(r, "Y").as_numpy()[0])
                msg = pb_utils.get_output_tensor_by_name(r, "MSG").as_numpy()[0].decode()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", np.array([y], np.int32)),
                pb_utils.Tensor("MSG", np.array([msg.encode()], np.object_))]))
        return responses
'''

CALLEE_SLOW = '''
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            sender = r.get_response_sender()
            for i in range(int(pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()[0])):
                if r.is_cancelled():
                    break
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32))]))
                time.sleep(0.01)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

METRICS_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.family = pb_utils.MetricFamily("proc_requests", "requests seen in a stub",
                                            pb_utils.MetricFamily.COUNTER)
        self.counter = self.family.Metric(labels={"model": "proc_metrics"})
        sizes = pb_utils.MetricFamily("proc_sizes", "sizes seen", pb_utils.MetricFamily.HISTOGRAM)
        self.sizes = sizes.Metric(labels={"model": "proc_metrics"}, buckets=[1.0, 10.0])
        self.sizes_family = sizes

    def execute(self, requests):
        responses = []
        for request in requests:
            x = int(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0])
            self.counter.increment(1)
            self.sizes.observe(x)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", np.array([int(self.counter.value())], np.int32)),
                pb_utils.Tensor("MSG", np.array([b""], np.object_))]))
        return responses
'''

# Records every process that imports it: the server must never be one of them.
IMPORTS_MODEL = '''
import os
import numpy as np
import triton_python_backend_utils as pb_utils

with open(os.path.join(os.path.dirname(__file__), "imported_by.txt"), "a") as f:
    f.write(f"{os.getpid()}\\n")

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "X", "data_type": "TYPE_INT32", "dims": [1]})
        config.add_output({"name": "Y", "data_type": "TYPE_INT32", "dims": [1]})
        return config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([os.getpid()], np.int32))])
                for _ in requests]
'''

# Decoupled: each request is answered by a thread of its own, which makes BLS calls first,
# while the stub's main thread goes back to reading the socket for the next requests.
BLS_THREADED_MODEL = '''
import threading
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self._answer, args=(request,)).start()
        return None

    def _answer(self, request):
        sender = request.get_response_sender()
        total = 0
        for i in range(5):
            r = pb_utils.InferenceRequest(model_name="callee_add", requested_output_names=["OUT"],
                                          inputs=[pb_utils.Tensor("IN", np.array([i], np.int32))]).exec()
            total += int(r.output_tensors()[0].as_numpy()[0])
        sender.send(pb_utils.InferenceResponse([
            pb_utils.Tensor("Y", np.array([total], np.int32)),
            pb_utils.Tensor("MSG", np.array([b"threaded"], np.object_))]),
            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''

BLS_ASYNC_MODEL = '''
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            calls = [pb_utils.InferenceRequest(
                model_name="callee_add", requested_output_names=["OUT"],
                inputs=[pb_utils.Tensor("IN", np.array([i], np.int32))]).async_exec()
                for i in range(3)]
            results = await asyncio.gather(*calls)
            y = sum(int(r.output_tensors()[0].as_numpy()[0]) for r in results)  # 1+2+3
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", np.array([y], np.int32)),
                pb_utils.Tensor("MSG", np.array([b""], np.object_))]))
        return responses
'''

CALLEE_ADD = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([
            pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() + 1),
            pb_utils.Tensor("NAME", np.array([b"callee"], np.object_))]) for r in requests]
'''

CALLEE_ADD_CONFIG = '''
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] },
         { name: "NAME" data_type: TYPE_STRING dims: [ 1 ] } ]
'''

CALLEE_STREAM = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            sender = r.get_response_sender()
            for i in range(int(pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()[0])):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

CALLEE_STREAM_CONFIG = '''
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
'''

BLS_CALLER_CONFIG = '''
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "MSG" data_type: TYPE_STRING dims: [ 1 ] } ]
''' + PROCESS

BLS_CONFIG = '''
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
''' + PROCESS

# Polls is_cancelled() inside a long synchronous execute, and records what it saw.
CANCEL_MODEL = '''
import pathlib, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.record = pathlib.Path(args["model_repository"]) / "record.txt"

    def execute(self, requests):
        self.record.write_text("started")
        deadline = time.monotonic() + 20
        while not requests[0].is_cancelled() and time.monotonic() < deadline:
            time.sleep(0.01)
        self.record.write_text("cancelled" if requests[0].is_cancelled() else "finished")
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("Y", np.array([1], dtype=np.int32))]) for _ in requests]
'''

BATCHED_CONFIG = '''
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 20000 }
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
''' + PROCESS

# OUTPUT0 = 2 * INPUT0, for every request of the batch.
BATCHED_MODEL = '''
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() * 2)])
            for r in requests]
'''

# Crashes on X == 1; its initialize fails while a file named "broken" is next to its config.
FLAKY_MODEL = '''
import os, pathlib
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        if (pathlib.Path(args["model_repository"]) / "broken").exists():
            raise RuntimeError("the model is broken")

    def execute(self, requests):
        if pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()[0] == 1:
            os._exit(5)
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64))]) for _ in requests]
'''

MODELS = {
    "proc_flaky": (CRASH_CONFIG, FLAKY_MODEL),
    "proc_batched": (BATCHED_CONFIG, BATCHED_MODEL),
    "proc_cancel": (BLS_CONFIG, CANCEL_MODEL),
    "proc_types": (TYPES_CONFIG, TYPES_MODEL),
    "proc_decoupled": (DECOUPLED_CONFIG, DECOUPLED_MODEL),
    "proc_busy": (BUSY_CONFIG, BUSY_MODEL),
    "proc_crash": (CRASH_CONFIG, CRASH_MODEL),
    "proc_bls": (BLS_CALLER_CONFIG, BLS_MODEL),
    "proc_bls_async": (BLS_CALLER_CONFIG, BLS_ASYNC_MODEL),
    "callee_add": (CALLEE_ADD_CONFIG, CALLEE_ADD),
    "callee_stream": (CALLEE_STREAM_CONFIG, CALLEE_STREAM),
    "callee_slow": (CALLEE_STREAM_CONFIG, CALLEE_SLOW),
    "proc_metrics": (BLS_CALLER_CONFIG + 'instance_group [ { count: 2 kind: KIND_CPU } ]\n',
                     METRICS_MODEL),
    "proc_imports": ("max_batch_size: 0\n" + PROCESS, IMPORTS_MODEL),
    "proc_bls_threaded": (BLS_CALLER_CONFIG + "model_transaction_policy { decoupled: true }\n",
                          BLS_THREADED_MODEL),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("process_models")
    for name, (config, code) in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "python"\n' + textwrap.dedent(config))
        (repo / name / "1" / "model.py").write_text(textwrap.dedent(code))
    # The example model with implicit state (a running sum kept by the host), in process mode.
    example = Path(__file__).resolve().parent.parent / "model_repository" / "sequence_implicit_state"
    (repo / "proc_state" / "1").mkdir(parents=True)
    (repo / "proc_state" / "1" / "model.py").write_text((example / "1" / "model.py").read_text())
    (repo / "proc_state" / "config.pbtxt").write_text(
        (example / "config.pbtxt").read_text().replace('"sequence_implicit_state"', '"proc_state"')
        + PROCESS)
    args = ["--model-control-mode", "explicit", "--allow-client-shm=true", "--load-model",
            "proc_state"]
    for name in MODELS:
        args += ["--load-model", name]
    with serve(repo, *args) as srv:
        yield srv


def _types_inputs(module):
    values = {
        "FP32": np.array([1.5, -2.0, 3.25], dtype=np.float32),
        "INT64": np.array([[1, -2], [3, 1 << 40]], dtype=np.int64),
        "BOOL": np.array([True, False, True]),
        "STR": np.array([b"hello", b"", b"\x00bin\xff", "caf\u00e9".encode()], dtype=object),
        "FP16": np.array([0.5, 2.0], dtype=np.float16),
    }
    datatypes = {"FP32": "FP32", "INT64": "INT64", "BOOL": "BOOL", "STR": "BYTES", "FP16": "FP16"}
    inputs = []
    for name, value in values.items():
        t = module.InferInput(name, list(value.shape), datatypes[name])
        t.set_data_from_numpy(value)
        inputs.append(t)
    return values, inputs


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_datatypes_round_trip_through_the_stub(server, protocol):
    module = httpclient if protocol == "http" else grpcclient
    url = server.url if protocol == "http" else server.grpc_url
    client = module.InferenceServerClient(url)
    values, inputs = _types_inputs(module)
    result = client.infer("proc_types", inputs, parameters={"greeting": "hi", "n": 3})
    for name, value in values.items():
        got = result.as_numpy("OUT_" + name)
        assert got.dtype == value.dtype or name == "STR"
        np.testing.assert_array_equal(got, value)
    pid = int(result.as_numpy("PID")[0])
    assert pid != server.pid and pid != os.getpid()
    assert json.loads(result.as_numpy("PARAMS")[0]) == {"greeting": "hi", "n": 3}
    assert result.as_numpy("SHARED")[0]
    # Only the requested outputs come back.
    outputs = [module.InferRequestedOutput("OUT_STR"), module.InferRequestedOutput("PID")]
    result = client.infer("proc_types", inputs, outputs=outputs)
    assert result.as_numpy("OUT_FP32") is None
    np.testing.assert_array_equal(result.as_numpy("OUT_STR"), values["STR"])


def test_decoupled_model_streams_from_its_process(server):
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        n = grpcclient.InferInput("N", [1], "INT32")
        n.set_data_from_numpy(np.array([5], dtype=np.int32))
        client.async_stream_infer("proc_decoupled", [n], enable_empty_final_response=True)
        got = []
        while True:
            result, error = responses.get(timeout=30)
            assert error is None, error
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
            got.append(int(result.as_numpy("OUT")[0]))
        assert got == [0, 1, 2, 3, 4]
    finally:
        client.stop_stream()


def test_two_instances_execute_concurrently_in_two_processes(server, tmp_path):
    client = httpclient.InferenceServerClient(server.url, concurrency=2)
    folder = np.array([str(tmp_path).encode()], dtype=object)
    inp = httpclient.InferInput("DIR", [1], "BYTES")
    inp.set_data_from_numpy(folder)
    pending = [client.async_infer("proc_busy", [inp]) for _ in range(2)]
    results = [p.get_result(timeout=60) for p in pending]
    pids = {int(r.as_numpy("PID")[0]) for r in results}
    assert len(pids) == 2, pids
    assert all(bool(r.as_numpy("OVERLAP")[0]) for r in results)
    assert sorted(int(p.name) for p in tmp_path.iterdir()) == sorted(pids)


def _crash_infer(client, value):
    x = httpclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([value], dtype=np.int32))
    return client.infer("proc_crash", [x])


@pytest.mark.parametrize("how", [1, 2], ids=["os._exit", "sys.exit"])
def test_a_crashing_stub_fails_its_request_and_is_restarted(server, how):
    client = httpclient.InferenceServerClient(server.url)
    before = int(_crash_infer(client, 0).as_numpy("PID")[0])
    with pytest.raises(InferenceServerException) as info:
        _crash_infer(client, how)
    assert re.search(r"Stub process 'proc_crash_0\w*' is not healthy\.", info.value.message())
    assert not _alive(before)
    # The next request starts the stub again and is served.
    after = int(_crash_infer(client, 0).as_numpy("PID")[0])
    assert after != before and _alive(after)
    assert client.is_model_ready("proc_crash")
    # The restart ran on a request's thread, which sits on the server's Python CPU
    # (host.affinity): the new stub must still have every CPU, as the first one had.
    assert os.sched_getaffinity(after) == os.sched_getaffinity(0)


def test_a_stub_that_cannot_restart_fails_requests_clearly_until_it_can(server):
    client = httpclient.InferenceServerClient(server.url)
    broken = Path(server.model_repository) / "proc_flaky" / "broken"

    def infer(value):
        x = httpclient.InferInput("X", [1], "INT32")
        x.set_data_from_numpy(np.array([value], dtype=np.int32))
        return client.infer("proc_flaky", [x])

    broken.touch()
    try:
        with pytest.raises(InferenceServerException, match="is not healthy"):
            infer(1)
        with pytest.raises(InferenceServerException) as info:
            infer(0)
        assert re.search(r"Stub process 'proc_flaky_0\w*' failed to restart: RuntimeError: the "
                         r"model is broken", info.value.message()), info.value.message()
    finally:
        broken.unlink()
    assert int(infer(0).as_numpy("PID")[0]) > 0


def test_model_errors_keep_their_code_and_triton_text(server):
    client = httpclient.InferenceServerClient(server.url)
    pid = int(_crash_infer(client, 0).as_numpy("PID")[0])
    with pytest.raises(InferenceServerException) as info:
        _crash_infer(client, 3)
    assert info.value.status() == "400" and info.value.message() == "X must not be 3"
    with pytest.raises(InferenceServerException) as info:
        _crash_infer(client, 4)
    assert re.fullmatch(r"Failed to process the request\(s\) for model 'proc_crash_0\w*', "
                        r"message: ValueError: four is right out\n\nAt:\n"
                        r"  \S+/proc_crash/1/model\.py\(\d+\): execute\n", info.value.message())
    assert int(_crash_infer(client, 0).as_numpy("PID")[0]) == pid  # errors are not crashes


def test_backend_setting_puts_every_python_model_in_process_mode(tmp_path):
    (tmp_path / "plain" / "1").mkdir(parents=True)
    (tmp_path / "plain" / "config.pbtxt").write_text(
        'name: "plain"\nbackend: "python"\n' + textwrap.dedent(CRASH_CONFIG).replace(PROCESS, ""))
    (tmp_path / "plain" / "1" / "model.py").write_text(textwrap.dedent(CRASH_MODEL))
    with serve(tmp_path, "--backend-config=python,execution-mode=process") as srv:
        client = httpclient.InferenceServerClient(srv.url)
        x = httpclient.InferInput("X", [1], "INT32")
        x.set_data_from_numpy(np.array([0], dtype=np.int32))
        pid = int(client.infer("plain", [x]).as_numpy("PID")[0])
        workers = {int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
                   and _parent(int(p.name)) == srv.pid}
        assert pid != srv.pid and pid not in workers  # not the server, not a gunicorn worker
        assert _parent(pid) in workers  # a child of the worker that loaded the model


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None


def _bls_infer(client, model: str, value: int) -> tuple[int, str]:
    x = httpclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([value], dtype=np.int32))
    result = client.infer(model, [x])
    return int(result.as_numpy("Y")[0]), result.as_numpy("MSG")[0].decode()


def _count(client, model: str) -> int:
    return client.get_inference_statistics(model)["model_stats"][0]["inference_count"]


def test_bls_from_a_stub_reaches_the_server(server):
    client = httpclient.InferenceServerClient(server.url)
    before = _count(client, "callee_add")
    assert _bls_infer(client, "proc_bls", 0) == (15, "callee")  # (0..4 + 1), BYTES output too
    assert _bls_infer(client, "proc_bls", 1) == (1, "")  # ready; an unknown model is not
    assert _bls_infer(client, "proc_bls", 2) == (6, "5")  # 0+1+2+3 in 4 responses + the final
    y, msg = _bls_infer(client, "proc_bls", 3)
    assert y == 1 and "no_such_model" in msg and "Error when running inference" in msg
    assert _bls_infer(client, "proc_bls", 4) == (2 << 20, "")  # 1M elements of 2
    assert _bls_infer(client, "proc_bls", 5) == (0, "True")  # asked in initialize
    assert _bls_infer(client, "proc_bls", 6) == (600, "")  # 300 calls of 256 KiB each way
    assert _bls_infer(client, "proc_bls_async", 0) == (6, "")  # async_exec, three at once
    y, first = _bls_infer(client, "proc_bls", 7)  # cancelled after its first response
    assert first == "0" and 1 <= y < 100
    assert _bls_infer(client, "proc_bls", 8) == (15, "callee")  # itself, through x = 0
    # The callee counted the calls as requests of its own (they went through the server).
    assert _count(client, "callee_add") - before == 1 + 1 + 300 + 3 + 1  # x = 0, 4, 6, async, 8


def test_bls_from_threads_of_a_decoupled_stub(server):
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: responses.put(error or result))
    try:
        for n in range(20):  # the stub reads new requests while earlier ones make their calls
            x = grpcclient.InferInput("X", [1], "INT32")
            x.set_data_from_numpy(np.array([n], dtype=np.int32))
            client.async_stream_infer("proc_bls_threaded", [x], request_id=str(n))
        answers = [responses.get(timeout=60) for _ in range(20)]
    finally:
        client.stop_stream()
    assert all(not isinstance(a, Exception) for a in answers), answers
    assert sorted(int(a.get_response().id) for a in answers) == list(range(20))
    assert {int(a.as_numpy("Y")[0]) for a in answers} == {15}  # (0+1) + ... + (4+1)


def test_custom_metrics_of_stubs_are_exported(server):
    client = httpclient.InferenceServerClient(server.url)
    # Two instances (two stubs), the same family and labels: one counter, as in Triton.
    values = [_bls_infer(client, "proc_metrics", v)[0] for v in (0, 5, 50, 5)]
    assert all(v >= 1 for v in values)
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    assert "# HELP proc_requests requests seen in a stub" in text
    lines = text.splitlines()
    assert 'proc_requests{model="proc_metrics"} 4' in lines
    assert 'proc_sizes_count{model="proc_metrics"} 4' in lines
    assert 'proc_sizes_sum{model="proc_metrics"} 60' in lines
    assert 'proc_sizes_bucket{model="proc_metrics",le="1"} 1' in lines  # x = 0
    assert 'proc_sizes_bucket{model="proc_metrics",le="10"} 3' in lines  # 0, 5, 5
    assert 'proc_sizes_bucket{model="proc_metrics",le="+Inf"} 4' in lines


def test_the_server_never_imports_a_process_mode_model(server):
    client = httpclient.InferenceServerClient(server.url)
    # auto_complete_config filled the inputs and outputs: it ran, in a child of its own.
    config = client.get_model_config("proc_imports")
    assert [i["name"] for i in config["input"]] == ["X"]
    x = httpclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([0], dtype=np.int32))
    stub = int(client.infer("proc_imports", [x]).as_numpy("Y")[0])
    importers = [int(line) for line in
                 (Path(server.model_repository) / "proc_imports" / "1" / "imported_by.txt")
                 .read_text().split()]
    assert stub in importers and len(importers) == 2  # the auto-complete child and the stub
    workers = {int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
               and _parent(int(p.name)) == server.pid}
    assert server.pid not in importers and not workers & set(importers)


BASED_BACKEND = '''
import json, os, sys
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.dir = pb_utils.get_model_dir()

    def execute(self, requests):
        try:
            import envmarker
            marker = envmarker.VALUE
        except ImportError:
            marker = ""
        seen = json.dumps({"pid": os.getpid(), "dir": self.dir, "marker": marker})
        return [pb_utils.InferenceResponse([
            pb_utils.Tensor("Y", np.array([1], np.int32)),
            pb_utils.Tensor("MSG", np.array([seen.encode()], np.object_))]) for _ in requests]
'''


def test_a_python_based_backend_in_process_mode_and_in_its_environment(tmp_path):
    backends, repo = tmp_path / "backends", tmp_path / "repo"
    (backends / "seen_backend").mkdir(parents=True)
    (backends / "seen_backend" / "model.py").write_text(textwrap.dedent(BASED_BACKEND))
    io = textwrap.dedent(BLS_CALLER_CONFIG).replace(PROCESS, "")
    for name, extra in (("based_proc", PROCESS),
                        ("based_env", 'parameters { key: "EXECUTION_ENV_PATH" value { string_value: '
                                      '"$$TRITON_MODEL_DIRECTORY/pyenv" } }\n')):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(f'backend: "seen_backend"\n{io}{extra}')
    site = repo / "based_env" / "pyenv" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" \
        / "site-packages" / "envmarker"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("VALUE = 'based'\n")
    (repo / "based_env" / "pyenv" / "bin").mkdir()
    (repo / "based_env" / "pyenv" / "bin" / "activate").write_text("# activate\n")
    with serve(repo, "--backend-directory", str(backends)) as srv:
        client = httpclient.InferenceServerClient(srv.url)
        for name, marker in (("based_proc", ""), ("based_env", "based")):
            x = httpclient.InferInput("X", [1], "INT32")
            x.set_data_from_numpy(np.array([0], dtype=np.int32))
            seen = json.loads(client.infer(name, [x]).as_numpy("MSG")[0])
            assert b"triton_python_backend_stub" in Path(f"/proc/{seen['pid']}/cmdline").read_bytes()
            assert seen["dir"] == str(repo / name / "1")  # get_model_dir(): the version folder
            assert seen["marker"] == marker


class _Source:
    def __init__(self, families):
        self.families = families

    def metric_families(self):
        return self.families


def test_stub_metrics_merge_as_one_registry():
    from host.backends.python import custom_metrics, pb_utils  # noqa: F401 - the registry's module

    hist = ("h", "sizes", 2, [({"m": "a"}, (2, 6.0, [1.0], [1, 1]))])
    a = _Source([("c", "count", 0, [({"m": "a"}, (3.0, 0.0, None, None))]),
                 ("g", "gauge", 1, [({"m": "a"}, (7.0, 0.0, None, None))]), hist])
    b = _Source([("c", "count", 0, [({"m": "a"}, (4.0, 0.0, None, None)),
                                    ({"m": "b"}, (1.0, 0.0, None, None))]),
                 ("g", "gauge", 1, [({"m": "a"}, (9.0, 0.0, None, None))]), hist])
    custom_metrics.sources.add(a)
    custom_metrics.sources.add(b)
    try:
        merged = {name: (kind, {tuple(sorted(l.items())): v for l, v in cells})
                  for name, _, kind, cells in custom_metrics._merged()}
    finally:
        custom_metrics.sources.discard(a)
        custom_metrics.sources.discard(b)
    assert merged["c"][1][(("m", "a"),)][0] == 7.0  # counters add up
    assert merged["c"][1][(("m", "b"),)][0] == 1.0
    assert merged["g"][1][(("m", "a"),)][0] in (7.0, 9.0)  # a gauge: one source's value
    assert merged["h"][1][(("m", "a"),)] == (4, 12.0, [1.0], [2, 2])  # histograms add up


def test_implicit_state_of_a_sequence_crosses_the_stub(server):
    client = httpclient.InferenceServerClient(server.url)

    def send(value, sid, **flags):
        x = httpclient.InferInput("INPUT", [1], "INT32")
        x.set_data_from_numpy(np.array([value], dtype=np.int32))
        r = client.infer("proc_state", [x], sequence_id=sid, **flags)
        assert [o["name"] for o in r.get_response()["outputs"]] == ["OUTPUT"]
        return int(r.as_numpy("OUTPUT")[0])

    assert [send(5, 51, sequence_start=True), send(6, 51), send(7, 51)] == [5, 11, 18]
    assert send(2, 51, sequence_start=True) == 2  # START again: back to the initial state
    assert send(3, 51, sequence_end=True) == 5


def test_cancellation_reaches_a_model_inside_its_execute(server):
    record = Path(server.model_repository) / "proc_cancel" / "record.txt"
    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = grpcclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([1], dtype=np.int32))
    with pytest.raises(InferenceServerException, match="Deadline"):
        client.infer("proc_cancel", [x], client_timeout=1.0)
    wait_until(lambda: record.exists() and record.read_text() == "cancelled", timeout=20,
               message="the model in its stub process did not see the cancellation")


def test_batched_requests_and_shared_memory_tensors(server):
    import tritonclient.utils.shared_memory as shm

    client = httpclient.InferenceServerClient(server.url, concurrency=8)
    arrays = [np.arange(4, dtype=np.float32).reshape(1, 4) + i for i in range(8)]
    pending = []
    for a in arrays:
        x = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        x.set_data_from_numpy(a)
        pending.append(client.async_infer("proc_batched", [x]))
    for a, p in zip(arrays, pending):
        np.testing.assert_array_equal(p.get_result(timeout=60).as_numpy("OUTPUT0"), a * 2)
    # Inputs from, and outputs into, a registered system shared-memory region.
    handle = shm.create_shared_memory_region("proc_region", "/proc_region_test", 64)
    try:
        shm.set_shared_memory_region(handle, [arrays[3]])
        client.register_system_shared_memory("proc_region", "/proc_region_test", 64)
        x = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        x.set_shared_memory("proc_region", 16)
        out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
        out.set_shared_memory("proc_region", 16, offset=32)
        client.infer("proc_batched", [x], outputs=[out])
        got = shm.get_contents_as_numpy(handle, np.float32, [1, 4], offset=32)
        np.testing.assert_array_equal(got, arrays[3] * 2)
    finally:
        client.unregister_system_shared_memory("proc_region")
        shm.destroy_shared_memory_region(handle)
    stats = client.get_inference_statistics("proc_batched")["model_stats"][0]
    assert int(stats["inference_count"]) == 9


def test_statistics_are_counted_by_the_server(server):
    client = httpclient.InferenceServerClient(server.url)
    _values, inputs = _types_inputs(httpclient)
    before = client.get_inference_statistics("proc_types")["model_stats"][0]["inference_count"]
    for _ in range(3):
        client.infer("proc_types", inputs)
    after = client.get_inference_statistics("proc_types")["model_stats"][0]["inference_count"]
    assert int(after) - int(before) == 3
    # The server's /metrics count them too (the stub process exports nothing of its own).
    import urllib.request

    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    line = next(ln for ln in text.splitlines()
                if ln.startswith("nv_inference_count{") and 'model="proc_types"' in ln)
    assert float(line.rsplit(" ", 1)[1]) == float(after)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_unload_stops_the_stub_processes(server, tmp_path):
    client = httpclient.InferenceServerClient(server.url, concurrency=2)
    inp = httpclient.InferInput("DIR", [1], "BYTES")
    inp.set_data_from_numpy(np.array([str(tmp_path).encode()], dtype=object))
    pending = [client.async_infer("proc_busy", [inp]) for _ in range(2)]
    pids = {int(p.get_result(timeout=60).as_numpy("PID")[0]) for p in pending}
    assert len(pids) == 2 and all(_alive(p) for p in pids)
    client.unload_model("proc_busy")
    wait_until(lambda: not any(_alive(p) for p in pids), timeout=30,
               message=f"stub processes {pids} outlived the unload")
    model_dir = Path(server.model_repository) / "proc_busy"
    assert all((model_dir / f"finalized.{p}").exists() for p in pids)  # finalize ran in each
    client.load_model("proc_busy")
    assert client.is_model_ready("proc_busy")


# --- choosing the mode (no server) ------------------------------------------------------------

def _spec(parameters: str = ""):
    from host.backend import ModelSpec
    from host.config import parse_config_text

    config = parse_config_text('name: "m"\nbackend: "python"\n' + parameters, "m/config.pbtxt")
    return ModelSpec(name="m", version=1, repository=Path("/r"), path=Path("/r/m"), config=config)


def test_thread_mode_is_the_default_and_the_parameter_wins_over_the_backend_setting():
    from host.backends.python import settings

    assert settings.execution_mode(_spec(), {}) == "thread"
    assert settings.execution_mode(_spec(), {"execution-mode": "process"}) == "process"
    assert settings.execution_mode(_spec(PROCESS), {}) == "process"
    thread = 'parameters { key: "EXECUTION_MODE" value { string_value: "thread" } }'
    assert settings.execution_mode(_spec(thread), {"execution-mode": "process"}) == "thread"


def test_an_unknown_execution_mode_is_refused_with_its_name():
    from host.backends.python import settings
    from host.errors import InvalidArgumentError

    bad = 'parameters { key: "EXECUTION_MODE" value { string_value: "fork" } }'
    with pytest.raises(InvalidArgumentError, match="EXECUTION_MODE of model 'm': 'fork'"):
        settings.execution_mode(_spec(bad), {})
    with pytest.raises(InvalidArgumentError, match="execution-mode: 'many'"):
        settings.check({"execution-mode": "many"})


# --- the shared-memory arena (no server) ------------------------------------------------------

@pytest.mark.parametrize("datatype", ["BOOL", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16",
                                      "UINT32", "UINT64", "FP16", "FP32", "FP64", "BF16", "BYTES"])
def test_every_datatype_crosses_the_arena(datatype):
    from host import datatypes
    from host.backends.python.shm_arena import Arena

    if datatype == "BYTES":
        value = np.array([[b"x", b""], [b"\x00\xff", "\u00e9".encode()]], dtype=object)
    else:
        value = np.arange(6).reshape(2, 3).astype(datatypes.to_numpy(datatype))
    arena = Arena.create(4096, "dt")
    try:
        reader = Arena.attach(arena.name, arena.size)
        ref, _ = arena.write(datatype, value)
        got = reader.view(ref)
        assert got.dtype == value.dtype and got.shape == value.shape
        np.testing.assert_array_equal(got, value)
    finally:
        arena.unlink()


def test_arena_views_without_copy_gives_blocks_back_and_falls_back_inline_when_full():
    import gc

    from host.backends.python.shm_arena import Arena

    arena = Arena.create(1024, "test")
    try:
        reader = Arena.attach(arena.name, arena.size)  # the other process's mapping
        arena.unlink()
        assert not Path("/dev/shm", arena.name).exists()
        ref, offset = arena.write("FP32", np.arange(64, dtype=np.float32))
        assert ref[2][0] == "a" and arena.in_use() == 256
        released = []
        view = reader.view(ref, released.append)[3:]
        np.testing.assert_array_equal(view, np.arange(3, 64, dtype=np.float32))
        arena.mm[offset + 12:offset + 16] = np.float32(7).tobytes()  # the writer's memory, seen live
        assert view[0] == 7
        del view
        gc.collect()
        assert released == [offset]
        arena.free(offset)
        assert arena.in_use() == 0
        strings = np.array([b"a", b"", "\u00e9".encode()], dtype=object)
        ref, offset = arena.write("BYTES", strings)
        np.testing.assert_array_equal(reader.view(ref, released.append), strings)
        assert released[-1] == offset  # BYTES are copied out: the block is free at once
        arena.free(offset)
        big, offset = arena.write("INT64", np.arange(200, dtype=np.int64))  # 1600 B > 1024 B
        assert offset is None and big[2][0] == "i"
        np.testing.assert_array_equal(reader.view(big), np.arange(200))
        a, b, c = (arena.alloc(300) for _ in range(3))
        assert None not in (a, b, c) and arena.alloc(300) is None
        arena.free(a)
        arena.free(c)
        arena.free(b)  # merges with both neighbours: the whole arena is one block again
        assert arena.alloc(1024) == 0
    finally:
        arena.unlink()
