"""host.wsgi under a real gunicorn with its stock gthread worker (what the README's deployment uses)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from host.testing import free_port, wait_until

pytestmark = pytest.mark.modelhost_only

ROOT = Path(__file__).resolve().parent.parent


def test_gunicorn_serves_the_wsgi_factory(tmp_path):
    port = free_port()
    env = dict(os.environ, MODELHOST_MODEL_REPOSITORY=str(ROOT / "model_repository"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    log = open(tmp_path / "gunicorn.log", "wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-w", "1", "-k", "gthread", "--threads", "4",
         "-b", f"127.0.0.1:{port}", "host.wsgi:create()"],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    try:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")

        def ready() -> bool:
            assert process.poll() is None, (tmp_path / "gunicorn.log").read_text()[-2000:]
            try:
                return client.is_server_ready()
            except Exception:
                return False

        wait_until(ready, 120, 0.2)
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"),
                  httpclient.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(a)
        result = client.infer("simple", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)
        client.close()  # no idle keep-alive connection for the graceful stop to wait on
        process.terminate()
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()
