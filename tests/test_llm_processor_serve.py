"""A logits post-processor from an installed plugin (an entry point in the `modelhost` group),
behind a real `modelhost serve`: one named by the model's config shapes every request; one that
raises fails only the request that named it, and the model stays READY (issue 15, finding 6)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Iterator

import pytest
from llm_checkpoints import REPO_ROOT, served_model

from host.testing import ServerProcess, serve

pytestmark = pytest.mark.modelhost_only

PLUGIN = '''
import torch
from host.plugins import hookimpl


def only_seven(request_id, logits, beam_tokens, client_id):
    out = torch.full_like(logits, -torch.inf)
    out[7] = 0.0
    return out


def broken(request_id, logits, beam_tokens, client_id):
    raise RuntimeError("this processor always fails")


@hookimpl
def modelhost_register_logits_processors(registry):
    registry.add_logits_processor("only_seven", only_seven)
    registry.add_logits_processor("broken", broken)
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("processor")
    site = root / "site"  # an installed distribution, as pip leaves it: a module and its dist-info
    (site / "llm_processors-1.0.dist-info").mkdir(parents=True)
    (site / "llm_processors.py").write_text(PLUGIN)
    (site / "llm_processors-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: llm-processors\nVersion: 1.0\n")
    (site / "llm_processors-1.0.dist-info" / "entry_points.txt").write_text(
        "[modelhost]\nllm_processors = llm_processors\n")
    repo = root / "repo"
    served_model(repo, "forced", "--param", "logits_post_processor=only_seven")
    with serve(repo, env={"PYTHONPATH": f"{site}:{REPO_ROOT}"}) as process:
        yield process


def generate(server: ServerProcess, model: str, **extra: object) -> tuple[int, dict]:
    body = json.dumps({"text_input": "Hello", "max_tokens": 4, "ignore_eos": True, **extra}).encode()
    req = urllib.request.Request(f"{server.http_url}/v2/models/{model}/generate", data=body)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_configs_processor_shapes_every_request(server):
    status, doc = generate(server, "forced")
    assert status == 200 and doc["output_ids"] == [7, 7, 7, 7]


def test_a_failing_processor_fails_only_its_request(server):
    status, doc = generate(server, "forced", logits_post_processor="broken")  # the request's wins
    assert status == 500 and "this processor always fails" in doc["error"]
    status, doc = generate(server, "forced", logits_post_processor="nope")
    assert status == 400 and "no processor named 'nope'" in doc["error"]
    status, doc = generate(server, "forced")
    assert status == 200 and doc["output_ids"] == [7, 7, 7, 7]
    assert urllib.request.urlopen(f"{server.http_url}/v2/models/forced/ready").status == 200
