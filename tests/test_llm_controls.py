"""Generation controls of the batch manager (host.inflight), embedded: parameter checks,
failures that stay with their request, stop and bad words, penalties, min_tokens, top log
probs, padded outputs, the V1 scheme's statistics, verified prefix reuse, a dying loop."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from host.inflight import (BatchManager, DecoderConfig, GenerationRequest, KVCacheConfig,
                           SamplingParams, SchedulerConfig, TinyDecoder)
from host.inflight.queue import RequestQueue
from host.inflight.scheduler import BatchingScheme

VOCAB = 128


@pytest.fixture(scope="module")
def model() -> TinyDecoder:
    return TinyDecoder(DecoderConfig(vocab_size=VOCAB, d_model=32, heads=4, kv_heads=2, layers=2,
                                     d_ff=64, max_seq_len=128, seed=5, dtype="float64"))


def run(model, requests, batching=BatchingScheme.INFLIGHT_FUSED, reuse=False, **options):
    q = RequestQueue()
    manager = q.start(model, scheduler_config=SchedulerConfig(max_batch_size=8, batching=batching),
                      kv_cache_config=KVCacheConfig(max_tokens=2048, tokens_per_block=4,
                                                    enable_block_reuse=reuse), **options)
    q.submit(*requests)
    results = {r.request_id: r for r in q.wait_all(120)}
    manager.shutdown()
    return results, q, manager


def gen(i: int, prompt=(3, 4, 5, 6), n: int = 12, **kw) -> GenerationRequest:
    return GenerationRequest(i, list(prompt), n, exclude_input_in_output=True, **kw)


@pytest.mark.parametrize("request_, name", [
    (gen(1, sampling=SamplingParams(temperature=math.nan)), "temperature"),
    (gen(1, sampling=SamplingParams(temperature=-1.0)), "temperature"),
    (gen(1, sampling=SamplingParams(temperature=math.inf)), "temperature"),
    (gen(1, sampling=SamplingParams(top_k=-1)), "top_k"),
    (gen(1, sampling=SamplingParams(top_p=1.5)), "top_p"),
    (gen(1, sampling=SamplingParams(top_p=math.nan)), "top_p"),
    (gen(1, sampling=SamplingParams(seed=-1)), "seed"),
    (gen(1, sampling=SamplingParams(repetition_penalty=0.0)), "repetition_penalty"),
    (gen(1, sampling=SamplingParams(presence_penalty=3.0)), "presence_penalty"),
    (gen(1, sampling=SamplingParams(frequency_penalty=math.nan)), "frequency_penalty"),
    (gen(1, sampling=SamplingParams(min_tokens=20)), "min_tokens"),
    (gen(1, top_log_probs=21), "top_logprobs"),
    (gen(1, beam_width=0), "beam"),
    (gen(1, length_penalty=math.nan), "length_penalty"),
    (gen(1, stop_words=[[]]), "stop_words"),
    (gen(1, bad_words=[[VOCAB + 1]]), "bad_words"),
    (gen(1, n=0), "tokens to generate"),
])
def test_every_bad_value_is_refused_naming_it(model, request_, name):
    results, _, manager = run(model, [request_, gen(2)])
    assert name in results[1].error
    assert results[2].error == "" and len(results[2].tokens) == 12  # the loop went on
    assert manager.error is None


def test_a_tiny_temperature_is_greedy_not_a_crash(model):
    """issue 15, finding 6: temperature 1e-38 with top_k 40 used to kill the loop (inf logits)."""
    results, _, manager = run(model, [gen(1, sampling=SamplingParams(temperature=1e-38, top_k=40)),
                                      gen(2)])
    assert results[1].error == "" and results[1].tokens == results[2].tokens
    assert manager.error is None


def test_a_failing_post_processor_fails_only_its_request(model):
    def broken(request_id, logits, beams, client_id):
        raise RuntimeError("boom")

    def wrong_shape(request_id, logits, beams, client_id):
        return logits[:3]

    results, _, manager = run(model, [gen(1, logits_post_processor=broken),
                                      gen(2, logits_post_processor=wrong_shape), gen(3)])
    assert "RuntimeError: boom" in results[1].error
    assert "not a tensor of shape" in results[2].error
    assert results[3].error == "" and len(results[3].tokens) == 12
    assert manager.error is None


def test_stop_words_end_generation_after_them(model):
    free, _, _ = run(model, [gen(1)])
    tokens = free[1].tokens
    stop = tokens[4:6]
    results, _, _ = run(model, [gen(1, stop_words=[[VOCAB - 1, VOCAB - 2], stop])])
    out = results[1].tokens
    assert out[-2:] == stop and out == tokens[:len(out)] and len(out) <= 6


def test_bad_words_are_never_chosen(model):
    free, _, _ = run(model, [gen(1)])
    banned = free[1].tokens[0]
    results, _, _ = run(model, [gen(1, bad_words=[[banned]]), gen(2, bad_words=[[VOCAB - 1, banned]])])
    assert banned not in results[1].tokens
    assert results[1].tokens[0] != banned
    assert results[2].tokens[0] == banned  # a two-token bad word needs its first token before


def _adjusted(model, tokens, prompt_len, rep=1.0, freq=0.0, pres=0.0):
    logits = model.reference_logits(tokens)[-1].clone()
    seen = sorted(set(tokens))
    for t in seen:
        logits[t] = logits[t] / rep if logits[t] > 0 else logits[t] * rep
    out = tokens[prompt_len:]
    for t in set(out):
        logits[t] -= freq * out.count(t) + pres
    return int(logits.argmax())


@pytest.mark.parametrize("penalties", [dict(repetition_penalty=1.8), dict(frequency_penalty=1.5),
                                       dict(presence_penalty=2.0)])
def test_penalties_follow_their_definitions(model, penalties):
    prompt = [3, 4, 5, 6]
    results, _, _ = run(model, [gen(1, prompt, 10, sampling=SamplingParams(**penalties))])
    got = results[1].tokens
    tokens = list(prompt)
    for _ in range(10):
        tokens.append(_adjusted(model, tokens, len(prompt), penalties.get("repetition_penalty", 1.0),
                                penalties.get("frequency_penalty", 0.0), penalties.get("presence_penalty", 0.0)))
    assert got == tokens[len(prompt):]
    free, _, _ = run(model, [gen(1, prompt, 10)])
    assert got != free[1].tokens  # the penalty made a difference here


def test_min_tokens_hold_back_the_end(model):
    free, _, _ = run(model, [gen(1)])
    end = free[1].tokens[1]
    early, _, _ = run(model, [gen(1, end_id=end)])
    held, _, _ = run(model, [gen(1, end_id=end, sampling=SamplingParams(min_tokens=6))])
    assert len(early[1].tokens) == 2
    assert len(held[1].tokens) >= 6 and end not in held[1].tokens[:5]


def test_top_log_probs_and_padded_output_ids(model):
    results, _, _ = run(model, [gen(1, n=5, top_log_probs=3, return_log_probs=True),
                                gen(2, n=5, pad_to_max_length=True, pad_id=0)])
    (out,) = results[1].responses
    assert out["top_token_ids"].shape == (1, 1, 5, 3) and out["top_log_probs"].shape == (1, 1, 5, 3)
    tokens = [3, 4, 5, 6] + out["output_ids"].reshape(-1).tolist()
    logits = model.reference_logits(tokens[:-1])[3:]
    lp = torch.log_softmax(logits.double(), -1)
    values, ids = torch.topk(lp, 3)
    assert out["top_token_ids"][0, 0].tolist() == ids.tolist()
    np.testing.assert_allclose(out["top_log_probs"][0, 0], values.numpy(), rtol=1e-5)
    (padded,) = results[2].responses
    assert padded["output_ids"].shape == (1, 1, model.max_seq_len)
    assert padded["sequence_length"].tolist() == [[5]]
    assert padded["output_ids"][0, 0, 5:].tolist() == [0] * (model.max_seq_len - 5)


def test_v1_runs_batches_in_lockstep_and_reports_its_fields(model):
    requests = [gen(1, n=3), gen(2, n=9), gen(3, n=6)]
    results, q, _ = run(model, requests + [gen(4, n=2)], batching=BatchingScheme.V1)
    assert all(r.error == "" for r in results.values())
    v1 = [s for s in q.stats if "Empty Generation Slots" in s]
    assert v1 and all("Total Generation Tokens" in s for s in v1)
    assert max(s["Empty Generation Slots"] for s in v1) > 0  # finished requests leave empty slots
    assert sum(s["Total Generation Tokens"] for s in v1) == 3 + 9 + 6 + 2
    # one batch of four; at the end only the longest runs, beside three empty slots
    assert v1[0]["Scheduled Requests"] == 4 and v1[-1]["Empty Generation Slots"] == 3


def test_v1_refuses_a_post_processor(model):
    results, _, _ = run(model, [gen(1, logits_post_processor=lambda *a: a[1])],
                        batching=BatchingScheme.V1)
    assert "V1" in results[1].error


def test_requests_arriving_together_share_their_prefix(model):
    prefix = list(range(10, 42))  # 8 full blocks of 4
    a, b = gen(1, prefix + [1, 2], 6), gen(2, prefix + [7], 6)
    together, q, manager = run(model, [a, b], reuse=True)
    alone_a, _, _ = run(model, [gen(1, prefix + [1, 2], 6)])
    alone_b, _, _ = run(model, [gen(2, prefix + [7], 6)])
    assert together[1].tokens == alone_a[1].tokens and together[2].tokens == alone_b[2].tokens
    assert q.stats[0]["Reused KV cache blocks"] == 8  # in the very first iteration
    assert q.stats[0]["Total Context Tokens"] == 34 + 1 + 0  # b computed its last token only


def test_reuse_verifies_tokens_not_only_hashes(model, monkeypatch):
    """Every block hashes alike here: only the token check stands between a request and
    someone else's keys and values."""
    from host.inflight import kv_cache

    monkeypatch.setattr(kv_cache.KVCache, "block_hashes",
                        lambda self, tokens, count, start=0, previous=0: [7] * count)
    first, second = gen(1, list(range(10, 30)), 6), gen(2, list(range(50, 70)), 6)
    q = RequestQueue()
    manager = q.start(model, scheduler_config=SchedulerConfig(max_batch_size=1),
                      kv_cache_config=KVCacheConfig(max_tokens=2048, tokens_per_block=4,
                                                    enable_block_reuse=True))
    q.submit(first)
    q.result(1)
    q.submit(second)
    got = q.result(2)
    manager.shutdown()
    alone, _, _ = run(model, [gen(2, list(range(50, 70)), 6)])
    assert got.tokens == alone[2].tokens
    assert manager.cache.reused_blocks == 0


def test_a_dying_loop_fails_fast_and_says_so(model):
    failures = []
    q = RequestQueue()
    manager = q.start(model, scheduler_config=SchedulerConfig(max_batch_size=4),
                      kv_cache_config=KVCacheConfig(max_tokens=1024), on_failure=failures.append)

    def broken(*args, **kwargs):
        raise MemoryError("a bug in the loop")

    manager.scheduler.schedule = broken
    q.submit(gen(1))
    result = q.result(1, timeout=30)
    manager._thread.join(30)
    assert "batch manager failed" in result.error and not manager.running
    assert len(failures) == 1 and isinstance(failures[0], MemoryError)
    assert "not running" in manager.check(gen(2))


def test_seeded_sampling_with_temperature_alone_under_openai_convention(model):
    """top_p 1.0 (what the OpenAI front end sends) samples at any temperature; top_p 0 with no
    top_k is TensorRT-LLM's greedy."""
    sampled, _, _ = run(model, [gen(i, n=20, sampling=SamplingParams(temperature=1.5, top_p=1.0, seed=i))
                                for i in (1, 2)])
    greedy, _, _ = run(model, [gen(3, n=20, sampling=SamplingParams(temperature=1.5))])
    free, _, _ = run(model, [gen(4, n=20)])
    assert greedy[3].tokens == free[4].tokens
    assert sampled[1].tokens != sampled[2].tokens


def test_beam_search_validation(model):
    results, _, _ = run(model, [gen(1, beam_width=2, streaming=True), gen(2, beam_width=3)],
                        max_beam_width=2)
    assert "streaming" in results[1].error
    assert "beam width 3" in results[2].error


def test_a_manager_is_still_a_library(model):
    sent = []
    manager = BatchManager(model, get_new_requests=lambda n: [gen(1, n=3)] if not sent else [],
                           send_response=lambda *a: sent.append(a),
                           kv_cache_config=KVCacheConfig(max_tokens=512))
    import time

    deadline = time.monotonic() + 30
    while not any(a[2] for a in sent) and time.monotonic() < deadline:
        time.sleep(0.01)
    manager.shutdown()
    assert sent[-1][2] and sent[-1][3] == ""
