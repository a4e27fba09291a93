"""Native Triton caches: `--cache-config NAME,...` with no plugin named NAME loads
`<cache_directory>/NAME/libtritoncache_NAME.so` and uses it exactly as a cache plugin.

The project's own small cache (tests/native/cache.c) is compiled here; Triton's own
libtritoncache_local.so is driven too when the anchor install is on this machine."""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from cache_models import write_repository

from host.native.testing import build_library, compiler
from host.testing import ServerProcess, ServerStartError, serve

pytestmark = [
    pytest.mark.modelhost_only,
    pytest.mark.skipif(compiler() is None, reason="no C compiler to build the test cache"),
]

SOURCES = Path(__file__).resolve().parent / "native"
DATA = np.arange(64, dtype=np.int32).reshape(1, 64)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("native-caches")
    build_library(SOURCES / "cache.c", root / "small" / "libtritoncache_small.so")
    return root


def infer(client, data: np.ndarray):
    inp = httpclient.InferInput("INPUT0", list(data.shape), "INT32")
    inp.set_data_from_numpy(data)
    return client.infer("cached", [inp])


def counts(client) -> tuple[int, int, int]:
    s = client.get_inference_statistics("cached")["model_stats"][0]
    return (s["inference_stats"]["cache_hit"]["count"], s["inference_stats"]["cache_miss"]["count"],
            s["execution_count"])


def events(path: Path) -> Counter:
    return Counter(line.split(" ", 1)[0] for line in path.read_text().splitlines())


def test_native_cache_serves_hits_and_evicts(cache_dir, tmp_path):
    repo = write_repository(tmp_path / "models", ["cached"])
    log = tmp_path / "events.log"
    with serve(repo, "--cache-config", "small,max_entries=2", "--cache-directory", str(cache_dir),
               env={"MODELHOST_TEST_EVENTS": str(log)}) as server:
        client = httpclient.InferenceServerClient(server.url)
        first = infer(client, DATA)
        again = infer(client, DATA)
        np.testing.assert_array_equal(again.as_numpy("OUTPUT0"), DATA)
        np.testing.assert_array_equal(again.as_numpy("OUTPUT1"), DATA * 2)
        np.testing.assert_array_equal(first.as_numpy("OUTPUT1"), again.as_numpy("OUTPUT1"))
        assert counts(client) == (1, 1, 1)  # the second request never reached the model
        # over gRPC, the same entry
        g = grpcclient.InferenceServerClient(server.grpc_url)
        inp = grpcclient.InferInput("INPUT0", list(DATA.shape), "INT32")
        inp.set_data_from_numpy(DATA)
        np.testing.assert_array_equal(g.infer("cached", [inp]).as_numpy("OUTPUT1"), DATA * 2)
        assert counts(client) == (2, 1, 1)
        # two more entries evict the first (max_entries=2): asking again executes again
        infer(client, DATA + 1)
        infer(client, DATA + 2)
        infer(client, DATA)
        assert counts(client) == (2, 4, 4)
    seen = events(log)
    assert seen["initialize"] == 1 and seen["finalize"] == 1
    assert seen["insert"] == 4 and seen["hit"] == 2 and seen["evict"] == 2
    # the settings arrived as Triton passes them: a JSON object of strings
    assert '{"max_entries": "2"}' in log.read_text()


def test_native_cache_refusing_its_config_stops_the_server(cache_dir, tmp_path):
    repo = write_repository(tmp_path / "models", ["uncached"])
    with pytest.raises(ServerStartError) as info:
        ServerProcess(repo, "--cache-config", "small,max_entries=0", "--cache-directory",
                      str(cache_dir)).start(timeout=60, attempts=1)
    assert "small cache: bad max_entries" in str(info.value)


ANCHOR = Path(os.environ.get("ROOT") or "/tmp/triton-anchor")
TRITON_LOCAL = ANCHOR / "server/caches/local/libtritoncache_local.so"


@pytest.mark.skipif(not TRITON_LOCAL.is_file(), reason="Triton's libtritoncache_local.so is not here")
def test_tritons_own_local_cache_library(tmp_path):
    """Triton's build of its local cache, loaded by name as Triton would (the builtin `local`
    plugin blocked so the native library is the fallback). Its dependency on Triton's server
    library (`libtritonserver-<hash>.so`, the wheel's vendored name) is satisfied by an empty
    stand-in with that soname, so every TRITON* symbol it calls is the bridge's."""
    needed = subprocess.run(["readelf", "-d", str(TRITON_LOCAL)], capture_output=True, text=True).stdout
    soname = next((w.strip("[]") for line in needed.splitlines() if "NEEDED" in line
                   for w in line.split() if w.startswith("[libtritonserver")), None)
    env = {}
    if soname:
        standin = tmp_path / "standin"
        (tmp_path / "empty.c").write_text("/* empty: provides only a soname */\n")
        build_library(tmp_path / "empty.c", standin / soname, [f"-Wl,-soname,{soname}"])
        env["LD_LIBRARY_PATH"] = str(standin)
    caches = tmp_path / "caches"
    (caches / "local").mkdir(parents=True)
    (caches / "local" / "libtritoncache_local.so").symlink_to(TRITON_LOCAL)
    repo = write_repository(tmp_path / "models", ["cached"])
    with serve(repo, "--block-plugin", "local", "--cache-config", "local,size=1048576",
               "--cache-directory", str(caches), env=env) as server:
        client = httpclient.InferenceServerClient(server.url)
        infer(client, DATA)
        hit = infer(client, DATA)
        np.testing.assert_array_equal(hit.as_numpy("OUTPUT1"), DATA * 2)
        assert counts(client) == (1, 1, 1)
        assert "native library" in server.log_text()
