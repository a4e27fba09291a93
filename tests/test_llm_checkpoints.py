"""Hugging Face checkpoints in the batch manager: the same greedy (and beam) tokens as
`transformers`' generate on the same files, the tokenizer and chat template as `transformers`
renders them, and clear errors for checkpoints that do not fit their config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from llm_checkpoints import checkpoint
from safetensors.torch import load_file, save_file

from host.inflight import GenerationRequest, KVCacheConfig, SchedulerConfig
from host.inflight.hf import CheckpointError, load_checkpoint
from host.inflight.queue import RequestQueue
from host.inflight.text import TextCodec

transformers = pytest.importorskip("transformers")

PROMPTS = [[3, 4, 5, 6, 7], list(range(10, 31)), [1, 2]]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ckpt")
    return {
        "llama": checkpoint(root / "llama", "llama"),
        "qwen2": checkpoint(root / "qwen2", "qwen2"),
        "mistral": checkpoint(root / "mistral", "mistral", window=6),  # prompts are longer
        "gpt2": checkpoint(root / "gpt2", "gpt2"),
    }


def run(model, requests, **options):
    q = RequestQueue(keep_stats=False)
    manager = q.start(model, scheduler_config=SchedulerConfig(max_batch_size=8),
                      kv_cache_config=KVCacheConfig(max_tokens=2048, tokens_per_block=4), **options)
    q.submit(*requests)
    results = q.wait_all(120)
    manager.shutdown()
    return {r.request_id: r for r in results}


def reference(path: Path, prompt: list[int], n: int, **kw) -> list[list[int]]:
    hf = transformers.AutoModelForCausalLM.from_pretrained(path)
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                      eos_token_id=None, pad_token_id=0, **kw)
    return out[:, len(prompt):].tolist()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral", "gpt2"])
def test_greedy_tokens_are_transformers_tokens(checkpoints, arch):
    path = checkpoints[arch]
    results = run(load_checkpoint(path),
                  [GenerationRequest(i, p, 16, exclude_input_in_output=True) for i, p in enumerate(PROMPTS)])
    for i, prompt in enumerate(PROMPTS):
        assert results[i].error == ""
        assert results[i].tokens == reference(path, prompt, 16)[0], arch


def test_the_sliding_window_matters(checkpoints):
    """Mistral's window of 6 changes the tokens of a long prompt (so the test above checks it)."""
    path = checkpoints["mistral"]
    windowed = run(load_checkpoint(path), [GenerationRequest(1, PROMPTS[1], 8, exclude_input_in_output=True)])
    model = load_checkpoint(path)
    model.window = None
    full = run(model, [GenerationRequest(1, PROMPTS[1], 8, exclude_input_in_output=True)])
    assert windowed[1].tokens != full[1].tokens
    # maxAttentionWindow narrows it further, and that changes the tokens again
    narrow = run(load_checkpoint(path), [GenerationRequest(1, PROMPTS[1], 8, exclude_input_in_output=True)],
                 max_attention_window=3)
    assert narrow[1].tokens != windowed[1].tokens


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_beam_search_is_transformers_beam_search(checkpoints, arch):
    path = checkpoints[arch]
    results = run(load_checkpoint(path),
                  [GenerationRequest(i, p, 10, beam_width=3, exclude_input_in_output=True)
                   for i, p in enumerate(PROMPTS[:2])], max_beam_width=4)
    for i, prompt in enumerate(PROMPTS[:2]):
        (out,) = results[i].responses
        assert out["output_ids"].shape == (1, 3, 10)
        assert out["sequence_length"].tolist() == [[10, 10, 10]]
        assert out["cum_log_probs"].shape == (1, 3) and out["output_log_probs"].shape == (1, 3, 10)
        expected = reference(path, prompt, 10, num_beams=3, num_return_sequences=3, early_stopping=False)
        assert out["output_ids"][0].tolist() == expected


def test_bfloat16_runs(checkpoints):
    results = run(load_checkpoint(checkpoints["llama"], dtype="bfloat16"),
                  [GenerationRequest(1, PROMPTS[0], 8)])
    assert results[1].error == "" and len(results[1].tokens) == 5 + 8


def test_chat_template_and_tokens_are_transformers(checkpoints):
    path = checkpoints["llama"]
    ours = TextCodec.from_dir(path)
    theirs = transformers.AutoTokenizer.from_pretrained(path)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there!"}]
    assert ours.chat(messages) == theirs.apply_chat_template(messages, tokenize=False,
                                                             add_generation_prompt=True)
    assert ours.encode("The quick brown fox") == theirs("The quick brown fox")["input_ids"]
    ids = ours.encode("jumps over the lazy dog")
    assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)


def test_text_stream_stops_and_holds_back(checkpoints):
    codec = TextCodec.from_dir(checkpoints["llama"])
    ids = codec.encode("Hello, how are you today?", add_special_tokens=False)
    stream = codec.stream(stop=["are"])
    pieces, stopped = [], False
    for n in range(1, len(ids) + 1):
        stopped = stream.update(ids[:n])
        pieces.append(stream.take())
        if stopped:
            break
    assert stopped and "".join(pieces) + stream.take(True) == "Hello, how "


def _broken(tmp_path: Path, source: Path, edit) -> Path:
    out = tmp_path / "broken"
    out.mkdir()
    config = json.loads((source / "config.json").read_text())
    tensors = load_file(source / "model.safetensors")
    edit(config, tensors)
    (out / "config.json").write_text(json.dumps(config))
    save_file(tensors, out / "model.safetensors")
    return out


@pytest.mark.parametrize("edit, message", [
    (lambda c, t: t.pop("model.layers.1.mlp.up_proj.weight"), "'model.layers.1.mlp.up_proj.weight' is missing"),
    (lambda c, t: c.update(intermediate_size=48), "has shape [64, 32]; the config implies [48, 32]"),
    (lambda c, t: c.update(num_hidden_layers=1), "tensors the config does not explain: model.layers.1"),
    (lambda c, t: c.update(model_type="falcon"), "model_type 'falcon'"),
    (lambda c, t: c.update(num_key_value_heads=3), "not a multiple of num_key_value_heads 3"),
])
def test_checkpoint_errors_are_clear(checkpoints, tmp_path, edit, message):
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(_broken(tmp_path, checkpoints["llama"], edit))
    assert message in str(info.value)
