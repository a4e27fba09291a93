"""The in-process python backend, driven directly through the backend contract (no server)."""

from __future__ import annotations

import json
import logging
import sys
import textwrap
import threading
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import triton_python_backend_utils as pb_utils
from host.parameters import interpret
from host.backend import InstanceSpec, ModelSpec
from host.backends.python.backend import PythonBackend
from host.config import parse_config_text
from host.errors import Code, HostError, InternalError, InvalidArgumentError, NotFoundError
from host.inference import InferenceRequest, InferenceResponse, RequestedOutput, Tensor
from host.plugins.registry import Registry


# --- helpers ----------------------------------------------------------------------------------

class Collector:
    """Stands in for the host: records what `request.respond` sends, per request."""

    def __init__(self) -> None:
        self.responses: list[tuple[InferenceResponse | None, bool]] = []
        self.lock = threading.Lock()
        self.done = threading.Event()

    def __call__(self, response: InferenceResponse | None, final: bool) -> None:
        with self.lock:
            self.responses.append((response, final))
        if final:
            self.done.set()

    @property
    def final(self) -> InferenceResponse | None:
        assert self.responses and self.responses[-1][1], self.responses
        return self.responses[-1][0]


def write_model(tmp_path: Path, name: str, config: str, code: str, version: int = 1,
                extra_files: dict[str, str] | None = None) -> ModelSpec:
    model_dir = tmp_path / name
    vdir = model_dir / str(version)
    vdir.mkdir(parents=True, exist_ok=True)
    (vdir / "model.py").write_text(textwrap.dedent(code))
    for fname, text in (extra_files or {}).items():
        (vdir / fname).write_text(textwrap.dedent(text))
    cfg = parse_config_text(f'name: "{name}"\nbackend: "python"\n' + textwrap.dedent(config),
                            f"{name}/config.pbtxt")
    return ModelSpec(name=name, version=version, repository=tmp_path, path=model_dir, config=cfg,
                     backend="python")


class Loaded:
    """A model loaded through the whole lifecycle, with helpers to run requests."""

    def __init__(self, spec: ModelSpec, instances: int = 1, kind: str = "CPU",
                 auto_complete: bool = False) -> None:
        self.spec = spec
        self.backend = PythonBackend("python")
        self.backend.initialize()
        if auto_complete:
            self.backend.auto_complete_config(spec)
        self.model = self.backend.create_model(spec)
        self.model.initialize()
        self.instances = []
        for i in range(instances):
            inst = self.model.create_instance(
                InstanceSpec(name=f"{spec.name}_0_{i}", kind=kind, device_id=0, group=f"{spec.name}_0"))
            inst.initialize()
            self.instances.append(inst)

    def run(self, *requests: InferenceRequest, instance: int = 0) -> list[Collector]:
        collectors = []
        for r in requests:
            c = Collector()
            r.callback = c
            collectors.append(c)
        returned = self.instances[instance].execute(list(requests))
        if returned is not None:  # the host sends returned responses as each one's final
            assert len(returned) == len(requests)
            for r, resp in zip(requests, returned):
                r.respond(resp, True)
        return collectors

    def infer(self, inputs: dict[str, np.ndarray], outputs: list[str] | None = None,
              **kw) -> InferenceResponse:
        (c,) = self.run(request(self.spec.name, inputs, outputs, **kw))
        assert len(c.responses) == 1
        return c.final

    def close(self) -> None:
        for inst in self.instances:
            inst.finalize()
        self.model.finalize()
        self.backend.finalize()


def tensor(name: str, array: np.ndarray) -> Tensor:
    from host.datatypes import from_numpy
    return Tensor(name=name, datatype=from_numpy(array.dtype), shape=list(array.shape), data=array)


def request(model: str, inputs: dict[str, np.ndarray], outputs: list[str] | None = None,
            id: str = "", parameters: dict | None = None) -> InferenceRequest:
    req = InferenceRequest(
        model_name=model, id=id, inputs={k: tensor(k, v) for k, v in inputs.items()},
        outputs=[RequestedOutput(o) for o in outputs or []], parameters=parameters or {})
    interpret(req)  # as the host does before any backend sees a request
    return req


@pytest.fixture
def load():
    loaded: list[Loaded] = []

    def _load(spec: ModelSpec, **kw) -> Loaded:
        m = Loaded(spec, **kw)
        loaded.append(m)
        return m

    yield _load
    for m in loaded:
        m.close()


ADD_SUB_CONFIG = """
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 4 ] } ]
"""

ADD_SUB_CODE = """
import json
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.args = dict(args)
        config = json.loads(args["model_config"])
        self.dtype = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(config, "OUTPUT0")["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            out0 = pb_utils.Tensor("OUTPUT0", (in0 + in1).astype(self.dtype))
            out1 = pb_utils.Tensor("OUTPUT1", (in0 - in1).astype(self.dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out0, out1]))
        return responses
"""


# --- plugin -----------------------------------------------------------------------------------

def test_plugin_registers_python_backend():
    from host.backends.python import plugin

    reg = Registry()
    plugin.modelhost_register_backends(reg)
    backend = reg.backends["python"].factory("python")
    assert isinstance(backend, PythonBackend) and backend.name == "python"


# --- lifecycle and execute --------------------------------------------------------------------

def test_initialize_args(tmp_path, load):
    spec = write_model(tmp_path, "add_sub", ADD_SUB_CONFIG, ADD_SUB_CODE, version=3)
    m = load(spec, kind="GPU")
    args = m.instances[0].user.args
    assert set(args) == {"model_config", "model_instance_kind", "model_instance_name",
                         "model_instance_device_id", "model_repository", "model_version",
                         "model_name"}
    assert all(isinstance(v, str) for v in args.values())
    assert args["model_instance_kind"] == "GPU"
    assert args["model_instance_name"] == "add_sub_0_0"
    assert args["model_instance_device_id"] == "0"
    assert args["model_repository"] == str(tmp_path / "add_sub")
    assert args["model_version"] == "3"
    assert args["model_name"] == "add_sub"
    config = json.loads(args["model_config"])
    assert config["name"] == "add_sub"
    assert [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"]
    assert config["output"][0]["data_type"] == "TYPE_INT32"


def test_add_sub_int32(tmp_path, load):
    m = load(write_model(tmp_path, "add_sub", ADD_SUB_CONFIG, ADD_SUB_CODE))
    a = np.array([1, 2, 3, 4], dtype=np.int32)
    b = np.array([10, 20, 30, 40], dtype=np.int32)
    resp = m.infer({"INPUT0": a, "INPUT1": b}, id="r1")
    assert resp.error is None
    assert resp.id == "r1" and resp.model_name == "add_sub" and resp.model_version == "1"
    assert resp.output("OUTPUT0").datatype == "INT32"
    np.testing.assert_array_equal(resp.output("OUTPUT0").data, a + b)
    np.testing.assert_array_equal(resp.output("OUTPUT1").data, a - b)
    assert resp.output("OUTPUT1").shape == [4]


def test_batch_of_requests_and_output_pruning(tmp_path, load):
    m = load(write_model(tmp_path, "add_sub", ADD_SUB_CONFIG, ADD_SUB_CODE))
    reqs = [request("add_sub", {"INPUT0": np.full(4, i, np.int32), "INPUT1": np.ones(4, np.int32)},
                    outputs=["OUTPUT1"] if i % 2 else None) for i in range(5)]
    collectors = m.run(*reqs)
    for i, c in enumerate(collectors):
        resp = c.final
        assert resp.error is None
        names = [t.name for t in resp.outputs]
        assert names == (["OUTPUT1"] if i % 2 else ["OUTPUT0", "OUTPUT1"])
        np.testing.assert_array_equal(resp.output("OUTPUT1").data, np.full(4, i - 1))


def test_inputs_are_not_copied_and_request_fields(tmp_path, load):
    code = """
    import json
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            self.seen = []
            out = []
            for r in requests:
                t = r.inputs()[0]
                self.seen.append(dict(
                    array=t.as_numpy(), name=t.name(), shape=t.shape(), cpu=t.is_cpu(),
                    dtype=t.triton_dtype(), id=r.request_id(), corr=r.correlation_id(),
                    flags=r.flags(), params=json.loads(r.parameters()), timeout=r.timeout(),
                    requested=r.requested_output_names(), cancelled=r.is_cancelled()))
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", t.as_numpy())]))
            return out
    """
    cfg = """
    input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
    output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
    """
    m = load(write_model(tmp_path, "ident", cfg, code))
    data = np.arange(6, dtype=np.float32)
    m.infer({"IN": data}, id="abc",
            parameters={"sequence_id": 42, "sequence_start": True, "timeout": 1500, "temp": "hot",
                        "n": 3})
    seen = m.instances[0].user.seen[0]
    assert seen["array"] is data  # the model sees the request's own array
    assert seen["name"] == "IN" and seen["shape"] == [6] and seen["cpu"] is True
    assert seen["dtype"] == 11  # TRITONSERVER_TYPE_FP32
    assert seen["id"] == "abc" and seen["corr"] == 42
    assert seen["flags"] == pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
    assert seen["params"] == {"temp": "hot", "n": 3}
    assert seen["timeout"] == 1500
    assert seen["requested"] == ["OUT"]  # none requested: all outputs, as Triton's core fills in
    assert seen["cancelled"] is False


IDENTITY_CODE = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
            for r in requests]
"""


@pytest.mark.parametrize("datatype,dtype", [
    ("BOOL", np.bool_), ("INT8", np.int8), ("INT16", np.int16), ("INT32", np.int32),
    ("INT64", np.int64), ("UINT8", np.uint8), ("UINT16", np.uint16), ("UINT32", np.uint32),
    ("UINT64", np.uint64), ("FP16", np.float16), ("FP32", np.float32), ("FP64", np.float64),
    ("BF16", ml_dtypes.bfloat16), ("BYTES", np.object_),
])
def test_every_datatype_round_trips(tmp_path, load, datatype, dtype):
    type_name = "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"
    cfg = f"""
    input [ {{ name: "IN" data_type: {type_name} dims: [ 2, 3 ] }} ]
    output [ {{ name: "OUT" data_type: {type_name} dims: [ 2, 3 ] }} ]
    """
    code = IDENTITY_CODE
    if datatype == "BF16":  # as_numpy() raises for BF16, as in Triton: DLPack is the way
        code = code.replace('.as_numpy())', '.to_dlpack())').replace(
            'pb_utils.Tensor("OUT"', 'pb_utils.Tensor.from_dlpack("OUT"')
    m = load(write_model(tmp_path, f"ident_{datatype.lower()}", cfg, code))
    if datatype == "BYTES":
        data = np.array([b"a", b"", b"\x00b\x00", "é".encode(), b"x" * 100, b"\xff"],
                        dtype=np.object_).reshape(2, 3)
    elif datatype == "BOOL":
        data = np.array([True, False, True, True, False, False]).reshape(2, 3)
    else:
        data = np.arange(6).astype(dtype).reshape(2, 3)
    resp = m.infer({"IN": data})
    assert resp.error is None, resp.error
    out = resp.output("OUT")
    assert out.datatype == datatype and out.shape == [2, 3]
    assert out.data.dtype == data.dtype
    if datatype == "BYTES":
        assert out.data.tolist() == data.tolist()
        assert all(type(x) is bytes for x in out.data.flat)
    else:
        np.testing.assert_array_equal(out.data, data)


def test_bytes_outputs_are_normalized(tmp_path, load):
    code = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            a = np.array(["héllo", b"raw\\x00", 7], dtype=np.object_)
            b = np.array([b"ab", b"c\\x00d", b""], dtype=np.bytes_)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("A", a), pb_utils.Tensor("B", b)])
                    for r in requests]
    """
    cfg = """
    output [ { name: "A" data_type: TYPE_STRING dims: [ 3 ] },
             { name: "B" data_type: TYPE_STRING dims: [ 3 ] } ]
    """
    m = load(write_model(tmp_path, "strings", cfg, code))
    resp = m.infer({})
    assert resp.error is None
    assert resp.output("A").data.dtype == np.object_
    assert resp.output("A").data.tolist() == ["héllo".encode(), b"raw\x00", b"7"]
    assert resp.output("B").data.dtype == np.object_
    assert resp.output("B").data.tolist() == [b"ab", b"c\x00d", b""]


def test_output_keeps_its_own_datatype(tmp_path, load):
    """Triton's python backend does not hold an output to its configured datatype: the tensor
    goes out as the model made it (checked against Triton 2.51; its L0_http
    test_0_dimension_output relies on it)."""
    code = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.zeros(2, np.float64))])
                    for r in requests]
    """
    cfg = 'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]'
    m = load(write_model(tmp_path, "wrongtype", cfg, code))
    resp = m.infer({})
    assert resp.error is None
    assert resp.output("OUT").datatype == "FP64" and resp.output("OUT").data.tolist() == [0.0, 0.0]


# --- errors -----------------------------------------------------------------------------------

def test_exception_in_execute_fails_every_request(tmp_path, load):
    code = """
    def fail(what):
        raise ValueError(what)

    class TritonPythonModel:
        def execute(self, requests):
            fail("boom")
    """
    spec = write_model(tmp_path, "raiser", "", code)
    m = load(spec)
    collectors = m.run(request("raiser", {}), request("raiser", {}))
    model_py = spec.path / "1" / "model.py"
    for c in collectors:
        assert len(c.responses) == 1
        err = c.final.error
        assert isinstance(err, InternalError)
        # As Triton's stub words a Python error (pybind11): the model's frames, innermost first,
        # and none of the host's.
        assert err.message == ("Failed to process the request(s) for model 'raiser_0_0', "
                               "message: ValueError: boom\n\nAt:\n"
                               f"  {model_py}(3): fail\n"
                               f"  {model_py}(7): execute\n")


@pytest.mark.parametrize("body,fragment", [
    ("return [pb_utils.InferenceResponse([])]",
     "Number of InferenceResponse objects do not match the number of InferenceRequest objects"),
    ("return 'nope'", "Expected a list in the execute return, found type \"<class 'str'>\""),
    ("return [1, 2]", "Expected an 'InferenceResponse' object in the execute function return list"),
])
def test_malformed_returns(tmp_path, load, body, fragment):
    code = f"""
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            {body}
    """
    m = load(write_model(tmp_path, "bad", "", code))
    collectors = m.run(request("bad", {}), request("bad", {}))
    for c in collectors:
        err = c.final.error
        assert err is not None and err.code == Code.INTERNAL
        assert err.message.startswith("Failed to process the request(s) for model 'bad_0_0'")
        assert fragment.replace('"', "'") in err.message.replace('"', "'")


def test_none_return_without_response_is_an_error(tmp_path, load):
    code = """
    class TritonPythonModel:
        def execute(self, requests):
            return None
    """
    m = load(write_model(tmp_path, "nothing", "", code))
    (c,) = m.run(request("nothing", {}, id="q"))
    assert c.final.error is not None and "returned no response" in c.final.error.message


def test_triton_error_in_response(tmp_path, load):
    code = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                if r.request_id() == "bad":
                    out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                        "bad input", pb_utils.TritonError.INVALID_ARG)))
                elif r.request_id() == "default":
                    out.append(pb_utils.InferenceResponse(
                        output_tensors=[], error=pb_utils.TritonError("plain")))
                else:
                    out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.ones(1, np.int32))]))
            return out
    """
    m = load(write_model(tmp_path, "errs", "", code))
    good, bad, default = m.run(request("errs", {}, id="good"), request("errs", {}, id="bad"),
                               request("errs", {}, id="default"))
    assert good.final.error is None and good.final.output("OUT") is not None
    assert isinstance(bad.final.error, InvalidArgumentError)
    assert bad.final.error.message == "bad input"
    assert default.final.error.code == Code.INTERNAL and default.final.error.message == "plain"


def test_triton_error_api():
    err = pb_utils.TritonError("msg")
    assert err.message() == "msg" and err.code() == pb_utils.TritonError.INTERNAL
    for name, value in [("UNKNOWN", 0), ("INTERNAL", 1), ("NOT_FOUND", 2), ("INVALID_ARG", 3),
                        ("UNAVAILABLE", 4), ("UNSUPPORTED", 5), ("ALREADY_EXISTS", 6),
                        ("CANCELLED", 7)]:
        assert getattr(pb_utils.TritonError, name) == value
        assert pb_utils.TritonError("x", getattr(pb_utils.TritonError, name)).code() == value
    exc = pb_utils.TritonModelException("oops")
    assert isinstance(exc, Exception) and exc.message() == "oops" and str(exc) == "oops"


def test_missing_model_file(tmp_path):
    spec = write_model(tmp_path, "nofile", "", "")
    (spec.version_path / "model.py").unlink()
    backend = PythonBackend("python")
    with pytest.raises(NotFoundError) as info:
        backend.auto_complete_config(spec)
    assert str(spec.version_path / "model.py") in str(info.value)
    with pytest.raises(NotFoundError):
        backend.create_model(spec).initialize()


def test_default_model_filename(tmp_path, load):
    spec = write_model(tmp_path, "custom", 'default_model_filename: "main.py"', "")
    (spec.version_path / "model.py").rename(spec.version_path / "main.py")
    (spec.version_path / "main.py").write_text(textwrap.dedent(IDENTITY_CODE))
    m = load(spec)
    resp = m.infer({"IN": np.ones(2, np.float32)})
    assert resp.error is None and resp.output("OUT") is not None


def test_initialize_error_is_raised(tmp_path):
    code = """
    class TritonPythonModel:
        def initialize(self, args):
            raise RuntimeError("cannot start")
    """
    spec = write_model(tmp_path, "broken", "", code)
    backend = PythonBackend("python")
    model = backend.create_model(spec)
    model.initialize()
    inst = model.create_instance(InstanceSpec("broken_0_0", "CPU", 0, "broken_0"))
    with pytest.raises(InternalError, match="RuntimeError: cannot start"):
        inst.initialize()
    # (the model's synthetic package; other libraries may have modules with "broken" in the name)
    assert not [n for n in sys.modules if "broken" in n and n.startswith("_modelhost_python_")]


# --- decoupled --------------------------------------------------------------------------------

DECOUPLED_CONFIG = """
model_transaction_policy { decoupled: true }
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

DECOUPLED_CODE = """
import threading
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.errors = []
        self.threads = []

    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            sender = request.get_response_sender()
            if request.request_id() == "thread":
                t = threading.Thread(target=self.stream, args=(sender, n))
                t.start()
                self.threads.append(t)
            else:
                self.stream(sender, n)
        return None

    def stream(self, sender, n):
        for i in range(n):
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        try:
            sender.send(pb_utils.InferenceResponse([]))
        except pb_utils.TritonModelException as e:
            self.errors.append(e.message())
"""


def test_decoupled_many_responses_and_final(tmp_path, load):
    m = load(write_model(tmp_path, "repeat", DECOUPLED_CONFIG, DECOUPLED_CODE))
    c0, c1 = m.run(request("repeat", {"N": np.array([5], np.int32)}),
                   request("repeat", {"N": np.array([0], np.int32)}))
    assert [final for _, final in c0.responses] == [False] * 5 + [True]
    assert [int(r.output("OUT").data[0]) for r, _ in c0.responses[:5]] == [0, 1, 2, 3, 4]
    assert c0.responses[-1][0] is None
    assert c1.responses == [(None, True)]  # zero responses, just the final flag
    user = m.instances[0].user
    assert user.errors == ["Unable to send response. Response sender has been closed."] * 2


def test_decoupled_sending_from_a_thread_after_execute(tmp_path, load):
    m = load(write_model(tmp_path, "repeat", DECOUPLED_CONFIG, DECOUPLED_CODE))
    (c,) = m.run(request("repeat", {"N": np.array([50], np.int32)}, id="thread"))
    assert c.done.wait(10)
    for t in m.instances[0].user.threads:
        t.join()
    assert len(c.responses) == 51 and c.responses[-1] == (None, True)
    assert all(not final for _, final in c.responses[:-1])


def test_decoupled_sender_argument_checks(tmp_path, load):
    code = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            self.errors = []
            sender = requests[0].get_response_sender()
            for kwargs in [dict(), dict(flags=3)]:
                try:
                    sender.send(**kwargs)
                except pb_utils.TritonModelException as e:
                    self.errors.append(str(e))
            sender.send(pb_utils.InferenceResponse([]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
    """
    m = load(write_model(tmp_path, "checks", "model_transaction_policy { decoupled: true }", code))
    (c,) = m.run(request("checks", {}))
    assert m.instances[0].user.errors == [
        "Inference Response object must be provided when the response flags is set to zero.",
        "Unable to send response. Unsupported flag provided."]
    assert len(c.responses) == 1 and c.responses[0][1] and c.responses[0][0].error is None


def test_decoupled_execute_must_return_none(tmp_path, load):
    code = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([]) for r in requests]
    """
    m = load(write_model(tmp_path, "dec", "model_transaction_policy { decoupled: true }", code))
    (c,) = m.run(request("dec", {}))
    assert "is using the decoupled mode and the execute function must return None" in \
        c.final.error.message


def test_decoupled_exception_after_partial_responses(tmp_path, load):
    code = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            done = requests[0].get_response_sender()
            done.send(pb_utils.InferenceResponse([]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            part = requests[1].get_response_sender()
            part.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.ones(1, np.int32))]))
            self.sender = part
            raise KeyError("late")
    """
    m = load(write_model(tmp_path, "partial", "model_transaction_policy { decoupled: true }", code))
    done, part, untouched = m.run(request("partial", {}), request("partial", {}), request("partial", {}))
    assert len(done.responses) == 1 and done.final.error is None
    assert len(part.responses) == 2 and part.responses[0][0].error is None
    assert "KeyError: 'late'" in part.final.error.message
    assert len(untouched.responses) == 1 and "KeyError" in untouched.final.error.message
    with pytest.raises(pb_utils.TritonModelException, match="closed"):
        m.instances[0].user.sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def test_non_decoupled_response_sender(tmp_path, load):
    code = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            self.errors = []
            out = []
            for r in requests:
                if r.request_id() == "sender":
                    s = r.get_response_sender()
                    s.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.ones(1, np.int32))]))
                    try:
                        s.send(pb_utils.InferenceResponse([]))
                    except pb_utils.TritonModelException as e:
                        self.errors.append(str(e))
                    s.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    out.append(None)
                else:
                    out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.zeros(1, np.int32))]))
            return out
    """
    m = load(write_model(tmp_path, "nd", "", code))
    c_sender, c_plain = m.run(request("nd", {}, id="sender"), request("nd", {}, id="plain"))
    # one response per request, delivered with the final flag
    assert len(c_sender.responses) == 1 and c_sender.final.output("OUT").data.tolist() == [1]
    assert len(c_plain.responses) == 1 and c_plain.final.output("OUT").data.tolist() == [0]
    assert m.instances[0].user.errors == [
        "Unable to send response. Non-decoupled model cannot send more than one response."]


def test_a_sender_asked_for_after_the_returned_response_comes_closed(tmp_path, load):
    """The backend makes a request's sender only when the model asks for it; a model that
    answered by returning its response and asks later gets a closed sender, as before."""
    code = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.kept = []

        def execute(self, requests):
            self.kept.extend(requests)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.ones(1, np.int32))])
                    for _ in requests]
    """
    m = load(write_model(tmp_path, "later", "", code))
    (c,) = m.run(request("later", {}, id="r"))
    assert len(c.responses) == 1 and c.final.output("OUT").data.tolist() == [1]
    (kept,) = m.instances[0].user.kept
    sender = kept.get_response_sender()
    with pytest.raises(pb_utils.TritonModelException, match="Response sender has been closed"):
        sender.send(pb_utils.InferenceResponse([]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert kept.get_response_sender() is sender  # one sender per request
    assert len(c.responses) == 1  # nothing more reached the request


def test_async_execute(tmp_path, load):
    code = """
    import asyncio
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        async def execute(self, requests):
            await asyncio.sleep(0)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.full(1, 9, np.int32))])
                    for r in requests]
    """
    m = load(write_model(tmp_path, "asyncm", "", code))
    assert m.infer({}).output("OUT").data.tolist() == [9]


# --- auto-complete ----------------------------------------------------------------------------

AUTO_CODE = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        cfg = auto_complete_model_config
        cfg.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        cfg.add_input({"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [4], "optional": True})
        cfg.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        cfg.set_max_batch_size(8)
        cfg.set_dynamic_batching()
        assert cfg.as_dict()["name"] == "auto"
        return cfg

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() * 2)])
            for r in requests]
"""


def test_auto_complete_config(tmp_path, load):
    spec = write_model(tmp_path, "auto", "", AUTO_CODE)
    m = load(spec, auto_complete=True)
    cfg = spec.config
    assert cfg.max_batch_size == 8
    assert cfg.HasField("dynamic_batching")
    assert [(i.name, i.data_type, list(i.dims), i.optional) for i in cfg.input] == [
        ("INPUT0", 11, [4], False), ("INPUT1", 11, [4], True)]
    assert [(o.name, list(o.dims)) for o in cfg.output] == [("OUTPUT0", [4])]
    resp = m.infer({"INPUT0": np.ones((2, 4), np.float32)})
    np.testing.assert_array_equal(resp.output("OUTPUT0").data, np.full((2, 4), 2, np.float32))


def test_auto_complete_keeps_matching_config_and_rejects_conflicts(tmp_path):
    backend = PythonBackend("python")
    same = write_model(tmp_path, "auto", """
        max_batch_size: 8
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
        """, AUTO_CODE)
    backend.auto_complete_config(same)
    assert [i.name for i in same.config.input] == ["INPUT0", "INPUT1"]

    conflict = write_model(tmp_path / "b", "auto", """
        input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]
        """, AUTO_CODE)
    with pytest.raises(InvalidArgumentError, match="configuration expects datatype TYPE_INT32 for "
                                                   "input 'INPUT0', model provides TYPE_FP32"):
        backend.auto_complete_config(conflict)

    bigger = write_model(tmp_path / "c", "auto", "max_batch_size: 16", AUTO_CODE)
    with pytest.raises(InvalidArgumentError, match="specified max_batch_size 16"):
        backend.auto_complete_config(bigger)


def test_auto_complete_must_return_model_config(tmp_path):
    code = """
    class TritonPythonModel:
        @classmethod
        def auto_complete_config(cls, config):
            return None
    """
    spec = write_model(tmp_path, "noret", "", code)
    with pytest.raises(InvalidArgumentError, match="must return a valid pb.ModelConfig object"):
        PythonBackend("python").auto_complete_config(spec)


def test_auto_complete_without_hook_leaves_config(tmp_path):
    spec = write_model(tmp_path, "plain", ADD_SUB_CONFIG, ADD_SUB_CODE)
    before = spec.config.SerializeToString()
    PythonBackend("python").auto_complete_config(spec)
    assert spec.config.SerializeToString() == before


def test_model_config_wrapper_rules():
    cfg = pb_utils.ModelConfig(json.dumps({"name": "m", "max_batch_size": 0, "input": [
        {"name": "A", "data_type": "TYPE_INVALID", "dims": []}], "output": []}))
    cfg.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [2]})  # fills an incomplete input
    assert cfg.as_dict()["input"] == [{"name": "A", "data_type": "TYPE_FP32", "dims": [2]}]
    with pytest.raises(ValueError, match="dims"):
        cfg.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [3]})
    with pytest.raises(ValueError, match="contains property other than"):
        cfg.add_output({"name": "B", "data_type": "TYPE_FP32", "dims": [1], "optional": True})
    with pytest.raises(ValueError, match="missing 'dims' property"):
        cfg.add_output({"name": "B", "data_type": "TYPE_FP32"})
    cfg.set_model_transaction_policy({"decoupled": True})
    with pytest.raises(ValueError, match="trying to change decoupled property"):
        cfg.set_model_transaction_policy({"decoupled": False})
    seq = pb_utils.ModelConfig({"name": "s", "sequence_batching": {}})
    with pytest.raises(ValueError, match="sequence_batching"):
        seq.set_dynamic_batching()


def test_auto_complete_decoupled_policy(tmp_path):
    code = """
    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(config):
            config.set_model_transaction_policy(dict(decoupled=True))
            return config
    """
    spec = write_model(tmp_path, "autodec", "", code)
    PythonBackend("python").auto_complete_config(spec)
    assert spec.decoupled


# --- module isolation, finalize, helpers ------------------------------------------------------

ISOLATION_CODE = """
import numpy as np
import triton_python_backend_utils as pb_utils
import helper
from . import rel_helper

COUNTER = 0

class TritonPythonModel:
    def initialize(self, args):
        global COUNTER
        COUNTER += 1
        helper.CALLS.append(args["model_instance_name"])

    def execute(self, requests):
        global COUNTER
        COUNTER += 1
        return [pb_utils.InferenceResponse([
            pb_utils.Tensor("COUNT", np.array([COUNTER], np.int32)),
            pb_utils.Tensor("HELPER", np.array([len(helper.CALLS), rel_helper.VALUE], np.int32))])
            for r in requests]

    def finalize(self):
        pb_utils.Logger.log_info("finalized " + pb_utils.get_model_dir())
"""


def test_per_instance_module_isolation_and_finalize(tmp_path, load, caplog):
    spec = write_model(tmp_path, "iso", "", ISOLATION_CODE,
                       extra_files={"helper.py": "CALLS = []\n", "rel_helper.py": "VALUE = 7\n"})
    m = load(spec, instances=2)
    a, b = m.instances
    assert a.module is not b.module and a.module.__name__ != b.module.__name__
    assert "helper" not in sys.modules  # siblings stay private to the instance
    for _ in range(3):
        m.run(request("iso", {}), instance=0)
    (ca,) = m.run(request("iso", {}), instance=0)
    (cb,) = m.run(request("iso", {}), instance=1)
    assert ca.final.output("COUNT").data.tolist() == [5]  # initialize + 4 executes
    assert cb.final.output("COUNT").data.tolist() == [2]  # initialize + 1 execute
    assert ca.final.output("HELPER").data.tolist() == [1, 7]  # each instance has its own helper
    assert cb.final.output("HELPER").data.tolist() == [1, 7]

    with caplog.at_level(logging.INFO, logger="host.models.iso"):
        m.close()
        m.instances = []
    messages = [r.getMessage() for r in caplog.records if r.name == "host.models.iso"]
    assert messages == [f"finalized {spec.version_path}"] * 2
    assert not [n for n in sys.modules if n.startswith("_modelhost_python_iso")]


def test_two_models_with_same_sibling_name(tmp_path, load):
    code = """
    import numpy as np
    import triton_python_backend_utils as pb_utils
    import utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("V", np.array([utils.V], np.int32))])
                    for r in requests]
    """
    m1 = load(write_model(tmp_path, "one", "", code, extra_files={"utils.py": "V = 1\n"}))
    m2 = load(write_model(tmp_path, "two", "", code, extra_files={"utils.py": "V = 2\n"}))
    assert m1.infer({}).output("V").data.tolist() == [1]
    assert m2.infer({}).output("V").data.tolist() == [2]


def test_a_model_import_shows_its_directory_to_its_own_thread_only(tmp_path, load):
    # Models load in parallel: while one imports, another thread's imports must neither find the
    # model's siblings nor have sys.path change under them (the CI failure: a load that, racing
    # a python model's import, could not import an installed package).
    code = """
    import importlib
    import sys
    import threading
    import numpy as np
    import triton_python_backend_utils as pb_utils

    SEEN = {}

    # Code that is not the model's (defined outside its module, as another model's or the host's
    # would be); a thread the model's own code runs in finds its siblings, as in Triton.
    OTHER = (
        "def other_thread():\\n"
        "    SEEN['path'] = list(sys.path)\\n"
        "    try:\\n"
        "        importlib.import_module('private_sibling')\\n"
        "        SEEN['found'] = 1\\n"
        "    except ModuleNotFoundError:\\n"
        "        SEEN['found'] = 0\\n")
    scope = {"SEEN": SEEN, "sys": sys, "importlib": importlib}
    exec(OTHER, scope)

    worker = threading.Thread(target=scope["other_thread"])
    worker.start()
    worker.join()
    import private_sibling  # this thread, importing the model, does find it

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("V", np.array(
                [SEEN["found"], private_sibling.V, SEEN["path"] == sys.path], np.int32))])
                for r in requests]
    """
    before = list(sys.path)
    m = load(write_model(tmp_path, "private", "", code, extra_files={"private_sibling.py": "V = 5\n"}))
    assert m.infer({}).output("V").data.tolist() == [0, 5, 1]
    assert sys.path == before and "private_sibling" not in sys.modules


def test_logger_levels(tmp_path, load, caplog):
    code = """
    import threading
    import numpy as np
    import triton_python_backend_utils as pb_utils

    def from_thread():
        pb_utils.Logger.log_warn("from a thread")

    class TritonPythonModel:
        def execute(self, requests):
            pb_utils.Logger.log_info("info")
            pb_utils.Logger.log_warn("warn")
            pb_utils.Logger.log_error("error")
            pb_utils.Logger.log_verbose("verbose")
            pb_utils.Logger.log("explicit", pb_utils.Logger.LogLevel.ERROR)
            t = threading.Thread(target=from_thread)
            t.start()
            t.join()
            return [pb_utils.InferenceResponse([]) for r in requests]
    """
    m = load(write_model(tmp_path, "logs", "", code))
    with caplog.at_level(logging.DEBUG, logger="host.models.logs"):
        m.infer({})
    records = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "host.models.logs"]
    assert records == [("INFO", "info"), ("WARNING", "warn"), ("ERROR", "error"),
                       ("DEBUG", "verbose"), ("ERROR", "explicit"), ("WARNING", "from a thread")]
    assert all(r.filename == "model.py" for r in caplog.records if r.name == "host.models.logs")


def test_bls_without_a_server_is_an_error_response(tmp_path, load):
    """No host serves in this process: the call answers with an error, as for an unknown model
    (BLS against a real server: tests/test_bls.py)."""
    code = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            req = pb_utils.InferenceRequest(
                model_name="other", requested_output_names=["OUT"],
                inputs=[pb_utils.Tensor("IN", np.ones(1, np.float32))])
            return [pb_utils.InferenceResponse(error=req.exec().error())]
    """
    m = load(write_model(tmp_path, "bls", "", code))
    err = m.infer({}).error
    assert err.message == ("Model other - Error when running inference: Request for unknown "
                           "model: 'other' is not found")


def test_bls_is_refused_in_initialize_as_in_triton(tmp_path, load):
    code = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            pb_utils.InferenceRequest(
                model_name="other", requested_output_names=["OUT"],
                inputs=[pb_utils.Tensor("IN", np.ones(1, np.float32))]).exec()
    """
    with pytest.raises(HostError, match="BLS is only supported during the 'execute' function."):
        load(write_model(tmp_path, "bls_init", "", code))


# --- pb_utils helpers -------------------------------------------------------------------------

def test_type_helpers():
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert pb_utils.triton_string_to_numpy("TYPE_BOOL") is np.bool_
    assert pb_utils.triton_to_numpy_type(8) is np.int32
    assert pb_utils.triton_to_numpy_type(13) is np.object_
    assert pb_utils.numpy_to_triton_type(np.float16) == 10
    assert pb_utils.numpy_to_triton_type(np.object_) == 13
    assert pb_utils.numpy_to_triton_type(np.bytes_) == 13
    assert pb_utils.numpy_to_triton_type(np.str_) is None
    assert pb_utils.TRITON_STRING_TO_NUMPY["TYPE_UINT64"] is np.uint64
    with pytest.raises(KeyError):
        pb_utils.triton_string_to_numpy("TYPE_NOPE")


def test_config_and_tensor_lookups():
    config = {"input": [{"name": "A", "data_type": "TYPE_FP32"}], "output": [{"name": "B"}],
              "model_transaction_policy": {"decoupled": True}}
    assert pb_utils.get_input_config_by_name(config, "A")["data_type"] == "TYPE_FP32"
    assert pb_utils.get_input_config_by_name(config, "Z") is None
    assert pb_utils.get_output_config_by_name(config, "B") == {"name": "B"}
    assert pb_utils.using_decoupled_model_transaction_policy(config)
    resp = pb_utils.InferenceResponse([pb_utils.Tensor("X", np.zeros(1))])
    assert pb_utils.get_output_tensor_by_name(resp, "X").name() == "X"
    assert pb_utils.get_output_tensor_by_name(resp, "Y") is None
    assert not resp.has_error() and resp.error() is None and resp.parameters() == "{}"


def test_tensor_construction_rules():
    with pytest.raises(pb_utils.TritonModelException, match="empty string"):
        pb_utils.Tensor("", np.zeros(1))
    with pytest.raises(pb_utils.TritonModelException, match="not supported"):
        pb_utils.Tensor("U", np.array(["unicode"]))
    strided = np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2]
    t = pb_utils.Tensor("S", strided)
    assert t.as_numpy().flags.c_contiguous and t.shape() == [3, 2]
    np.testing.assert_array_equal(t.as_numpy(), strided)
    with pytest.raises(TypeError, match="incompatible"):
        pb_utils.InferenceResponse(output_tensors="x")
    with pytest.raises(pb_utils.TritonModelException, match="bool/int/str"):
        pb_utils.InferenceResponse([], parameters={"k": 1.5})


def test_dlpack_round_trip():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = pb_utils.Tensor("A", a)
    back = pb_utils.Tensor.from_dlpack("B", t.to_dlpack())
    assert back.name() == "B" and back.triton_dtype() == 11
    assert np.shares_memory(back.as_numpy(), a)
    np.testing.assert_array_equal(np.from_dlpack(t), a)  # Tensor implements __dlpack__
    bf = pb_utils.Tensor("BF", a.astype(ml_dtypes.bfloat16))
    assert bf.triton_dtype() == 14
    bf_back = pb_utils.Tensor.from_dlpack("BF2", bf.to_dlpack())
    assert bf_back.triton_dtype() == 14
    np.testing.assert_array_equal(bf_back._array, a.astype(ml_dtypes.bfloat16))
    with pytest.raises(pb_utils.TritonModelException, match="Tensor dtype is BF16 and cannot"):
        bf_back.as_numpy()
    with pytest.raises(pb_utils.TritonModelException, match="string tensors"):
        pb_utils.Tensor("S", np.array([b"x"], dtype=np.object_)).to_dlpack()


def test_serialize_helpers():
    arr = np.array([b"a\x00", "b", b""], dtype=np.object_)
    blob = pb_utils.serialize_byte_tensor(arr)
    assert pb_utils.deserialize_bytes_tensor(blob).tolist() == [b"a\x00", b"b", b""]


def test_metrics_kept_in_process():
    family = pb_utils.MetricFamily("requests", "count", pb_utils.MetricFamily.COUNTER)
    metric = family.Metric(labels={"model": "m"})
    metric.increment(2)
    assert metric.value() == 2
    with pytest.raises(pb_utils.TritonModelException):
        metric.set(1)


def test_an_embedding_program_keeps_its_argv(tmp_path, load, monkeypatch):
    """Only modelhost's own processes (`serve`, the process-mode stub) set Triton's `sys.argv ==
    [""]`; a program that embeds the host keeps its command line."""
    monkeypatch.setattr(sys, "argv", ["embedder", "--its-own-flag"])
    code = """
    import sys
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUT", np.array([len(sys.argv)], np.int32))]) for _ in requests]
    """
    config = """
    max_batch_size: 0
    output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
    """
    m = load(write_model(tmp_path, "argv", config, code))
    (c,) = m.run(request("argv", {}))
    assert c.final.error is None and c.final.outputs[0].data.tolist() == [2]
    assert sys.argv == ["embedder", "--its-own-flag"]
