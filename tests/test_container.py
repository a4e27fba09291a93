"""The container image's contents, without Docker: its root filesystem is built the way the
Dockerfile builds it, and a server is started from it.

The Dockerfile's build stage runs `scripts/build_rootfs.sh /opt/modelhost cpu` on a
python:3.11-slim base; this test runs the same script with this machine's Python 3.11 into a
fresh prefix (a virtual environment without the system's site-packages: everything the image
holds is installed by the script, from the package index), then starts the image's ENTRYPOINT
and CMD with the image's environment, and asks its HEALTHCHECK.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from host.testing import free_port, wait_until

pytestmark = pytest.mark.modelhost_only

ROOT = Path(__file__).resolve().parent.parent


def _final_stage(dockerfile: str) -> dict[str, object]:
    """ENV, ENTRYPOINT, CMD, HEALTHCHECK and the install RUN of the default (last) stage."""
    text = dockerfile.replace("\\\n", " ")
    stages = re.split(r"^FROM ", text, flags=re.M)
    build, final = stages[-2], stages[-1]
    env: dict[str, str] = {}
    copies: dict[str, str] = {}  # files copied from the build context: image path -> source
    for line in final.splitlines():
        if line.startswith("ENV "):
            for item in shlex.split(line[4:]):
                key, _, value = item.partition("=")
                env[key] = value
        if line.startswith("COPY ") and "--from=" not in line:
            source, target = line.split()[1:3]
            copies[target] = source
    def instruction(name: str, stage: str) -> str:  # the stage's last one
        return [line[len(name) + 1:].strip() for line in stage.splitlines()
                if line.startswith(name + " ")][-1]
    return {"env": env, "entrypoint": json.loads(instruction("ENTRYPOINT", final)),
            "cmd": json.loads(instruction("CMD", final)),
            "healthcheck": json.loads(instruction("HEALTHCHECK", final).split(" CMD ", 1)[1]),
            "install": instruction("RUN", build), "copies": copies}


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("no C compiler: the image's build stage has one")
    stage = _final_stage((ROOT / "Dockerfile").read_text())
    assert "scripts/build_rootfs.sh /opt/modelhost cpu" in stage["install"]
    prefix = tmp_path_factory.mktemp("image") / "opt" / "modelhost"
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not k.startswith("MODELHOST_")}
    env["PYTHON"] = shutil.which("python3.11") or "python3"
    result = subprocess.run(["bash", "scripts/build_rootfs.sh", str(prefix), "cpu"], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    return prefix, stage


def _image_command(prefix: Path, argv: list[str]) -> list[str]:
    return [arg.replace("/opt/modelhost", str(prefix)) for arg in argv]


def test_the_image_serves_and_reports_healthy(rootfs, tmp_path):
    prefix, stage = rootfs
    # no system site-packages: what runs is what the script installed
    assert "include-system-site-packages = false" in (prefix / "pyvenv.cfg").read_text()
    assert not (prefix / "bin" / "pip").exists()  # pip is left out of the image
    models = tmp_path / "models"  # the volume the image serves (/models)
    models.mkdir()
    for name in ("identity_fp32", "onnx_mlp"):
        shutil.copytree(ROOT / "model_repository" / name, models / name)
    # the image's files from the build context, at their image paths under a scratch root
    image_root = tmp_path / "image-root"
    for target, source in stage["copies"].items():
        (image_root / target.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / source, image_root / target.lstrip("/"))
    env = {"PATH": f"{prefix}/bin:/usr/bin:/bin", "HOME": str(tmp_path)}
    env.update({k: v.replace("/opt/modelhost", str(prefix)).replace("$PATH", "/usr/bin:/bin")
                for k, v in stage["env"].items()})
    config = env["MODELHOST_CONFIG_FILE"]
    assert config in stage["copies"]  # the image's default settings: model-repository /models
    env["MODELHOST_CONFIG_FILE"] = str(image_root / config.lstrip("/"))
    assert "/models" in Path(env["MODELHOST_CONFIG_FILE"]).read_text()
    port = free_port()
    # the variables a user passes (docker run -e) win over the image's file
    env.update(MODELHOST_MODEL_REPOSITORY=str(models), MODELHOST_HTTP_PORT=str(port),
               MODELHOST_GRPC_PORT=str(free_port()), MODELHOST_METRICS_PORT=str(free_port()),
               MODELHOST_HTTP_ADDRESS="127.0.0.1")
    command = _image_command(prefix, stage["entrypoint"] + stage["cmd"])
    health = _image_command(prefix, stage["healthcheck"])
    log = open(tmp_path / "serve.log", "wb")
    server = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:
        assert subprocess.run(health, env=env, capture_output=True, timeout=30).returncode == 1

        def healthy() -> bool:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()
            return subprocess.run(health, env=env, capture_output=True, timeout=30).returncode == 0

        wait_until(healthy, 120, 0.5, "the image's HEALTHCHECK never passed")
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        x = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)
        tensor = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        assert client.infer("onnx_mlp", [tensor]).as_numpy("OUTPUT0").shape == (2, 8)
        index = {m["name"]: m["state"] for m in client.get_model_repository_index()}
        assert index == {"identity_fp32": "READY", "onnx_mlp": "READY"}
        plugins = subprocess.run([str(prefix / "bin" / "modelhost"), "plugins"], env=env,
                                 capture_output=True, text=True, timeout=60).stdout
        assert "onnxruntime" in plugins and "redis" in plugins
        # the native bridge was compiled in the image (the build stage has gcc)
        assert list((prefix / "lib").glob("python3*/site-packages/host/native/libtritonserver*.so"))
    finally:
        server.terminate()
        assert server.wait(60) == 0
        log.close()
