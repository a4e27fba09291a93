"""The shared-memory registry and tensor binding in process, on real POSIX regions."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm

from host.errors import AlreadyExistsError, InvalidArgumentError, NotFoundError, UnsupportedError
from host.inference import InferenceRequest, InferenceResponse, RequestedOutput, Tensor
from host.shm import SharedMemoryManager, bind_request, write_outputs


@pytest.fixture
def region():
    key = f"/mh_unit_{uuid.uuid4().hex[:8]}"
    handle = shm.create_shared_memory_region("u", key, 256)
    yield key, handle
    shm.destroy_shared_memory_region(handle)


def _request(*inputs: Tensor, outputs=()) -> InferenceRequest:
    request = InferenceRequest("m", inputs={t.name: t for t in inputs}, outputs=list(outputs))
    request.uses_shm = True
    return request


def _ref(region: str, size: int, offset: int = 0) -> dict:
    return {"shared_memory_region": region, "shared_memory_byte_size": size, "shared_memory_offset": offset}


def test_inputs_are_read_only_views_of_the_region(region) -> None:
    key, handle = region
    shm.set_shared_memory_region(handle, [np.arange(8, dtype=np.int32)], offset=16)
    manager = SharedMemoryManager(enabled=True)
    manager.register_system("r", key, 0, 256)
    request = _request(Tensor("X", "INT32", [2, 4], None, {**_ref("r", 32, 16), "other": 1}))
    bind_request(request, manager, "m")
    x = request.inputs["X"]
    assert x.data.tolist() == np.arange(8).reshape(2, 4).tolist()
    assert np.shares_memory(x.data, manager.get("r").buffer)  # zero-copy: a view, not a copy
    assert not x.data.flags.writeable
    assert x.parameters == {"other": 1}  # the references never reach the model
    shm.set_shared_memory_region(handle, [np.full(8, 7, dtype=np.int32)], offset=16)
    assert x.data.tolist() == [[7] * 4] * 2  # the same memory the client writes


def test_outputs_are_written_once_into_the_region(region) -> None:
    key, handle = region
    manager = SharedMemoryManager(enabled=True)
    manager.register_system("r", key, 100, 156)  # a window starting 100 bytes into the object
    request = _request(outputs=[RequestedOutput("Y", _ref("r", 24, 8)), RequestedOutput("S", _ref("r", 20, 40)),
                                RequestedOutput("Z")])
    bind_request(request, manager, "m")
    assert request.outputs[0].parameters == {} and set(request.shm_outputs) == {"Y", "S"}
    y = np.arange(6, dtype=np.float32)
    strings = np.array([b"ab", b"\x00"], dtype=np.object_)
    response = InferenceResponse(outputs=[Tensor("Y", "FP32", [6], y), Tensor("S", "BYTES", [2], strings),
                                          Tensor("Z", "INT8", [1], np.ones(1, np.int8))])
    write_outputs(response, request.shm_outputs)
    assert [t.data is None for t in response.outputs] == [True, True, False]
    np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.float32, [6], offset=108), y)
    got = shm.get_contents_as_numpy(handle, np.object_, [2], offset=140)
    assert list(got) == [b"ab", b"\x00"]


def test_output_region_too_small(region) -> None:
    key, _ = region
    manager = SharedMemoryManager(enabled=True)
    manager.register_system("r", key, 0, 256)
    request = _request(outputs=[RequestedOutput("Y", _ref("r", 8))])
    bind_request(request, manager, "m")
    response = InferenceResponse(outputs=[Tensor("Y", "FP32", [3], np.zeros(3, np.float32))])
    with pytest.raises(InvalidArgumentError, match=r"\(8 bytes\) should be at least 12 bytes"):
        write_outputs(response, request.shm_outputs)


def test_registry_rules(region) -> None:
    key, _ = region
    with pytest.raises(UnsupportedError, match="Client shared memory is disabled"):
        SharedMemoryManager().register_system("r", key, 0, 16)
    manager = SharedMemoryManager(enabled=True)
    manager.register_system("r", key, 0, 16)
    with pytest.raises(AlreadyExistsError, match="shared memory region 'r' already in manager"):
        manager.register_system("r", key, 0, 16)
    for offset, size in ((0, 257), (250, 7), (2**64 - 1, 1)):
        with pytest.raises(InvalidArgumentError,
                           match="failed to register shared memory region 's': invalid args"):
            manager.register_system("s", key, offset, size)
    for bad in (-1, 2**64, "1", 1.0, None):
        with pytest.raises(InvalidArgumentError):
            manager.register_system("s", key, 0, bad)
    assert [s["name"] for s in manager.status("system")] == ["r"]
    assert manager.status("cuda") == []
    manager.unregister("r", "cuda")  # the CUDA API does not see system regions
    assert manager.get("r")
    manager.unregister("", "system")
    with pytest.raises(NotFoundError, match="Unable to find shared memory region: 'r'"):
        manager.get("r")


def test_unregistered_region_stays_mapped_for_its_users(region) -> None:
    key, handle = region
    shm.set_shared_memory_region(handle, [np.arange(4, dtype=np.int64)])
    manager = SharedMemoryManager(enabled=True)
    manager.register_system("r", key, 0, 256)
    request = _request(Tensor("X", "INT64", [4], None, _ref("r", 32)),
                       outputs=[RequestedOutput("Y", _ref("r", 32, 64))])
    bind_request(request, manager, "m")
    manager.unregister("r")
    assert request.inputs["X"].data.tolist() == [0, 1, 2, 3]  # still mapped
    response = InferenceResponse(outputs=[Tensor("Y", "INT64", [4], request.inputs["X"].data * 2)])
    write_outputs(response, request.shm_outputs)
    assert shm.get_contents_as_numpy(handle, np.int64, [4], offset=64).tolist() == [0, 2, 4, 6]
