"""The "inflight" backend inside a real Host (no server process, so the test can reach into the
model): logits post-processors from a plugin object given to the plugin manager (as an embedder
does; test_llm_processor_serve.py installs one for a real server), and a batch manager that dies
making its model UNAVAILABLE with requests failing at once (issue 15, finding 6)."""

from __future__ import annotations

import queue
from typing import Any

import numpy as np
import pytest
import torch
from llm_checkpoints import served_model

from host.core import Host
from host.errors import HostError
from host.inference import InferenceRequest
from host.model import UNAVAILABLE
from host.options import ServerOptions
from host.plugins import get_plugin_manager, hookimpl

FORCED = 7


def force(request_id: int, logits: torch.Tensor, beams: list[list[int]], client_id: Any) -> torch.Tensor:
    out = torch.full_like(logits, -torch.inf)
    out[FORCED] = 0.0
    return out


def broken(request_id: int, logits: torch.Tensor, beams: list[list[int]], client_id: Any) -> torch.Tensor:
    raise RuntimeError("this processor always fails")


class Processors:
    @hookimpl
    def modelhost_register_logits_processors(self, registry):
        registry.add_logits_processor("force7", force)
        registry.add_logits_processor("broken", broken)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Any:
    repo = tmp_path_factory.mktemp("llm_host")
    served_model(repo, "plain")
    h = Host(ServerOptions(model_repositories=[repo]),
             plugins=get_plugin_manager(blocked=["python"], extra=[Processors()]))
    h.start()
    yield h
    h.stop()


def generate(host: Host, model: str, **parameters: Any) -> list[Any]:
    """Every response (or the error) of one text request."""
    request = InferenceRequest(model_name=model, parameters={"text_input": "Hello", "max_tokens": 4,
                                                             "ignore_eos": True, **parameters})
    got: queue.SimpleQueue = queue.SimpleQueue()
    host.submit(request, lambda r, final: got.put((r, final)))
    out = []
    while True:
        response, final = got.get(timeout=60)
        if response is not None:
            out.append(response)
        if final:
            return out


def output_ids(responses: list[Any]) -> list[int]:
    (r,) = responses
    assert r.error is None, r.error
    return np.asarray(next(t.data for t in r.outputs if t.name == "output_ids")).reshape(-1).tolist()


def test_a_plugins_processor_named_by_a_request_and_its_failure_stays_with_it(host):
    assert output_ids(generate(host, "plain", logits_post_processor="force7")) == [FORCED] * 4
    (failed,) = generate(host, "plain", logits_post_processor="broken")
    assert "this processor always fails" in failed.error.message
    (unknown,) = generate(host, "plain", logits_post_processor="nope")
    assert "no processor named 'nope'" in unknown.error.message
    assert len(output_ids(generate(host, "plain"))) == 4  # the model serves on


def test_a_dead_manager_makes_the_model_unavailable(host):
    model = host.manager.get("plain")._model

    def bug(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a bug in the scheduler")

    model.manager.scheduler.schedule = bug
    (first,) = generate(host, "plain")
    assert "batch manager failed" in first.error.message
    model.manager._thread.join(30)
    assert not host.model_ready("plain")
    assert host.manager.entry("plain").versions[1].state == UNAVAILABLE
    with pytest.raises(HostError) as info:  # refused at once, not queued for a thread that is gone
        generate(host, "plain")
    assert "plain" in info.value.message
