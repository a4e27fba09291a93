"""tritonclient's asyncio clients (`tritonclient.http.aio`, `tritonclient.grpc.aio`) against a real server.

Covers header forwarding (forwarded headers reach the `echo` model as parameters; reserved names are
refused) and system shared memory (register, infer with input and output in the region, status,
unregister). The sync clients' tests for the same are in test_header_forward.py and test_shm.py.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio
import tritonclient.http.aio as httpaio
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from host.testing import serve

pytestmark = pytest.mark.modelhost_only

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("aio_models")
    shutil.copytree(TESTS / "obs_models" / "echo", repository / "echo")
    shutil.copytree(TESTS / "shm_models" / "identity_all", repository / "identity_all")
    with serve(repository, "--allow-client-shm=true",
               "--http-header-forward-pattern", "^X-FWD|Priority|MY_HEADER",
               "--grpc-header-forward-pattern", "FWD|triton") as process:
        yield process


@pytest.fixture(params=["http", "grpc"])
def protocol(request) -> str:
    return request.param


def _client(server, protocol: str):
    if protocol == "http":
        return httpaio, httpaio.InferenceServerClient(server.url)
    return grpcaio, grpcaio.InferenceServerClient(server.grpc_url)


async def _echo_params(module, client, headers: dict[str, str]) -> dict:
    tensor = module.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, np.float32))
    result = await client.infer("echo", [tensor], headers=headers)
    return json.loads(result.as_numpy("PARAMS")[0])


# --- header forwarding -----------------------------------------------------------------------

@pytest.mark.parametrize("protocol, headers, expected, reserved, status", [
    ("http", {"X-Fwd-User": "alice", "X-Other": "no", "my_header_1": "v1"},
     {"x-fwd-user": "alice", "my_header_1": "v1"}, "priority", "400"),
    ("grpc", {"x-fwd-user": "bob", "x-other": "no"},
     {"x-fwd-user": "bob"}, "triton_fwd", "StatusCode.INVALID_ARGUMENT"),
])
def test_header_forwarding(server, protocol, headers, expected, reserved, status) -> None:
    async def run():
        module, client = _client(server, protocol)
        async with client:
            forwarded = await _echo_params(module, client, headers)
            with pytest.raises(InferenceServerException) as info:
                await _echo_params(module, client, {reserved: "1"})
            after = await _echo_params(module, client, {})  # the server goes on serving
        return forwarded, info.value, after

    forwarded, error, after = asyncio.run(run())
    assert forwarded == expected
    assert error.status() == status
    assert error.message() == f"Header '{reserved}' is reserved for Triton usage and cannot be forwarded."
    assert after == {}


# --- system shared memory --------------------------------------------------------------------

def test_system_shared_memory(server, protocol) -> None:
    name = "aio" + uuid.uuid4().hex[:8]
    key = "/mh_test_" + name
    data = np.array([1.5, -2.0, 3.25, 1e30], np.float32)
    size = data.nbytes
    handle = shm.create_shared_memory_region(name, key, 2 * size)
    shm.set_shared_memory_region(handle, [data])

    async def run():
        module, client = _client(server, protocol)
        async with client:
            await client.register_system_shared_memory(name, key, 2 * size)
            try:
                tensor = module.InferInput("IN_FP32", [len(data)], "FP32")
                tensor.set_shared_memory(name, size)
                output = module.InferRequestedOutput("OUT_FP32")
                output.set_shared_memory(name, size, offset=size)
                result = await client.infer("identity_all", [tensor], outputs=[output])
                status = await client.get_system_shared_memory_status(name)
            finally:
                await client.unregister_system_shared_memory(name)
            with pytest.raises(InferenceServerException) as gone:
                await client.get_system_shared_memory_status(name)
        return result, status, gone.value

    try:
        result, status, gone = asyncio.run(run())
        # the output went to the region, after the untouched input
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.float32, [len(data)], offset=size),
                                      data)
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.float32, [len(data)]), data)
    finally:
        shm.destroy_shared_memory_region(handle)
    described = result.get_output("OUT_FP32")
    if protocol == "http":
        assert (described["shape"], described["datatype"]) == ([len(data)], "FP32")
        assert "data" not in described and "parameters" not in described  # not in the body
        assert [(s["name"], s["key"], s["offset"], s["byte_size"]) for s in status] == [(name, key, 0, 2 * size)]
    else:
        assert (list(described.shape), described.datatype) == ([len(data)], "FP32")
        # not in the body: its place in raw_output_contents is kept, empty
        assert list(result.get_response().raw_output_contents) == [b""]
        assert [(n, s.key, s.offset, s.byte_size) for n, s in status.regions.items()] == [(name, key, 0, 2 * size)]
    assert f"Unable to find system shared memory region: '{name}'" in gone.message()
