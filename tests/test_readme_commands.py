"""The README's first command, as written, in a fresh virtual environment: it installs modelhost
and the plugins from this checkout, and `modelhost serve` then serves every example model.

(The second command, tox, is what runs this test: CI runs it through .ci/run.)
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import venv
from pathlib import Path

import pytest
import tritonclient.http as httpclient

from host.testing import free_port, wait_until

pytestmark = pytest.mark.modelhost_only

ROOT = Path(__file__).resolve().parent.parent


def _commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## The two commands"):text.index("## A tour of the example repository")]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)]


def test_the_two_commands_are_two():
    install, tests = _commands()
    assert "\n" not in install and install.endswith("&& modelhost serve")
    assert tests == 'python3 -m pip install "tox>=4" && python3 -m tox -e py311'
    assert "python3 -m tox -e py311" in (ROOT / ".ci" / "run").read_text()


def test_first_command_installs_and_serves_the_examples(tmp_path):
    install, _ = _commands()
    pip_part, serve_part = install.split(" && ")
    argv = shlex.split(pip_part)
    assert argv[:4] == ["python3", "-m", "pip", "install"] and serve_part == "modelhost serve"
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not k.startswith("MODELHOST_")}
    env["PATH"] = f"{env_dir / 'bin'}:{env['PATH']}"
    result = subprocess.run([str(env_dir / "bin" / "python"), *argv[1:], "-q",
                             "--disable-pip-version-check"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=1200, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    port = free_port()
    log = open(tmp_path / "serve.log", "wb")
    server = subprocess.Popen(
        [str(env_dir / "bin" / "modelhost"), "serve", "--http-address", "127.0.0.1",
         "--http-port", str(port), "--grpc-port", str(free_port()),
         "--metrics-port", str(free_port())],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")

        def ready() -> bool:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                return client.is_server_ready()
            except Exception:  # noqa: BLE001 - not listening yet
                return False

        wait_until(ready, 180, 0.2, "the README's server did not become ready")
        index = {m["name"]: m.get("state") for m in client.get_model_repository_index()}
        examples = {p.name for p in (ROOT / "model_repository").iterdir() if p.is_dir()}
        assert set(index) == examples
        assert all(state == "READY" for state in index.values()), index
    finally:
        server.terminate()
        server.wait(60)
        log.close()
