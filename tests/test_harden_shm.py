"""Issue 15, finding 3: a client's shared memory must never crash the server.

A client registers a region and then shrinks the object under it (ftruncate). The next request
that reads or writes the region must get a clear 4xx error, not kill the worker with SIGBUS; the
other client's registration stays and keeps working.
"""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from host.testing import serve
from test_e2e_serve import write_identity

pytestmark = [pytest.mark.timeout(120), pytest.mark.modelhost_only]


def _region(size):
    key = f"/harden_{uuid.uuid4().hex[:10]}"
    return key, shm.create_shared_memory_region(key, key, size)


def _infer(module, client, in_region, out_region, n=4):
    x = module.InferInput("INPUT0", [n], "FP32")
    x.set_shared_memory(in_region, n * 4)
    out = module.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory(out_region, n * 4)
    return client.infer("a", [x], outputs=[out])


def test_shrunk_region_fails_its_request_and_spares_everyone_else(tmp_path):
    write_identity(tmp_path, "a")
    good_key, good = _region(32)
    bad_key, bad = _region(32)
    try:
        shm.set_shared_memory_region(good, [np.arange(4, dtype=np.float32)])
        shm.set_shared_memory_region(bad, [np.arange(4, dtype=np.float32)])
        with serve(tmp_path, "--allow-client-shm=true") as server:
            http = httpclient.InferenceServerClient(server.url)
            grpc = grpcclient.InferenceServerClient(server.grpc_url)
            http.register_system_shared_memory("good", good_key, 32)
            http.register_system_shared_memory("bad", bad_key, 32)
            # The careless (or hostile) client shrinks its object under the registration.
            fd = os.open("/dev/shm" + bad_key, os.O_RDWR)
            try:
                os.ftruncate(fd, 0)
            finally:
                os.close(fd)
            for module, client in ((httpclient, http), (grpcclient, grpc)):
                for in_region, out_region in (("bad", "good"), ("good", "bad")):
                    with pytest.raises(InferenceServerException, match="shrank to 0 bytes") as info:
                        _infer(module, client, in_region, out_region)
                    assert info.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
            assert server.running()
            # every other registration is still there and still works
            names = {r["name"] for r in http.get_system_shared_memory_status()}
            assert names == {"good", "bad"}
            _infer(httpclient, http, "good", "good")
            assert shm.get_contents_as_numpy(good, np.float32, [4]).tolist() == [0, 1, 2, 3]
            # the client may re-register after fixing its object
            http.unregister_system_shared_memory("bad")
            fd = os.open("/dev/shm" + bad_key, os.O_RDWR)
            os.ftruncate(fd, 32)
            os.close(fd)
            http.register_system_shared_memory("bad", bad_key, 32)
            _infer(grpcclient, grpc, "good", "bad")
    finally:
        for handle in (good, bad):
            try:
                shm.destroy_shared_memory_region(handle)
            except Exception:
                pass
