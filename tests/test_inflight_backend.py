"""The inflight backend's pieces that need no server: model files, config parameters, tensors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from host.backend import ModelSpec
from host.backends.inflight.backend import build_decoder, manager_options
from host.backends.inflight.tensors import generation_request
from host.config import load_config_file
from host.errors import InvalidArgumentError
from host.inference import InferenceRequest, Tensor
from host.inflight import CapacityPolicy, DecoderConfig, TinyDecoder

REPO_ROOT = Path(__file__).resolve().parent.parent


def make(tmp_path: Path, *args: str) -> ModelSpec:
    out = tmp_path / "llm"
    subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "make_llm.py"), str(out),
                    "--vocab-size", "64", "--d-model", "32", "--heads", "2", "--d-ff", "64", *args],
                   check=True, capture_output=True)
    return ModelSpec("llm", 1, tmp_path, out, load_config_file(out), "inflight")


def test_the_example_config_is_the_scripts_output(tmp_path):
    out = tmp_path / "tiny_llm"
    subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "make_llm.py"), str(out)],
                   check=True, capture_output=True)
    example = REPO_ROOT / "model_repository" / "tiny_llm" / "config.pbtxt"
    assert (out / "config.pbtxt").read_text() == example.read_text()


def test_weights_come_from_the_seed_or_the_weights_file(tmp_path):
    spec = make(tmp_path, "--seed", "3")
    seeded = build_decoder(spec)
    same = TinyDecoder(DecoderConfig(vocab_size=64, d_model=32, heads=2, d_ff=64, seed=3))
    assert torch.equal(seeded.head.weight, same.head.weight)

    spec = make(tmp_path, "--seed", "3", "--weights")
    state = torch.load(spec.version_path / "model.pt", weights_only=True)
    state["head.weight"] *= 2  # a file that differs from the seed: the file wins
    torch.save(state, spec.version_path / "model.pt")
    assert torch.equal(build_decoder(spec).head.weight, same.head.weight * 2)


def test_config_parameters(tmp_path):
    spec = make(tmp_path, "--policy", "static_batch", "--kv-tokens", "512", "--max-batch-size", "3")
    options = manager_options(spec)
    assert options["scheduler_config"].policy is CapacityPolicy.STATIC_BATCH
    assert options["scheduler_config"].max_batch_size == 3
    assert options["kv_cache_config"].max_tokens == 512
    assert options["kv_cache_config"].enable_block_reuse
    spec.config.parameters["batch_scheduler_policy"].string_value = "fastest"
    with pytest.raises(InvalidArgumentError, match="batch_scheduler_policy"):
        manager_options(spec)
    spec.config.parameters["batch_scheduler_policy"].string_value = "max_utilization"
    spec.config.parameters["max_num_tokens"].string_value = "many"
    with pytest.raises(InvalidArgumentError, match="max_num_tokens"):
        manager_options(spec)


def _request(**inputs) -> InferenceRequest:
    tensors = {}
    for name, value in inputs.items():
        array = np.asarray(value)
        tensors[name] = Tensor(name, "INT32", list(array.shape), array)
    return InferenceRequest("llm", inputs=tensors)


def test_tensors_to_a_generation_request():
    r, _ = generation_request(5, _request(input_ids=[[1, 2, 3, 0]], input_lengths=[[3]],
                                       request_output_len=[[7]], end_id=[[2]],
                                       runtime_top_k=[[4]], random_seed=[[9]]), False)
    assert (r.request_id, r.input_ids, r.max_new_tokens, r.end_id) == (5, [1, 2, 3], 7, 2)
    assert (r.sampling.top_k, r.sampling.seed, r.sampling.greedy) == (4, 9, False)
    with pytest.raises(InvalidArgumentError, match="request_output_len"):
        generation_request(1, _request(input_ids=[[1]]), False)
    with pytest.raises(InvalidArgumentError, match="one prompt per request"):
        generation_request(1, _request(input_ids=[[1], [2]], request_output_len=[[1]]), False)
    with pytest.raises(InvalidArgumentError, match="input_lengths"):
        generation_request(1, _request(input_ids=[[1]], input_lengths=[[5]], request_output_len=[[1]]), False)
    # TensorRT-LLM's words lists: [1, 2, N] ids then end offsets (-1 pads)
    r, _ = generation_request(1, _request(input_ids=[[1]], request_output_len=[[1]],
                                          stop_words_list=[[[5, 6, 7, 8], [2, 3, -1, -1]]]), False)
    assert r.stop_words == [[5, 6], [7]]
    with pytest.raises(InvalidArgumentError, match="temperature"):
        generation_request(1, InferenceRequest("llm", inputs=_request(input_ids=[[1]]).inputs,
                                               parameters={"request_output_len": 2, "temperature": "hot"}),
                           False)
