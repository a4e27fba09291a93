"""Native Triton backends: the project's own C test backends (tests/native/*.c), compiled here
against the bridge's headers, served by a real `modelhost serve` and driven with tritonclient
over HTTP and gRPC."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from host.native.testing import build_library, compiler
from host.testing import serve, wait_until

pytestmark = [
    pytest.mark.modelhost_only,
    pytest.mark.skipif(compiler() is None, reason="no C compiler to build the test backends"),
]

SOURCES = Path(__file__).resolve().parent / "native"

IDENTITY_CONFIG = """
backend: "{backend}"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }},
        {{ name: "INPUT1" data_type: TYPE_STRING dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }},
         {{ name: "OUTPUT1" data_type: TYPE_STRING dims: [ -1 ] }} ]
{extra}
"""

REPEAT_CONFIG = """
backend: "repeat"
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "IDX" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

STATS_CONFIG = """
backend: "stats"
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]
"""

INT32_CONFIG = """
backend: "{backend}"
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] }} ]
"""


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The test backends, compiled once: name -> library."""
    out = tmp_path_factory.mktemp("native-libs")
    built = {name: build_library(SOURCES / f"{name}.c", out / f"{name}.so")
             for name in ("identity", "repeat", "failing", "stats")}
    # A library that needs a symbol nobody provides: loading it (RTLD_NOW) must fail cleanly.
    missing = out / "missing.c"
    missing.write_text(textwrap.dedent("""\
        #include "triton/core/tritonbackend.h"
        extern void modelhost_test_no_such_symbol(void);
        TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(
            TRITONBACKEND_ModelInstance* i, TRITONBACKEND_Request** r, const uint32_t n) {
          modelhost_test_no_such_symbol();
          return NULL;
        }
        """))
    built["missing"] = build_library(missing, out / "missing.so")
    built["preferred"] = build_library(SOURCES / "identity.c", out / "preferred.so",
                                       ["-DIDENTITY_PREFERRED_GROUPS"])
    return built


def model(repo: Path, name: str, config: str) -> Path:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    return repo / name


def install(lib: Path, folder: Path, backend: str) -> Path:
    """Put a compiled library where Triton would look for backend `backend`."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"libtriton_{backend}.so"
    target.write_bytes(lib.read_bytes())
    return target


def events(path: Path) -> Counter:
    return Counter(path.read_text().splitlines()) if path.exists() else Counter()


def identity_inputs(module):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    s = np.array([[b"ab", b"c", b""], [b"x\x00y", b"yy", b"z"]], dtype=object)
    i0 = module.InferInput("INPUT0", list(a.shape), "FP32")
    i0.set_data_from_numpy(a)
    i1 = module.InferInput("INPUT1", list(s.shape), "BYTES")
    i1.set_data_from_numpy(s)
    return a, s, [i0, i1]


# --- one server for most tests: every kind of model, some failing to load ------------------------

@pytest.fixture(scope="module")
def served(libs, tmp_path_factory):
    root = tmp_path_factory.mktemp("native-repo")
    repo, backends = root / "models", root / "backends"
    install(libs["identity"], backends / "identity", "identity")
    model(repo, "ident", IDENTITY_CONFIG.format(backend="identity", extra=""))
    model(repo, "batched", IDENTITY_CONFIG.format(
        backend="identity", extra="dynamic_batching { max_queue_delay_microseconds: 50000 }"))
    # search order: version folder, then model folder, then the backend directory
    m = model(repo, "in_version", INT32_CONFIG.format(backend="order1"))
    for folder in (m / "1", m, backends / "order1"):
        install(libs["identity"], folder, "order1")
    m = model(repo, "in_model", INT32_CONFIG.format(backend="order2"))
    for folder in (m, backends / "order2"):
        install(libs["identity"], folder, "order2")
    model(repo, "in_backends", INT32_CONFIG.format(backend="order3"))
    install(libs["identity"], backends / "order3", "order3")
    # a backend that prefers two CPU instances, for a model that names no instance group
    install(libs["preferred"], backends / "preferred", "preferred")
    model(repo, "pref", INT32_CONFIG.format(backend="preferred"))
    # decoupled, statistics, and three that cannot load
    install(libs["repeat"], backends / "repeat", "repeat")
    model(repo, "repeat", REPEAT_CONFIG)
    install(libs["stats"], backends / "stats", "stats")
    model(repo, "stats", STATS_CONFIG)
    install(libs["failing"], backends / "failing", "failing")
    model(repo, "refused", INT32_CONFIG.format(backend="failing"))
    install(libs["missing"], backends / "missing", "missing")
    model(repo, "unresolved", INT32_CONFIG.format(backend="missing"))
    model(repo, "nowhere", INT32_CONFIG.format(backend="no_such_backend"))
    with serve(repo, "--backend-directory", str(backends)) as server:
        yield server, repo, backends


def test_identity_over_http(served):
    import tritonclient.http as httpclient

    server, repo, backends = served
    client = httpclient.InferenceServerClient(server.url)
    a, s, inputs = identity_inputs(httpclient)
    result = client.infer("ident", inputs, parameters={"tag": "t1", "n": 7, "flag": True})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a)
    assert result.as_numpy("OUTPUT1").tolist() == s.tolist()
    params = result.get_response()["parameters"]
    assert params["backend_location"] == str(backends / "identity")
    assert params["instance"] == "ident_0"
    assert params["config_names_model"] is True  # the backend read the model config JSON
    assert (params["echo_tag"], params["echo_n"], params["echo_flag"]) == ("t1", 7, True)
    # only what the client asks for is computed and returned
    only = client.infer("ident", inputs, outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    assert [o["name"] for o in only.get_response()["outputs"]] == ["OUTPUT1"]
    # the backend's TRITONSERVER_LogMessage went into the host's log
    assert "identity test backend: model 'ident' initialized" in server.log_text()


def test_execute_error_fails_the_batch_and_the_server_keeps_serving(served):
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    server, _, _ = served
    client = httpclient.InferenceServerClient(server.url)
    a, _, inputs = identity_inputs(httpclient)
    with pytest.raises(InferenceServerException, match="execute refused the batch") as info:
        client.infer("ident", inputs, parameters={"execute_error": True})
    assert info.value.status() == "400"  # INVALID_ARG, the backend's code
    np.testing.assert_array_equal(client.infer("ident", inputs).as_numpy("OUTPUT0"), a)


def test_dynamic_batches_keep_each_request_its_own_data(served):
    import tritonclient.http as httpclient

    server, _, _ = served
    client = httpclient.InferenceServerClient(server.url, concurrency=8)
    pending = []
    for k in range(8):
        a = np.full((1, 5), k, dtype=np.float32)
        s = np.array([[f"r{k}-{j}".encode() for j in range(5)]], dtype=object)
        i0 = httpclient.InferInput("INPUT0", [1, 5], "FP32")
        i0.set_data_from_numpy(a)
        i1 = httpclient.InferInput("INPUT1", [1, 5], "BYTES")
        i1.set_data_from_numpy(s)
        pending.append((a, s, client.async_infer("batched", [i0, i1])))
    for a, s, request in pending:
        result = request.get_result()
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a)
        assert result.as_numpy("OUTPUT1").tolist() == s.tolist()
    stats = client.get_inference_statistics("batched")["model_stats"][0]
    assert stats["inference_count"] == 8


def test_identity_over_grpc(served):
    import tritonclient.grpc as grpcclient

    server, _, _ = served
    client = grpcclient.InferenceServerClient(server.grpc_url)
    a, s, inputs = identity_inputs(grpcclient)
    result = client.infer("ident", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a)
    assert result.as_numpy("OUTPUT1").tolist() == s.tolist()
    assert client.get_model_config("ident").config.backend == "identity"


def test_search_locations_in_triton_order(served):
    import tritonclient.http as httpclient

    server, repo, backends = served
    client = httpclient.InferenceServerClient(server.url)
    data = np.array([1, 2, 3, 4], dtype=np.int32)
    where = {}
    for name in ("in_version", "in_model", "in_backends"):
        inp = httpclient.InferInput("INPUT0", [4], "INT32")
        inp.set_data_from_numpy(data)
        result = client.infer(name, [inp])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
        where[name] = result.get_response()["parameters"]["backend_location"]
    assert where == {"in_version": str(repo / "in_version" / "1"),
                     "in_model": str(repo / "in_model"),
                     "in_backends": str(backends / "order3")}


def test_preferred_instance_groups_of_the_backend(served):
    import tritonclient.http as httpclient

    server, _, _ = served
    client = httpclient.InferenceServerClient(server.url)
    groups = client.get_model_config("pref")["instance_group"]
    assert [(g["kind"], g["count"]) for g in groups] == [("KIND_CPU", 2)]
    assert client.get_model_config("ident")["instance_group"][0]["count"] == 1  # the default


def test_failed_loads_leave_models_unavailable_with_reasons(served):
    import tritonclient.http as httpclient

    server, _, _ = served
    client = httpclient.InferenceServerClient(server.url)
    rows = {r["name"]: r for r in client.get_model_repository_index()}
    assert rows["refused"]["state"] == "UNAVAILABLE"
    assert "failing test backend refuses every model" in rows["refused"]["reason"]
    assert rows["unresolved"]["state"] == "UNAVAILABLE"
    assert "modelhost_test_no_such_symbol" in rows["unresolved"]["reason"]
    assert rows["nowhere"]["state"] == "UNAVAILABLE"
    assert "libtriton_no_such_backend.so" in rows["nowhere"]["reason"]
    assert rows["ident"]["state"] == "READY"
    assert not client.is_model_ready("refused")
    assert client.is_model_ready("ident")


def test_decoupled_backend_streams_from_its_own_thread(served):
    import tritonclient.grpc as grpcclient

    server, _, _ = served
    client = grpcclient.InferenceServerClient(server.grpc_url)
    got: queue.SimpleQueue = queue.SimpleQueue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        values = np.array([5, 6, 7, 8], dtype=np.int32)
        inp = grpcclient.InferInput("IN", [4], "INT32")
        inp.set_data_from_numpy(values)
        client.async_stream_infer("repeat", [inp], request_id="r1",
                                  enable_empty_final_response=True)
        responses = []
        while True:
            result, error = got.get(timeout=30)
            assert error is None, error
            final = result.get_response().parameters["triton_final_response"].bool_param
            if final:
                break
            responses.append((int(result.as_numpy("OUT")[0]), int(result.as_numpy("IDX")[0])))
    finally:
        client.stop_stream()
    assert responses == [(5, 0), (6, 1), (7, 2), (8, 3)]
    # a decoupled model over a unary call gets Triton's refusal
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    http = httpclient.InferenceServerClient(server.url)
    hinp = httpclient.InferInput("IN", [4], "INT32")
    hinp.set_data_from_numpy(values)
    with pytest.raises(InferenceServerException, match="decoupled"):
        http.infer("repeat", [hinp])


def test_backend_reported_statistics_are_the_models_statistics(served):
    import tritonclient.http as httpclient

    server, _, _ = served
    client = httpclient.InferenceServerClient(server.url)
    data = np.array([9, 8, 7, 6], dtype=np.int32)
    for _ in range(3):
        inp = httpclient.InferInput("INPUT0", [4], "INT32")
        inp.set_data_from_numpy(data)
        np.testing.assert_array_equal(client.infer("stats", [inp]).as_numpy("OUTPUT0"), data)

    def stats():
        s = client.get_inference_statistics("stats")["model_stats"][0]
        return s if s["inference_stats"]["compute_output"]["ns"] == 3 * 2_000_000 else None

    s = wait_until(stats, message="statistics of 3 executes")["inference_stats"]
    # the durations the backend made up (1 ms, 5 s, 2 ms per execute), not the host's timing
    assert s["compute_input"] == {"count": 3, "ns": 3 * 1_000_000}
    assert s["compute_infer"] == {"count": 3, "ns": 3 * 5_000_000_000}
    assert s["success"]["count"] == 3
    # the backend's own counter, exported with the host's metrics
    import urllib.request

    no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with no_proxy.open(server.metrics_url, timeout=10) as page:
        text = page.read().decode()
    assert "# TYPE stats_backend_executes counter" in text
    assert 'stats_backend_executes{model="stats"} 3' in text


# --- lifecycle: counts across two models sharing one backend, unload and reload ------------------

def test_backend_lifecycle_across_models_unload_and_reload(libs, tmp_path):
    import tritonclient.http as httpclient

    repo, backends, log = tmp_path / "models", tmp_path / "backends", tmp_path / "events.log"
    install(libs["identity"], backends / "identity", "identity")
    model(repo, "m1", IDENTITY_CONFIG.format(
        backend="identity", extra='instance_group [ { kind: KIND_CPU count: 2 } ]'))
    model(repo, "m2", IDENTITY_CONFIG.format(backend="identity", extra=""))
    with serve(repo, "--backend-directory", str(backends), "--model-control-mode", "explicit",
               "--load-model", "m1", "--load-model", "m2",
               env={"MODELHOST_TEST_EVENTS": str(log)}) as server:
        client = httpclient.InferenceServerClient(server.url)
        assert events(log) == Counter({
            "initialize identity": 1, "model_initialize m1": 1, "model_initialize m2": 1,
            "instance_initialize m1_0_0": 1, "instance_initialize m1_0_1": 1,
            "instance_initialize m2_0": 1})
        client.unload_model("m1")
        wait_until(lambda: events(log)["model_finalize m1"] == 1)
        assert events(log)["instance_finalize m1_0_0"] == events(log)["instance_finalize m1_0_1"] == 1
        assert events(log)["finalize identity"] == 0  # m2 still uses the backend
        _, _, inputs = identity_inputs(httpclient)
        client.infer("m2", inputs)
        client.unload_model("m2")
        wait_until(lambda: events(log)["finalize identity"] == 1)
        # the library was unloaded with its last model; loading again starts it afresh
        client.load_model("m1")
        assert client.is_model_ready("m1")
        assert events(log)["initialize identity"] == 2
        assert events(log)["model_initialize m1"] == 2
        result = client.infer("m1", inputs)
        assert result.get_response()["parameters"]["instance"] in ("m1_0_0", "m1_0_1")
    final = events(log)
    assert final["finalize identity"] == 2
    assert final["model_finalize m1"] == 2 and final["model_finalize m2"] == 1


# --- Triton's own builds resolve every symbol against the bridge ----------------------------------

ANCHOR = Path(os.environ.get("ROOT") or "/tmp/triton-anchor")
TRITON_LIBS = [ANCHOR / "server/backends/python/libtriton_python.so",
               ANCHOR / "server/caches/local/libtritoncache_local.so"]


@pytest.mark.skipif(not all(p.is_file() for p in TRITON_LIBS),
                    reason="Triton's built libraries (the anchor install) are not on this machine")
def test_libraries_built_by_triton_resolve_against_the_bridge(tmp_path):
    """dlopen(RTLD_NOW) of Triton's python backend and local cache with the bridge as the only
    provider of Triton's symbols. Those builds name their server library
    `libtritonserver-<hash>.so` (the wheel's vendored name): an empty stand-in with that soname
    satisfies the dependency, so every TRITON* symbol must come from the bridge."""
    needed = subprocess.run(["readelf", "-d", str(TRITON_LIBS[0])], capture_output=True,
                            text=True).stdout
    soname = next((w.strip("[]") for line in needed.splitlines() if "NEEDED" in line
                   for w in line.split() if w.startswith("[libtritonserver")), "libtritonserver.so")
    standin = tmp_path / "standin.c"
    standin.write_text("/* empty: provides only a soname */\n")
    build_library(standin, tmp_path / soname, [f"-Wl,-soname,{soname}"])
    vendored = sorted(ANCHOR.glob("venv/lib/python3*/site-packages/nvidia_pytriton.libs"))
    script = textwrap.dedent(f"""
        import ctypes, os
        from host.native.bridge import lib
        lib()
        ctypes.CDLL({str(tmp_path / soname)!r}, mode=os.RTLD_GLOBAL | os.RTLD_NOW)
        for path in {[str(p) for p in TRITON_LIBS]!r}:
            ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
        maps = open("/proc/self/maps").read()
        assert "nvidia_pytriton.libs/libtritonserver" not in maps, "Triton's own server library was loaded"
        print("resolved")
        """)
    # The vendored folder provides their other dependencies (libarchive, cudart, ...).
    env = dict(os.environ, LD_LIBRARY_PATH=":".join(str(v) for v in vendored))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert "resolved" in done.stdout


# --- the bridge itself -------------------------------------------------------------------------

def test_bridge_exports_every_server_side_function_and_refuses_the_unsupported():
    """Every server-side function of the headers is a symbol of the bridge (a backend built by
    Triton resolves all of its imports at load time), and one without a host equivalent returns
    an UNSUPPORTED error that names it."""
    import ctypes
    import importlib.util

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "host" / "native" / "tools"))
    try:
        import gen_unsupported
    finally:
        sys.path.pop(0)
    from host.native.bridge import lib

    lib()
    bridge = ctypes.CDLL(importlib.util.find_spec("host.native.libtritonserver").origin)
    declared = gen_unsupported.declarations()
    assert len(declared) > 250
    missing = [name for name in declared if not hasattr(bridge, name)]
    assert missing == []

    bridge.TRITONSERVER_ServerNew.restype = ctypes.c_void_p
    bridge.TRITONSERVER_ErrorCode.argtypes = [ctypes.c_void_p]
    bridge.TRITONSERVER_ErrorMessage.argtypes = [ctypes.c_void_p]
    bridge.TRITONSERVER_ErrorMessage.restype = ctypes.c_char_p
    bridge.TRITONSERVER_ErrorDelete.argtypes = [ctypes.c_void_p]
    server = ctypes.c_void_p()
    err = bridge.TRITONSERVER_ServerNew(ctypes.byref(server), None)
    assert err
    assert bridge.TRITONSERVER_ErrorCode(err) == 5  # TRITONSERVER_ERROR_UNSUPPORTED
    assert b"TRITONSERVER_ServerNew is not supported" in bridge.TRITONSERVER_ErrorMessage(err)
    bridge.TRITONSERVER_ErrorDelete(err)
    major, minor = ctypes.c_uint32(), ctypes.c_uint32()
    assert bridge.TRITONBACKEND_ApiVersion(ctypes.byref(major), ctypes.byref(minor)) == 0
    assert (major.value, minor.value) == (1, 19)


TRITONSERVER = ANCHOR / "server/bin/tritonserver"


@pytest.mark.skipif(not TRITONSERVER.is_file(), reason="the real tritonserver (anchor install) is not here")
def test_real_triton_serves_the_identity_backend_built_against_our_headers(libs, tmp_path):
    """The converse check: our headers are Triton's ABI, so Triton itself runs our test backend."""
    import signal

    import tritonclient.http as httpclient

    from host.testing import free_port

    repo = tmp_path / "models"
    m = model(repo, "ident", IDENTITY_CONFIG.format(backend="identity", extra=""))
    install(libs["identity"], m, "identity")
    vendored = sorted(ANCHOR.glob("venv/lib/python3*/site-packages/nvidia_pytriton.libs"))
    env = dict(os.environ, LD_LIBRARY_PATH=":".join(str(v) for v in vendored))
    http, grpc, metrics = free_port(), free_port(), free_port()
    log = tmp_path / "triton.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(TRITONSERVER), f"--model-repository={repo}", "--http-address=127.0.0.1",
             f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}",
             f"--backend-directory={tmp_path / 'no-backends'}", "--allow-gpu-metrics=false"],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{http}")

        def ready() -> bool:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                return client.is_model_ready("ident")
            except Exception:
                return False

        wait_until(ready, timeout=60, message="tritonserver did not load the model")
        a, s, inputs = identity_inputs(httpclient)
        result = client.infer("ident", inputs, parameters={"tag": "from-triton"})
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a)
        assert result.as_numpy("OUTPUT1").tolist() == s.tolist()
        params = result.get_response()["parameters"]
        assert params["echo_tag"] == "from-triton" and params["config_names_model"] is True
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
