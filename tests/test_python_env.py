"""Execution environments of python models (`EXECUTION_ENV_PATH`, host.backends.python.envs),
through a real `modelhost serve` and the real tritonclient: the model imports the packages of
its own environment (an archive or a folder in its directory), never the server's."""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from host.testing import serve

VERSION = f"python{sys.version_info[0]}.{sys.version_info[1]}"

# The model imports `envmarker`, which only its environment has (at import time: the server
# process must never import this file), and reports what it sees.
MODEL = '''
import json, os, sys
import numpy as np
import envmarker
import packaging
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [1]})
        config.add_output({"name": "OUT", "data_type": "TYPE_STRING", "dims": [1]})
        return config

    def execute(self, requests):
        seen = {"marker": envmarker.VALUE, "packaging": packaging.__version__,
                "virtual_env": os.environ.get("VIRTUAL_ENV"),
                "ld_library_path": os.environ.get("LD_LIBRARY_PATH", "").split(":")[0],
                "pid": os.getpid(), "extra": __import__("envextra").VALUE}
        out = np.array([json.dumps(seen).encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]) for _ in requests]
'''


def _env_files(marker: str, version: str = VERSION, activate: bool = True) -> dict[str, bytes]:
    site = f"lib/{version}/site-packages"
    files = {
        f"{site}/envmarker/__init__.py": f"VALUE = {marker!r}\n".encode(),
        # a package the server has too: the environment's must win
        f"{site}/packaging/__init__.py": b"__version__ = '0.0-env'\n",
        # a .pth file of the environment is honoured, as in a site folder
        f"{site}/extra.pth": b"extra\n",
        f"{site}/extra/envextra.py": b"VALUE = 1\n",
    }
    if activate:
        files["bin/activate"] = b"# activation script\n"
    return files


def _write_archive(path: Path, files: dict[str, bytes], links: dict[str, str] | None = None) -> None:
    with tarfile.open(path, "w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            archive.addfile(info)


def _model(repo: Path, name: str, env: str, extra: str = "") -> Path:
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(textwrap.dedent(MODEL))
    (folder / "config.pbtxt").write_text(
        f'backend: "python"\nmax_batch_size: 0\n'
        f'parameters {{ key: "EXECUTION_ENV_PATH" value {{ string_value: "{env}" }} }}\n' + extra)
    return folder


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("envrepo")
    folder = _model(repo, "env_archive", "$$TRITON_MODEL_DIRECTORY/env.tar.gz")
    _write_archive(folder / "env.tar.gz", _env_files("archive-v1"))
    folder = _model(repo, "env_folder", "pyenv")
    for name, data in _env_files("folder").items():
        (folder / "pyenv" / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / "pyenv" / name).write_bytes(data)
    folder = _model(repo, "env_other_python", "env.tar.gz")
    _write_archive(folder / "env.tar.gz", _env_files("x", version="python3.9"))
    folder = _model(repo, "env_no_activate", "env.tar.gz")
    _write_archive(folder / "env.tar.gz", _env_files("x", activate=False))
    _model(repo, "env_missing", "$$TRITON_MODEL_DIRECTORY/missing.tar.gz")
    folder = _model(repo, "env_thread", "env.tar.gz",
                    'parameters { key: "EXECUTION_MODE" value { string_value: "thread" } }\n')
    _write_archive(folder / "env.tar.gz", _env_files("x"))
    folder = _model(repo, "env_link_out", "env.tar.gz")
    _write_archive(folder / "env.tar.gz", _env_files("x"), links={"lib/escape": "/etc"})
    return repo


@pytest.fixture(scope="module")
def server(repo: Path):
    with serve(repo, "--model-control-mode", "explicit", "--load-model", "env_archive",
               "--load-model", "env_folder") as srv:
        yield srv


def _seen(client, model: str) -> dict:
    inp = httpclient.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([1], np.int32))
    return json.loads(client.infer(model, [inp]).as_numpy("OUT")[0])


def test_model_runs_with_its_archive_environment(server):
    client = httpclient.InferenceServerClient(server.url)
    seen = _seen(client, "env_archive")
    assert seen["marker"] == "archive-v1"
    assert seen["packaging"] == "0.0-env"  # the environment's package, not the server's
    assert seen["extra"] == 1  # the environment's .pth files count
    env_root = seen["virtual_env"]
    assert env_root and Path(env_root, "bin", "activate").is_file()
    assert not env_root.startswith(server.model_repository)  # unpacked elsewhere
    assert seen["ld_library_path"] == f"{env_root}/lib"
    # It ran in a stub process of its own (Triton's stub name, which the QA scripts' pgrep finds).
    assert b"triton_python_backend_stub" in Path(f"/proc/{seen['pid']}/cmdline").read_bytes()
    # auto_complete_config ran (in the environment: the model file imports envmarker).
    config = client.get_model_config("env_archive")
    assert [i["name"] for i in config["input"]] == ["IN"]
    assert [o["name"] for o in config["output"]] == ["OUT"]


def test_model_runs_with_its_folder_environment_over_grpc(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inp = grpcclient.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([1], np.int32))
    seen = json.loads(client.infer("env_folder", [inp]).as_numpy("OUT")[0])
    assert seen["marker"] == "folder"
    assert seen["virtual_env"] == str((Path(server.model_repository) / "env_folder" / "pyenv").resolve())


def test_a_changed_archive_is_unpacked_again(server, repo):
    client = httpclient.InferenceServerClient(server.url)
    first = _seen(client, "env_archive")["virtual_env"]
    archive = repo / "env_archive" / "env.tar.gz"
    _write_archive(archive, _env_files("archive-v2"))
    later = time.time() + 5
    os.utime(archive, (later, later))  # a distinct modification time whatever the clock's grain
    client.load_model("env_archive")
    seen = _seen(client, "env_archive")
    assert seen["marker"] == "archive-v2"
    assert seen["virtual_env"] != first


@pytest.mark.parametrize("model, text", [
    ("env_other_python", "must be built for the same Python version"),
    ("env_no_activate", "does not exist. The Python environment should contain an 'activate' script."),
    ("env_missing", "Failed to get the canonical path for"),
    ("env_thread", "EXECUTION_MODE"),
    ("env_link_out", "failed to extract EXECUTION_ENV_PATH"),
])
def test_an_unusable_environment_fails_the_load(server, model, text):
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException) as info:
        client.load_model(model)
    assert text in str(info.value)
    assert not client.is_model_ready(model)
    # the server keeps serving
    assert _seen(client, "env_folder")["marker"] == "folder"


def test_nothing_is_written_outside_the_unpacked_folder(server):
    # The refused link was not created anywhere the stub could follow it.
    client = httpclient.InferenceServerClient(server.url)
    root = Path(_seen(client, "env_archive")["virtual_env"]).parent
    assert not any(p.is_symlink() and p.name == "escape" for p in root.rglob("escape"))
