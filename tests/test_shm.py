"""System shared memory end to end: the real tritonclient utilities against a real `modelhost serve`.

Every region here is created by the test (as a client would) with `tritonclient.utils.shared_memory`,
and the tests check both what the server answers and what is in the region afterwards.
"""

from __future__ import annotations

import base64
import json
import os
import threading
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import grpc
import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from host.testing import serve, wait_until

MODELS = Path(__file__).parent / "shm_models"
pytestmark = pytest.mark.modelhost_only

# (datatype, numpy values) for every Triton datatype; BF16 as ml_dtypes.bfloat16.
VALUES = {
    "BOOL": np.array([True, False, True]),
    "UINT8": np.array([0, 7, 255], np.uint8),
    "UINT16": np.array([1, 65535], np.uint16),
    "UINT32": np.array([1, 2**32 - 1], np.uint32),
    "UINT64": np.array([1, 2**64 - 1], np.uint64),
    "INT8": np.array([-128, 0, 127], np.int8),
    "INT16": np.array([-32768, 5], np.int16),
    "INT32": np.array([-(2**31), 9, 2**31 - 1], np.int32),
    "INT64": np.array([-(2**63), 2**63 - 1], np.int64),
    "FP16": np.array([0.5, -2.25, 65504], np.float16),
    "FP32": np.array([1.5, -0.0, 3.25e38], np.float32),
    "FP64": np.array([np.pi, -1e300], np.float64),
    "BF16": np.array([1.0, -3.5, 256.0], ml_dtypes.bfloat16),
    "BYTES": np.array([b"", b"a\x00b", "héllo".encode(), b"x" * 300], dtype=np.object_),
}


def _raw(datatype: str, arr: np.ndarray) -> bytes:
    return serialize_byte_tensor(arr).item() if datatype == "BYTES" else arr.tobytes()


@pytest.fixture(scope="module")
def server():
    with serve(MODELS, "--allow-client-shm=true") as s:
        yield s


@pytest.fixture(params=["http", "grpc"])
def protocol(request) -> str:
    return request.param


def _client(server, protocol: str):
    if protocol == "http":
        return httpclient.InferenceServerClient(server.url), httpclient
    return grpcclient.InferenceServerClient(server.grpc_url), grpcclient


class Region:
    """A client-created POSIX region, destroyed (unlinked) by the test at the end."""

    def __init__(self, size: int) -> None:
        self.name = "r" + uuid.uuid4().hex[:8]
        self.key = "/mh_test_" + self.name
        self.size = size
        self.handle = shm.create_shared_memory_region(self.name, self.key, size)

    @property
    def path(self) -> Path:
        return Path("/dev/shm") / self.key[1:]

    def write(self, data: bytes, offset: int = 0) -> None:
        shm.set_shared_memory_region(self.handle, [np.frombuffer(data, np.uint8)], offset=offset)

    def read(self, offset: int, size: int) -> bytes:
        return self.path.read_bytes()[offset:offset + size]

    def destroy(self) -> None:
        shm.destroy_shared_memory_region(self.handle)


@pytest.fixture
def regions():
    made: list[Region] = []

    def make(size: int) -> Region:
        made.append(Region(size))
        return made[-1]

    yield make
    for region in made:
        region.destroy()


def _expect_error(call, message: str, status: str | None = None) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    assert message in info.value.message(), info.value.message()
    if status is not None:
        assert info.value.status() == status, (info.value.status(), info.value.message())
    return info.value


# --- round trips -----------------------------------------------------------------------------

def test_every_datatype_in_and_out_at_offsets_in_one_region(server, protocol, regions) -> None:
    client, mod = _client(server, protocol)
    raws = {dt: _raw(dt, arr) for dt, arr in VALUES.items()}
    region = regions(2 * sum(len(r) + 13 for r in raws.values()) + 64)
    client.register_system_shared_memory(region.name, region.key, region.size)
    try:
        inputs, outputs, places = [], [], {}
        offset = 3  # odd offsets on purpose: regions are byte-addressed
        for dt, raw in raws.items():
            region.write(raw, offset)
            tensor = mod.InferInput(f"IN_{dt}", [len(VALUES[dt])], dt)
            tensor.set_shared_memory(region.name, len(raw), offset)
            inputs.append(tensor)
            out_offset = offset + len(raw) + 5
            out = mod.InferRequestedOutput(f"OUT_{dt}")
            out.set_shared_memory(region.name, len(raw), out_offset)
            outputs.append(out)
            places[dt] = (offset, out_offset)
            offset = out_offset + len(raw) + 8
        result = client.infer("identity_all", inputs, outputs=outputs)
        for dt, raw in raws.items():
            in_offset, out_offset = places[dt]
            assert region.read(out_offset, len(raw)) == raw, dt
            assert region.read(in_offset, len(raw)) == raw, dt  # the input is left as sent
            described = result.get_output(f"OUT_{dt}")
            shape = described["shape"] if protocol == "http" else list(described.shape)
            datatype = described["datatype"] if protocol == "http" else described.datatype
            assert (list(shape), datatype) == ([len(VALUES[dt])], dt)
        if protocol == "http":
            assert all("data" not in o and "parameters" not in o
                       for o in result.get_response()["outputs"])
    finally:
        client.unregister_system_shared_memory(region.name)


def test_shared_memory_inputs_with_outputs_in_the_body(server, protocol, regions) -> None:
    client, mod = _client(server, protocol)
    raw = _raw("BYTES", VALUES["BYTES"])
    region = regions(len(raw))
    region.write(raw)
    client.register_system_shared_memory(region.name, region.key, region.size)
    try:
        tensor = mod.InferInput("IN_BYTES", [4], "BYTES")
        tensor.set_shared_memory(region.name, len(raw))
        result = client.infer("identity_all", [tensor])
        assert list(result.as_numpy("OUT_BYTES")) == list(VALUES["BYTES"])
    finally:
        client.unregister_system_shared_memory(region.name)


def test_bytes_in_shared_memory_are_counted_as_in_a_request_body(server, protocol, regions) -> None:
    """Triton's core checks BYTES elements wherever they are: too few in a region is its text."""
    client, mod = _client(server, protocol)
    raw = _raw("BYTES", VALUES["BYTES"][:3])
    region = regions(len(raw))
    region.write(raw)
    client.register_system_shared_memory(region.name, region.key, region.size)
    try:
        tensor = mod.InferInput("IN_BYTES", [4], "BYTES")
        tensor.set_shared_memory(region.name, len(raw))
        with pytest.raises(InferenceServerException) as info:
            client.infer("identity_all", [tensor])
        assert ("expected 4 string elements for inference input 'IN_BYTES' for model "
                "'identity_all', got 3") in str(info.value)
        assert client.is_server_live()
    finally:
        client.unregister_system_shared_memory(region.name)


def test_register_window_at_an_offset_of_the_object(server, protocol, regions) -> None:
    client, mod = _client(server, protocol)
    region = regions(4096 + 64)
    data = np.arange(8, dtype=np.float32)
    region.write(data.tobytes(), 4096 + 16)
    # the registered region starts 4096 bytes into the object; tensor offsets are relative to it
    client.register_system_shared_memory(region.name, region.key, 64, offset=4096)
    try:
        tensor = mod.InferInput("IN_FP32", [8], "FP32")
        tensor.set_shared_memory(region.name, 32, offset=16)
        np.testing.assert_array_equal(client.infer("identity_all", [tensor]).as_numpy("OUT_FP32"), data)
    finally:
        client.unregister_system_shared_memory(region.name)


# --- register, unregister, status ------------------------------------------------------------

def test_status_register_unregister(server, protocol, regions) -> None:
    client, _ = _client(server, protocol)
    a, b = regions(64), regions(128)
    client.register_system_shared_memory(a.name, a.key, 64)
    client.register_system_shared_memory(b.name, b.key, 100, offset=28)
    try:
        assert {a.key, b.key} <= _mapped_keys(server)  # (so the check below can see a mapping)
        status = client.get_system_shared_memory_status()
        if protocol == "http":
            got = {s["name"]: (s["key"], s["offset"], s["byte_size"]) for s in status}
        else:
            got = {n: (s.key, s.offset, s.byte_size) for n, s in status.regions.items()}
        assert got[a.name] == (a.key, 0, 64) and got[b.name] == (b.key, 28, 100)
        one = client.get_system_shared_memory_status(a.name)
        assert (len(one) if protocol == "http" else len(one.regions)) == 1
        _expect_error(lambda: client.register_system_shared_memory(a.name, b.key, 8),
                      f"shared memory region '{a.name}' already in manager")
        _expect_error(lambda: client.get_system_shared_memory_status("missing"),
                      "Unable to find system shared memory region: 'missing'")
        client.unregister_system_shared_memory("never-registered")  # succeeds, as in Triton
        client.unregister_system_shared_memory(a.name)
        remaining = client.get_system_shared_memory_status()
        names = [s["name"] for s in remaining] if protocol == "http" else list(remaining.regions)
        assert a.name not in names and b.name in names
    finally:
        client.unregister_system_shared_memory()  # all
    left = client.get_system_shared_memory_status()
    assert not [s for s in (left if protocol == "http" else left.regions)]
    # the host unmapped its views; the client's objects are intact
    wait_until(lambda: not {a.key, b.key} & _mapped_keys(server),
               message="the server still maps an unregistered region")
    assert a.path.stat().st_size == 64 and b.path.stat().st_size == 128


def _mapped_keys(server) -> set[str]:
    """Keys of the /dev/shm objects the server's processes (gunicorn master and worker) map."""
    pids = [server.pid] + [int(p) for p in Path(f"/proc/{server.pid}/task/{server.pid}/children")
                           .read_text().split()]
    keys = set()
    for pid in pids:
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            path = line.split(maxsplit=5)[-1] if len(line.split()) == 6 else ""
            if path.startswith("/dev/shm/"):
                keys.add("/" + path[len("/dev/shm/"):])
    return keys


@pytest.mark.parametrize("key, message, status", [  # Triton's answers (shared_memory_manager.cc)
    ("/does_not_exist_mh", "Unable to open shared memory region: '/does_not_exist_mh'", "500"),
    ("/../../etc/passwd", "Unable to open shared memory region", "500"),
    ("../etc/passwd", "Unable to open shared memory region", "500"),
    ("/a/b", "Unable to open shared memory region", "500"),
    ("/..", "Unable to open shared memory region", "500"),
    ("", "cannot register shared memory region 'bad' - invalid shm key ''", "400"),
    ("///", "cannot register shared memory region 'bad' - invalid shm key '///'", "400"),
    ("/triton_python_backend_shm_region_x",
     "cannot register shared memory region 'bad' with key '/triton_python_backend_shm_region_x' as "
     "the key contains the reserved prefix 'triton_python_backend_shm_region_'", "400"),
])
def test_bad_keys_are_refused(server, protocol, key, message, status) -> None:
    client, _ = _client(server, protocol)
    grpc_status = {"500": "StatusCode.INTERNAL", "400": "StatusCode.INVALID_ARGUMENT"}[status]
    _expect_error(lambda: client.register_system_shared_memory("bad", key, 16), message,
                  status if protocol == "http" else grpc_status)
    assert client.is_server_live()


def test_symlinks_in_dev_shm_are_not_followed(server, protocol, tmp_path) -> None:
    client, _ = _client(server, protocol)
    target = tmp_path / "secret"
    target.write_bytes(b"s" * 64)
    link = Path("/dev/shm") / f"mh_link_{uuid.uuid4().hex[:8]}"
    link.symlink_to(target)
    try:
        _expect_error(lambda: client.register_system_shared_memory("lnk", "/" + link.name, 16),
                      "Unable to open shared memory region")
    finally:
        link.unlink()
    assert target.read_bytes() == b"s" * 64


def test_region_bigger_than_the_object_is_refused(server, protocol, regions) -> None:
    client, _ = _client(server, protocol)
    region = regions(64)
    for offset, size in ((0, 65), (60, 8), (2**63, 8)):
        _expect_error(lambda: client.register_system_shared_memory(region.name, region.key, size,
                                                                   offset=offset),
                      f"failed to register shared memory region '{region.name}': invalid args",
                      "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")
    assert region.path.stat().st_size == 64  # never resized


# --- errors at inference ---------------------------------------------------------------------

def _http_infer(server, body: dict) -> tuple[int, str]:
    req = urllib.request.Request(f"{server.http_url}/v2/models/identity_all/infer",
                                 data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())["error"]


def _grpc_infer(server, params: dict, contents: list[float] | None = None,
                oparams: dict | None = None) -> tuple[grpc.StatusCode, str]:
    request = pb.ModelInferRequest(model_name="identity_all")
    tensor = request.inputs.add(name="IN_FP32", datatype="FP32", shape=[4])
    for key, value in params.items():
        if isinstance(value, str):
            tensor.parameters[key].string_param = value
        elif value > 2**63 - 1:
            tensor.parameters[key].uint64_param = value
        else:
            tensor.parameters[key].int64_param = value
    if contents:
        tensor.contents.fp32_contents.extend(contents)
    if oparams is not None:
        out = request.outputs.add(name="OUT_FP32")
        for key, value in oparams.items():
            if isinstance(value, str):
                out.parameters[key].string_param = value
            else:
                out.parameters[key].uint64_param = value
    with grpc.insecure_channel(server.grpc_url) as channel:
        try:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
            return grpc.StatusCode.OK, ""
        except grpc.RpcError as err:
            return err.code(), err.details()


def _in(params: dict, data: list | None = None) -> dict:
    tensor = {"name": "IN_FP32", "datatype": "FP32", "shape": [4], "parameters": params}
    if data is not None:
        tensor["data"] = data
    return tensor


NO_FIELD = ("Input must set only one of the following fields: 'data', 'binary_data_size' in "
            "'parameters', 'shared_memory_region' in 'parameters'. But no field is set")
INFER_ERRORS = [  # (input parameters, requested-output parameters, status, message)
    ({"shared_memory_region": "{r}"}, None, 400,
     "'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter for tensor 'IN_FP32'"),
    # without a region: Triton's gRPC front end words it, the offset looked at first; over HTTP a
    # size or an offset without a region refers to no shared memory (the input then has no data)
    ({"shared_memory_byte_size": 16}, None, 400, {
        "http": NO_FIELD,
        "grpc": "'shared_memory_byte_size' can not be specified without 'shared_memory_region' "
                "parameter for tensor 'IN_FP32'"}),
    ({"shared_memory_byte_size": 16, "shared_memory_offset": 8}, None, 400, {
        "http": NO_FIELD,
        "grpc": "'shared_memory_offset' can not be specified without 'shared_memory_region' "
                "parameter for tensor 'IN_FP32'"}),
    ({"shared_memory_region": "nope", "shared_memory_byte_size": 16}, None, 404,
     "Unable to find shared memory region: 'nope'"),
    ({"shared_memory_region": "{r}", "shared_memory_byte_size": 16, "shared_memory_offset": 65}, None, 400,
     "Invalid offset for shared memory region: '{r}'"),
    ({"shared_memory_region": "{r}", "shared_memory_byte_size": 0, "shared_memory_offset": 64}, None, 400,
     "Invalid offset for shared memory region: '{r}'"),  # an offset must fall inside the region
    ({"shared_memory_region": "{r}", "shared_memory_byte_size": 16, "shared_memory_offset": 56}, None, 400,
     "Invalid offset + byte size for shared memory region: '{r}'"),
    ({"shared_memory_region": "{r}", "shared_memory_byte_size": 2**63 - 1, "shared_memory_offset": 8}, None,
     400, "Invalid offset + byte size for shared memory region: '{r}'"),  # would wrap in int64
    ({"shared_memory_region": "{r}", "shared_memory_byte_size": 2**64 - 8, "shared_memory_offset": 8}, None,
     400, "Integer overflow detected: byte_size (18446744073709551608) + offset (8) exceeds maximum value "
          "(18446744073709551615) for region '{r}'"),
    ({"shared_memory_region": "{r}", "shared_memory_byte_size": 12}, None, 400,
     "input byte size mismatch for input 'IN_FP32' for model 'identity_all'. Expected 16, got 12"),
    ({"shared_memory_region": "{r}", "shared_memory_byte_size": 16},
     {"shared_memory_region": "{r}", "shared_memory_byte_size": 8, "shared_memory_offset": 32}, 400,
     "shared memory size specified with the request for output 'OUT_FP32' (8 bytes) should be at least "
     "16 bytes to hold the results"),
    ({"shared_memory_region": "{r}", "shared_memory_byte_size": 16},
     {"shared_memory_region": "nope", "shared_memory_byte_size": 16}, 404,
     "Unable to find shared memory region: 'nope'"),
    ({"shared_memory_region": "{r}", "shared_memory_byte_size": 16},
     {"shared_memory_region": "{r}", "shared_memory_byte_size": 16, "shared_memory_offset": 60}, 400,
     "Invalid offset + byte size for shared memory region: '{r}'"),
]
_GRPC_STATUS = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND}


def _fill(params: dict | None, name: str) -> dict | None:
    if params is None:
        return None
    return {k: v.format(r=name) if isinstance(v, str) else v for k, v in params.items()}


@pytest.mark.parametrize("params, oparams, status, message", INFER_ERRORS)
def test_inference_errors_http(server, regions, params, oparams, status, message) -> None:
    region = regions(64)
    region.write(bytes(range(64)))
    client = httpclient.InferenceServerClient(server.url)
    client.register_system_shared_memory(region.name, region.key, 64)
    try:
        body = {"inputs": [_in(_fill(params, region.name))]}
        if oparams is not None:
            body["outputs"] = [{"name": "OUT_FP32", "parameters": _fill(oparams, region.name)}]
        message = message["http"] if isinstance(message, dict) else message
        assert _http_infer(server, body) == (status, message.format(r=region.name))
        assert region.read(0, 64) == bytes(range(64))  # nothing written on a failed request
    finally:
        client.unregister_system_shared_memory(region.name)


@pytest.mark.parametrize("params, oparams, status, message", INFER_ERRORS)
def test_inference_errors_grpc(server, regions, params, oparams, status, message) -> None:
    region = regions(64)
    region.write(bytes(range(64)))
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.register_system_shared_memory(region.name, region.key, 64)
    try:
        message = message["grpc"] if isinstance(message, dict) else message
        got = _grpc_infer(server, _fill(params, region.name), oparams=_fill(oparams, region.name))
        assert got == (_GRPC_STATUS[status], message.format(r=region.name))
        assert region.read(0, 64) == bytes(range(64))
    finally:
        client.unregister_system_shared_memory(region.name)


def test_data_together_with_shared_memory_is_refused(server, regions) -> None:
    region = regions(64)
    client = httpclient.InferenceServerClient(server.url)
    client.register_system_shared_memory(region.name, region.key, 64)
    try:
        params = {"shared_memory_region": region.name, "shared_memory_byte_size": 16}
        status, message = _http_infer(server, {"inputs": [_in(params, [1, 2, 3, 4])]})
        assert status == 400 and "But set 'data' 'shared_memory_region'" in message
        assert _grpc_infer(server, params, contents=[1, 2, 3, 4]) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "unexpected 'content' provided when using shared memory for input tensor 'IN_FP32' "
            "for model 'identity_all'")
        out = {"name": "OUT_FP32", "parameters": {**params, "binary_data": True}}
        status, message = _http_infer(server, {"inputs": [_in(params)], "outputs": [out]})
        assert (status, message) == (400, "Output can't set both 'shared_memory_region' and 'binary_data'")
        for bad in ({"shared_memory_offset": -1}, {"shared_memory_offset": 2**64},
                    {"shared_memory_byte_size": "16"}, {"shared_memory_region": 5}):
            status, message = _http_infer(server, {"inputs": [_in({**params, **bad})]})
            assert status == 400 and message.startswith("Unable to parse 'shared_memory_"), message
    finally:
        client.unregister_system_shared_memory(region.name)
    assert client.is_server_ready()


# --- lifetimes -------------------------------------------------------------------------------

def test_unregister_during_a_request_keeps_its_memory_valid(server, protocol, regions, tmp_path) -> None:
    client, mod = _client(server, protocol)
    region = regions(64)
    data = np.array([1.5, 2.5, 3.5, 4.5], np.float32)
    region.write(data.tobytes())
    client.register_system_shared_memory(region.name, region.key, 64)
    tensor = mod.InferInput("INPUT0", [4], "FP32")
    tensor.set_shared_memory(region.name, 16)
    out = mod.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory(region.name, 16, offset=32)
    got: dict = {}

    def run() -> None:
        try:  # a client of its own: tritonclient's HTTP client belongs to the thread that made it
            own, _ = _client(server, protocol)
            got["result"] = own.infer("gated_identity", [tensor], outputs=[out],
                                      parameters={"gate": str(tmp_path)})
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            got["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    wait_until(lambda: (tmp_path / "started").exists(), timeout=30, message="request never started")
    client.unregister_system_shared_memory(region.name)

    def listed() -> bool:
        status = client.get_system_shared_memory_status()
        return region.name in (str(status) if protocol == "grpc" else json.dumps(status))

    assert listed()  # as in Triton: listed until the last request using it finishes
    # ... and usable by new requests meanwhile (Triton's L0_shared_memory
    # test_unregister_shm_during_inference_multiple_req); another model, as this one is busy
    other = mod.InferInput("IN_FP32", [4], "FP32")
    other.set_shared_memory(region.name, 16)
    again = client.infer("identity_all", [other], outputs=[mod.InferRequestedOutput("OUT_FP32")])
    assert again.as_numpy("OUT_FP32").tolist() == data.tolist()
    assert listed() and not got
    (tmp_path / "release").touch()
    thread.join(30)
    assert "error" not in got, str(got.get("error"))
    assert not listed()
    assert np.frombuffer(region.read(32, 16), np.float32).tolist() == data.tolist()
    # a new request cannot use the unregistered name
    _expect_error(lambda: client.infer("gated_identity", [tensor]),
                  f"Unable to find shared memory region: '{region.name}'")


def test_region_outlives_the_server(regions) -> None:
    region = regions(32)
    region.write(b"k" * 32)
    with serve(MODELS, "--allow-client-shm=true") as s:
        client = httpclient.InferenceServerClient(s.url)
        client.register_system_shared_memory(region.name, region.key, 32)
        tensor = httpclient.InferInput("IN_UINT8", [8], "UINT8")
        tensor.set_shared_memory(region.name, 8)
        out = httpclient.InferRequestedOutput("OUT_UINT8")
        out.set_shared_memory(region.name, 8, offset=16)
        client.infer("identity_all", [tensor], outputs=[out])
        # stopped with the region still registered
    assert region.path.exists() and region.path.stat().st_size == 32
    assert region.read(0, 32) == b"k" * 32  # the identity wrote the same bytes at 16


def test_disabled_by_default(tmp_path, regions) -> None:
    region = regions(16)
    with serve(MODELS) as s:
        http = httpclient.InferenceServerClient(s.url)
        assert "system_shared_memory" not in http.get_server_metadata()["extensions"]
        assert http.get_system_shared_memory_status() == []
        disabled = ("Client shared memory is disabled. Start the server with "
                    "'--allow-client-shm=true' to enable.")
        _expect_error(lambda: http.unregister_system_shared_memory(), disabled, "501")
        _expect_error(lambda: http.unregister_cuda_shared_memory("y"), disabled, "501")
        _expect_error(lambda: http.register_system_shared_memory("x", region.key, 16), disabled, "501")
        grpc_client = grpcclient.InferenceServerClient(s.grpc_url)
        _expect_error(lambda: grpc_client.unregister_system_shared_memory(), disabled,
                      "StatusCode.UNIMPLEMENTED")
        tensor = httpclient.InferInput("IN_UINT8", [4], "UINT8")
        tensor.set_shared_memory("x", 4)
        _expect_error(lambda: http.infer("identity_all", [tensor]),
                      "Unable to find shared memory region: 'x'")


def test_cuda_extension_without_a_gpu_says_so(server, protocol) -> None:
    from host.shm import cuda
    if cuda.unavailable_reason() is None:
        pytest.skip("a CUDA device is present: tests/test_shm_cuda.py covers it")
    client, _ = _client(server, protocol)
    meta = client.get_server_metadata()
    extensions = meta["extensions"] if protocol == "http" else list(meta.extensions)
    assert "system_shared_memory" in extensions and "cuda_shared_memory" not in extensions
    client.unregister_cuda_shared_memory()
    status = client.get_cuda_shared_memory_status()
    assert not (status if protocol == "http" else status.regions)
    handle = base64.b64encode(b"\0" * 64) if protocol == "http" else b"\0" * 64
    _expect_error(lambda: client.register_cuda_shared_memory("c", handle, 0, 64),
                  "failed to register shared memory region: invalid args",
                  "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")


def _register_error(server, path: str, body: dict) -> tuple[int, str]:
    request = urllib.request.Request(f"http://{server.url}{path}", data=json.dumps(body).encode(),
                                     method="POST")
    try:
        urllib.request.urlopen(request, timeout=60)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())["error"]
    raise AssertionError(f"{path} {body} was accepted")


def test_register_texts_of_malformed_bodies(server) -> None:
    """Triton's texts, checked against Triton 2.51: TritonJson's for members of another JSON type
    (Triton answers them with 500; bad input is a 400 here); CUDA's fields are read before the
    handle is judged, and the handle before any device is looked for."""
    system = "/v2/systemsharedmemory/region/r1/register"
    not_uint = "attempt to access JSON non-unsigned-integer as unsigned-integer"
    assert _register_error(server, system, {"key": "/k", "offset": -1, "byte_size": 16}) == (400, not_uint)
    assert _register_error(server, system, {"key": "/k", "byte_size": "16"}) == (400, not_uint)
    assert _register_error(server, system, {"key": 5, "byte_size": 16}) == (
        400, "attempt to access JSON non-string as string")
    assert _register_error(server, system, {"key": "/k"}) == (
        400, "Shared memory register request has no 'byte_size' field")
    cuda = "/v2/cudasharedmemory/region/c1/register"
    handle = {"b64": base64.b64encode(b"\0" * 64).decode()}
    assert _register_error(server, cuda, {"byte_size": 16, "device_id": 0}) == (
        400, "Shared memory register request has no 'raw_handle' field")
    assert _register_error(server, cuda, {"raw_handle": {}, "byte_size": 16, "device_id": 0}) == (
        400, "attempt to access non-existing object member 'b64'")
    assert _register_error(server, cuda, {"raw_handle": handle, "device_id": 0}) == (
        400, "attempt to access non-existing object member 'byte_size'")
    assert _register_error(server, cuda, {"raw_handle": handle, "byte_size": 16, "device_id": -1}) == (
        400, not_uint)
    assert _register_error(server, cuda, {"raw_handle": {"b64": "AAAA"}, "byte_size": 16, "device_id": 0}) == (
        400, "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
    assert _register_error(server, "/v2/repository/models/nothing/unload",
                           {"parameters": {"unload_dependents": "yes"}}) == (
        400, "Unable to parse 'unload_dependents': attempt to access JSON non-boolean as boolean")


def test_os_never_sees_a_truncate(server, regions) -> None:
    """After a whole session of use the object keeps its size and its bytes outside the outputs."""
    region = regions(4096)
    before = os.urandom(4096)
    region.write(before)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.register_system_shared_memory(region.name, region.key, 4096)
    tensor = grpcclient.InferInput("IN_INT8", [100], "INT8")
    tensor.set_shared_memory(region.name, 100, offset=1000)
    out = grpcclient.InferRequestedOutput("OUT_INT8")
    out.set_shared_memory(region.name, 100, offset=3000)
    for _ in range(5):
        client.infer("identity_all", [tensor], outputs=[out])
    client.unregister_system_shared_memory()
    after = region.read(0, 4096)
    assert len(after) == 4096
    assert after[3000:3100] == before[1000:1100]
    assert after[:3000] == before[:3000] and after[3100:] == before[3100:]


def test_cache_hashes_shared_memory_inputs_and_writes_hits_into_regions(regions) -> None:
    region = regions(64)
    first = np.array([1, 2, 3, 4], np.float32)
    region.write(first.tobytes())
    with serve(MODELS, "--allow-client-shm=true", "--cache-config", "local,size=1048576") as s:
        client = grpcclient.InferenceServerClient(s.grpc_url)
        client.register_system_shared_memory(region.name, region.key, 64)
        tensor = grpcclient.InferInput("INPUT0", [4], "FP32")
        tensor.set_shared_memory(region.name, 16)
        out = grpcclient.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory(region.name, 16, offset=32)

        def infer_and_read() -> list[float]:
            region.write(bytes(16), 32)  # clear the output window: a hit must write it again
            client.infer("identity_cached", [tensor], outputs=[out])
            return np.frombuffer(region.read(32, 16), np.float32).tolist()

        def counts() -> tuple[int, int, int]:
            stats = client.get_inference_statistics("identity_cached").model_stats[0]
            return (stats.inference_stats.cache_hit.count, stats.inference_stats.cache_miss.count,
                    stats.execution_count)

        assert infer_and_read() == first.tolist() and counts() == (0, 1, 1)
        assert infer_and_read() == first.tolist() and counts() == (1, 1, 1)  # from the cache
        region.write(np.array([9, 8, 7, 6], np.float32).tobytes())  # same request, new bytes
        assert infer_and_read() == [9, 8, 7, 6] and counts() == (1, 2, 2)
        client.unregister_system_shared_memory()
