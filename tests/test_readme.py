"""The README's tour works as written: its python snippets and curl commands, run against
`modelhost serve` on the example repository (with a cache and client shared memory on, as the
tour's sections say), in the README's order."""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from host.testing import serve

pytestmark = pytest.mark.modelhost_only

ROOT = Path(__file__).resolve().parent.parent


def _tour() -> str:
    text = (ROOT / "README.md").read_text()
    return text[text.index("## A tour of the example repository"):
                text.index("## Serving your own repository")]


def _ports(code: str, server) -> str:
    return (code.replace("localhost:8000", server.url)
            .replace("localhost:8001", server.grpc_url)
            .replace("localhost:8002", f"127.0.0.1:{server.metrics_port}"))


@pytest.fixture(scope="module")
def server():
    with serve(ROOT / "model_repository", "--cache-config", "local,size=16777216",
               "--allow-client-shm=true") as process:
        # Every example model loads; if one does not, say why here rather than in a snippet.
        index = httpclient.InferenceServerClient(process.url).get_model_repository_index()
        failed = [m for m in index if m.get("state") != "READY"]
        assert not failed, (failed, process.log_text()[-6000:])
        yield process


def test_python_snippets_run_and_print_what_the_readme_says(server):
    blocks = re.findall(r"```python\n(.*?)```", _tour(), re.S)
    assert len(blocks) >= 5
    namespace: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for block in blocks:
            exec(compile(_ports(block, server), "README.md", "exec"), namespace)
    printed = out.getvalue()
    assert "(3, 8)" in printed                                    # onnx_mlp over binary HTTP
    assert [int(r[0]) for r in namespace["results"]] == [4, 2, 0]  # the gRPC stream
    stats = namespace["stats"]                                    # the response cache section
    assert (stats.inference_stats.cache_hit.count, stats.inference_stats.cache_miss.count,
            stats.execution_count) == (2, 1, 1)
    assert "2 1 1" in printed
    assert namespace["sums"] == [("100/0", 1), ("100/1", 3), ("100/2", 6),      # sequences
                                 ("200/0", -1), ("200/1", -3), ("200/2", -6)]
    assert namespace["total"].tolist() == [18]                                 # implicit state
    assert "simple [1 2 3]" in printed and "onnx_add_sub [1 2 3]" in printed  # BLS routing


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_commands_answer(server):
    blocks = re.findall(r"```bash\n(.*?)```", _tour(), re.S)
    commands = []
    for block in blocks:
        joined = re.sub(r"\\\n\s*", " ", block)               # continuation lines
        command = ""
        for line in joined.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            command += line + "\n"
            if command.count("'") % 2 == 0:                   # a quoted body may span lines
                commands.append(command.split("  #")[0].strip())
                command = ""
    assert any("onnx_add_sub/infer" in c for c in commands)
    for command in commands:
        if not command.startswith("curl"):
            continue
        run = subprocess.run(_ports(command, server), shell=True, capture_output=True,
                             text=True, timeout=60)
        assert run.returncode == 0, (command, run.stderr)
        assert '"error"' not in run.stdout, (command, run.stdout)
        if "torch_named/infer" in command:
            assert '"data":[1.5,8.0]' in run.stdout
        if "onnx_add_sub/infer" in command:
            assert np.array_equal(
                [int(v) for v in re.search(r'"data":\[([^\]]*)\]', run.stdout).group(1).split(",")],
                np.arange(16) + 1)
