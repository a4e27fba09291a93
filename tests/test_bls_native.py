"""Native backends that send requests through the in-process server API (BLS in C), and Triton's
own prebuilt python backend (`libtriton_python.so` and its stub) serving python and BLS models
inside modelhost with the builtin python plugin blocked."""

from __future__ import annotations

import json
import os
import queue
import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from host.native.testing import build_library, compiler
from host.testing import serve

pytestmark = pytest.mark.modelhost_only

HERE = Path(__file__).resolve().parent
BLS_MODELS = HERE / "bls_models"

PY_INT32 = '''
import json
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            seen = json.loads(r.parameters()).get("origin", "") + "/" + r.request_id()
            out.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUTPUT0", x * 2)], parameters={"seen": seen}))
        return out
'''

PY_REPEAT = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            sender = r.get_response_sender()
            for k in (1, 2):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x + k)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''

INT32_IO = """
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


def _model(repo: Path, name: str, config: str, files: dict[str, str | bytes]) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    for rel, content in files.items():
        path = repo / name / rel
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)


@pytest.mark.skipif(compiler() is None, reason="no C compiler to build the test backend")
def test_a_native_backend_calls_other_models_through_the_server_api(tmp_path):
    lib = build_library(HERE / "native" / "bls.c", tmp_path / "libtriton_bls.so")
    repo = tmp_path / "models"
    _model(repo, "native_bls", f'backend: "bls"\n{INT32_IO}', {"libtriton_bls.so": lib.read_bytes()})
    _model(repo, "py_int32", f'backend: "python"\n{INT32_IO}', {"1/model.py": PY_INT32})
    _model(repo, "py_repeat", f'backend: "python"\nmodel_transaction_policy {{ decoupled: true }}\n'
           f'{INT32_IO}', {"1/model.py": PY_REPEAT})
    with serve(repo) as server:
        client = httpclient.InferenceServerClient(server.url)
        x = np.array([1, 2, 3, 4], dtype=np.int32)

        def ask(callee: str | None = None):
            inp = httpclient.InferInput("INPUT0", [4], "INT32")
            inp.set_data_from_numpy(x)
            params = {"callee": callee} if callee else None
            result = client.infer("native_bls", [inp], parameters=params)
            return result.as_numpy("OUTPUT0").tolist(), result.get_response()["parameters"]

        out, params = ask()
        assert out == [2, 4, 6, 8]
        assert params["callee_ready"] is True and params["callee_decoupled"] is False
        assert params["responses"] == 1
        assert params["callee_param"] == "native/from-native"  # request id and parameters arrived
        assert "callee_error" not in params
        # A function modelhost does not implement is an error the backend handles.
        assert params["unsupported"] == "TRITONSERVER_ServerOptionsNew is not supported by modelhost"

        # A decoupled callee: each response reaches the callback, then the flags-only final one.
        out, params = ask("py_repeat")
        assert out == [3, 4, 5, 6] and params["responses"] == 2
        assert params["callee_decoupled"] is True

        out, params = ask("nope")
        assert out == x.tolist() and params["callee_ready"] is False
        assert params["callee_error"] == "Request for unknown model: 'nope' is not found"
        assert params["responses"] == 0

        # Sent from the thread running execute: calling itself runs on its own instance.
        out, params = ask("native_bls")
        assert out == [2, 4, 6, 8] and params["responses"] == 1
        assert server.running


# --- Triton's own python backend ------------------------------------------------------------------

def _triton_python_backend() -> Path | None:
    """The folder holding libtriton_python.so and its stub: MODELHOST_TRITON_PYTHON_BACKEND, or
    the anchor install under MODELHOST_TRITON_ANCHOR (default /work/triton-anchor)."""
    named = os.environ.get("MODELHOST_TRITON_PYTHON_BACKEND")
    anchor = Path(os.environ.get("MODELHOST_TRITON_ANCHOR", "/work/triton-anchor"))
    folder = Path(named) if named else anchor / "server" / "backends" / "python"
    ok = (folder / "libtriton_python.so").is_file() and (folder / "triton_python_backend_stub").is_file()
    return folder if ok else None


TRITON_PYTHON = _triton_python_backend()


@pytest.fixture(scope="module")
def triton_python(tmp_path_factory):
    """modelhost serving tests/bls_models with Triton's python backend, the builtin one blocked."""
    if TRITON_PYTHON is None:
        pytest.skip("Triton's python backend is not installed (set MODELHOST_TRITON_PYTHON_BACKEND "
                    "to the folder of libtriton_python.so, or MODELHOST_TRITON_ANCHOR)")
    if compiler() is None:
        pytest.skip("no C compiler to build the stand-in for Triton's server library")
    tmp = tmp_path_factory.mktemp("triton-python")
    backends = tmp / "backends"
    backends.mkdir()
    (backends / "python").symlink_to(TRITON_PYTHON)
    env = triton_python_env(TRITON_PYTHON, tmp)
    repo = tmp / "models"
    for name in ("identity_fp32", "repeat", "bls_call", "bls_stream"):
        shutil.copytree(BLS_MODELS / name, repo / name)
    with serve(repo, "--block-plugin", "python", "--backend-directory", str(backends),
               "--model-control-mode", "explicit", "--load-model", "*", env=env) as server:
        yield server


def triton_python_env(folder: Path, tmp: Path) -> dict[str, str]:
    """What Triton's start script sets up for the python backend, plus a stand-in for Triton's
    server library: Triton's build of libtriton_python.so names `libtritonserver-<hash>.so`,
    and every symbol of it must come from modelhost's bridge, not from Triton's own library."""
    import subprocess

    needed = subprocess.run(["readelf", "-d", str(folder / "libtriton_python.so")],
                            capture_output=True, text=True, check=True).stdout
    soname = next((w.strip("[]") for line in needed.splitlines() if "NEEDED" in line
                   for w in line.split() if w.startswith("[libtritonserver")), "libtritonserver.so")
    standin = tmp / "standin"
    (tmp / "standin.c").write_text("/* empty: provides only a soname */\n")
    build_library(tmp / "standin.c", standin / soname, [f"-Wl,-soname,{soname}"])
    # The anchor's layout: <root>/server/backends/python, <root>/venv (nvidia_pytriton.libs holds
    # the libraries the backend and its stub link: cudart, libarchive...; its python3 has numpy).
    root = folder.resolve().parent.parent.parent
    libs = sorted(root.glob("venv/lib/python3*/site-packages/nvidia_pytriton.libs"))
    paths = [str(standin)] + [str(p) for p in libs]
    if os.environ.get("LD_LIBRARY_PATH"):
        paths.append(os.environ["LD_LIBRARY_PATH"])
    env = {"LD_LIBRARY_PATH": ":".join(paths)}
    if (root / "venv" / "bin").is_dir():
        env["PATH"] = f"{root / 'venv' / 'bin'}:{os.environ.get('PATH', '')}"
    return env


def _spec_inputs(mod, spec: dict):
    s = mod.InferInput("SPEC", [1], "BYTES")
    s.set_data_from_numpy(np.array([json.dumps(spec).encode()], dtype=np.object_))
    x = mod.InferInput("INPUT0", [3], "FP32")
    x.set_data_from_numpy(np.array([1, 2, 3], dtype=np.float32))
    return [s, x]


def test_tritons_python_backend_serves_a_python_model(triton_python):
    log = triton_python.log_text()
    assert "loaded native backend 'python'" in log
    client = httpclient.InferenceServerClient(triton_python.url)
    x = httpclient.InferInput("INPUT0", [3], "FP32")
    x.set_data_from_numpy(np.array([1, 2, 3], dtype=np.float32))
    assert client.infer("identity_fp32", [x]).as_numpy("OUTPUT0").tolist() == [1, 2, 3]


def test_tritons_python_backend_serves_bls_models(triton_python):
    http = httpclient.InferenceServerClient(triton_python.url)
    grpc = grpcclient.InferenceServerClient(triton_python.grpc_url)
    for mod, client in ((httpclient, http), (grpcclient, grpc)):
        result = client.infer("bls_call", _spec_inputs(mod, {"model": "identity_fp32"}))
        assert json.loads(result.as_numpy("RESULT")[0])[0]["outputs"] == ["OUTPUT0"]
        assert result.as_numpy("OUTPUT0").tolist() == [1, 2, 3]
    spec = {"model": "repeat", "input_name": "IN", "input_dtype": "int32", "outputs": ["OUT"],
            "decoupled": True, "out": "OUT"}
    result = http.infer("bls_call", _spec_inputs(httpclient, spec))
    assert [r["outputs"] for r in json.loads(result.as_numpy("RESULT")[0])] == [["OUT"]] * 3 + [[]]
    result = http.infer("bls_call", _spec_inputs(httpclient, {"model": "nope"}))
    assert json.loads(result.as_numpy("RESULT")[0])[0]["error"] == (
        "Model nope - Error when running inference: Failed for execute the inference request. "
        "Model 'nope' is not ready.")
    for op, answer in (("ready", {"ready": True}), ("unload", {"unloaded": True}),
                       ("ready", {"ready": False}), ("load", {"loaded": True}),
                       ("ready", {"ready": True})):
        result = http.infer("bls_call", _spec_inputs(httpclient, {"op": op, "model": "repeat"}))
        assert json.loads(result.as_numpy("RESULT")[0]) == answer, op
    # TRITONSERVER_ServerLoadModelWithParameters with a config and file contents (no instance
    # group: the backend prefers KIND_GPU, the model gets a CPU instance as in Triton).
    made = {"op": "load", "model": "made", "config": json.dumps({
                "backend": "python", "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]}),
            "files": {"file:1/model.py": (BLS_MODELS / "identity_fp32" / "1" / "model.py").read_text()}}
    result = http.infer("bls_call", _spec_inputs(httpclient, made))
    assert json.loads(result.as_numpy("RESULT")[0]) == {"loaded": True}
    x = httpclient.InferInput("INPUT0", [2], "FP32")
    x.set_data_from_numpy(np.array([7, 8], dtype=np.float32))
    assert http.infer("made", [x]).as_numpy("OUTPUT0").tolist() == [7, 8]


def test_tritons_python_backend_streams_a_decoupled_bls_model(triton_python):
    client = grpcclient.InferenceServerClient(triton_python.grpc_url)
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        inp = grpcclient.InferInput("IN", [2], "INT32")
        inp.set_data_from_numpy(np.array([5, 6], dtype=np.int32))
        client.async_stream_infer("bls_stream", [inp], enable_empty_final_response=True)
        outs = []
        while True:
            result, error = got.get(timeout=60)
            assert error is None, error
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
            outs.append(int(result.as_numpy("OUT")[0]))
        assert outs == [5, 6]
    finally:
        client.stop_stream()
        client.close()
