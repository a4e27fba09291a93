"""CUDA shared memory end to end (needs a CUDA device and cupy; skipped otherwise, never faked).

The client side is `tritonclient.utils.cuda_shared_memory`, as a Triton user would write it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from host.shm import cuda
from host.testing import serve

pytestmark = [
    pytest.mark.modelhost_only,
    pytest.mark.skipif(cuda.unavailable_reason() is not None,
                       reason=f"CUDA shared memory unavailable: {cuda.unavailable_reason()}"),
]
MODELS = Path(__file__).parent / "shm_models"


@pytest.fixture(scope="module")
def server():
    with serve(MODELS, "--allow-client-shm=true") as s:
        yield s


@pytest.fixture(scope="module")
def cudashm():
    return pytest.importorskip("tritonclient.utils.cuda_shared_memory")


@pytest.fixture(params=["http", "grpc"])
def client(request, server):
    if request.param == "http":
        return httpclient.InferenceServerClient(server.url), httpclient
    return grpcclient.InferenceServerClient(server.grpc_url), grpcclient


def test_round_trip_through_device_memory(client, cudashm) -> None:
    c, mod = client
    assert "cuda_shared_memory" in (c.get_server_metadata()["extensions"] if mod is httpclient
                                    else c.get_server_metadata().extensions)
    data = np.arange(1024, dtype=np.float32)
    handle = cudashm.create_shared_memory_region("gpu_r", data.nbytes * 2, 0)
    try:
        cudashm.set_shared_memory_region(handle, [data])
        c.register_cuda_shared_memory("gpu_r", cudashm.get_raw_handle(handle), 0, data.nbytes * 2)
        tensor = mod.InferInput("IN_FP32", [1024], "FP32")
        tensor.set_shared_memory("gpu_r", data.nbytes)
        out = mod.InferRequestedOutput("OUT_FP32")
        out.set_shared_memory("gpu_r", data.nbytes, offset=data.nbytes)
        c.infer("identity_all", [tensor], outputs=[out])
        got = cudashm.get_contents_as_numpy(handle, np.float32, [2048])
        np.testing.assert_array_equal(got[1024:], data)
        status = c.get_cuda_shared_memory_status()
        names = [s["name"] for s in status] if mod is httpclient else list(status.regions)
        assert names == ["gpu_r"]
        with pytest.raises(InferenceServerException, match="already in manager"):
            c.register_system_shared_memory("gpu_r", "/whatever", 8)  # one namespace
    finally:
        c.unregister_cuda_shared_memory()
        cudashm.destroy_shared_memory_region(handle)


def test_bad_handle_is_refused(client) -> None:
    c, mod = client
    bad = b"AAAA" if mod is httpclient else b"\0" * 8
    with pytest.raises(InferenceServerException):
        c.register_cuda_shared_memory("bad", bad, 0, 64)
    assert c.is_server_live()
