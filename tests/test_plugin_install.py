"""Backends found only because their plugin distribution is installed.

- blocking a plugin makes its models fail to load with a message saying it is blocked;
- the example plugin package (plugins/modelhost-example-backend) works as a third-party plugin;
- in a fresh virtual environment (no system site-packages) with modelhost installed from this
  checkout, models of a backend whose plugin is not installed fail with that message; installing
  the plugin serves them, uninstalling it fails them again.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from host.testing import free_port, serve, wait_until

pytestmark = pytest.mark.modelhost_only

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_PLUGIN = ROOT / "plugins" / "modelhost-example-backend"

_EXAMPLE_CONFIG = """
backend: "example"
max_batch_size: 8
dynamic_batching { preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 20000000 }
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
parameters { key: "factor" value { string_value: "2.5" } }
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


def _repository(root: Path) -> Path:
    """An ONNX model, a TorchScript model (files need not be valid: no backend gets that far)
    and a model of the example plugin."""
    for name, filename, backend in (("an_onnx_model", "model.onnx", "onnxruntime"),
                                    ("a_torch_model", "model.pt", "pytorch")):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / filename).write_bytes(b"unused")
        (root / name / "config.pbtxt").write_text(f'backend: "{backend}"\n')
    (root / "scaled" / "1").mkdir(parents=True)
    (root / "scaled" / "config.pbtxt").write_text(_EXAMPLE_CONFIG)
    return root


def _index(url: str) -> dict[str, dict]:
    client = httpclient.InferenceServerClient(url)
    return {m["name"]: m for m in client.get_model_repository_index()}


def test_blocked_backend_plugins_name_the_distribution_to_install(tmp_path):
    repo = _repository(tmp_path / "models")
    with serve(repo, "--block-plugin", "onnxruntime", "--block-plugin", "pytorch") as server:
        index = _index(server.url)
    assert index["an_onnx_model"]["state"] == "UNAVAILABLE"
    # installed but blocked: the hint says so, and names no install command
    assert ("no plugin provides backend 'onnxruntime' (plugin 'onnxruntime' of modelhost-onnxruntime "
            "is installed but blocked" in index["an_onnx_model"]["reason"])
    assert ("no plugin provides backend 'pytorch' (plugin 'pytorch' of modelhost-pytorch "
            "is installed but blocked" in index["a_torch_model"]["reason"])
    assert "pip install" not in index["a_torch_model"]["reason"]


def test_example_plugin_serves_its_models(tmp_path):
    repo = _repository(tmp_path / "models")
    with serve(repo) as server:
        client = httpclient.InferenceServerClient(server.url, concurrency=4)
        config = client.get_model_config("scaled")
        assert [(o["name"], o["data_type"]) for o in config["output"]] == [("OUTPUT", "TYPE_FP32")]
        arrays = [np.arange(n, dtype=np.float32).reshape(1, n) for n in (2, 2, 2)]
        pending = []
        for array in arrays:
            tensor = httpclient.InferInput("INPUT", list(array.shape), "FP32")
            tensor.set_data_from_numpy(array)
            pending.append(client.async_infer("scaled", [tensor]))
        for array, p in zip(arrays, pending):
            np.testing.assert_allclose(p.get_result(timeout=60).as_numpy("OUTPUT"), array * 2.5)
        stats = client.get_inference_statistics("scaled")["model_stats"][0]
        assert stats["inference_count"] == 3 and stats["execution_count"] == 1


# --- a fresh virtual environment ---------------------------------------------------------------

def _pip(env_dir: Path, *args: str) -> None:
    subprocess.run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q",
                    "--disable-pip-version-check", *args], check=True, timeout=900)


class _Serve:
    """`modelhost serve` of the virtual environment (its console script), on free ports."""

    def __init__(self, env_dir: Path, repo: Path, log: Path) -> None:
        self.port = free_port()
        command = [str(env_dir / "bin" / "modelhost"), "serve", "--model-repository", str(repo),
                   "--http-address", "127.0.0.1", "--http-port", str(self.port),
                   "--grpc-port", str(free_port()), "--metrics-port", str(free_port())]
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        self.log = open(log, "wb")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT,
                                        env=env, cwd=repo)
        self.url = f"127.0.0.1:{self.port}"

    def __enter__(self) -> _Serve:
        def ready() -> bool:
            assert self.process.poll() is None, "the server exited"
            try:
                return httpclient.InferenceServerClient(self.url).is_server_ready()
            except Exception:
                return False
        wait_until(ready, 120, 0.2, "modelhost of the fresh environment did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def test_fresh_environment_without_then_with_the_plugin(tmp_path):
    env_dir = tmp_path / "env"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    _pip(env_dir, str(ROOT))
    repo = _repository(tmp_path / "models")
    log = tmp_path / "serve.log"

    with _Serve(env_dir, repo, log) as server:
        index = _index(server.url)
    hint = "(install the plugin from a modelhost checkout: pip install ./plugins/modelhost-onnxruntime)"
    assert hint in index["an_onnx_model"]["reason"]
    # the hint's command works, from the checkout's root
    assert (ROOT / "plugins" / "modelhost-onnxruntime" / "pyproject.toml").is_file()
    assert "no plugin provides backend 'example'" in index["scaled"]["reason"]
    assert index["scaled"]["state"] == "UNAVAILABLE"

    _pip(env_dir, str(EXAMPLE_PLUGIN))
    with _Serve(env_dir, repo, log) as server:
        assert _index(server.url)["scaled"]["state"] == "READY"
        tensor = httpclient.InferInput("INPUT", [1, 2], "FP32")
        tensor.set_data_from_numpy(np.array([[1, 2]], dtype=np.float32))
        out = httpclient.InferenceServerClient(server.url).infer("scaled", [tensor])
        np.testing.assert_allclose(out.as_numpy("OUTPUT"), [[2.5, 5.0]])

    subprocess.run([str(env_dir / "bin" / "python"), "-m", "pip", "uninstall", "-q", "-y",
                    "modelhost-example-backend"], check=True, timeout=300)
    with _Serve(env_dir, repo, log) as server:
        index = _index(server.url)
    assert index["scaled"]["state"] == "UNAVAILABLE"
    assert "no plugin provides backend 'example'" in index["scaled"]["reason"]
    assert sys.prefix != str(env_dir)  # the suite's own environment was left alone
