"""The batch manager embedded directly (host.inflight), with the seed's callbacks.

The model runs in float64, so a different batch composition (which changes the order of
floating-point sums) cannot flip a greedy choice between two nearly equal logits: the equality
checks below compare the scheduling, not rounding luck.
"""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest
import torch

from host.inflight import (BatchManager, CapacityPolicy, DecoderConfig, GenerationRequest,
                           KVCacheConfig, SamplingParams, SchedulerConfig, TinyDecoder)
from host.inflight.queue import RequestQueue

VOCAB = 256


@pytest.fixture(scope="module")
def model() -> TinyDecoder:
    torch.set_num_threads(1)
    return TinyDecoder(DecoderConfig(vocab_size=VOCAB, d_model=64, heads=4, kv_heads=2, layers=2,
                                     d_ff=128, max_seq_len=256, seed=1234, dtype="float64"))


def workload(count: int = 12, seed: int = 0, **extra) -> list[GenerationRequest]:
    rng = random.Random(seed)
    return [GenerationRequest(i, [rng.randrange(VOCAB) for _ in range(rng.randint(3, 40))],
                              max_new_tokens=rng.randint(1, 40), streaming=bool(i % 2), **extra)
            for i in range(count)]


def run(model, requests, *, policy=CapacityPolicy.GUARANTEED_NO_EVICT, max_batch_size=8,
        max_tokens=4096, tokens_per_block=8, **options):
    q = RequestQueue()
    sched = SchedulerConfig(policy=policy, max_batch_size=max_batch_size,
                            max_num_tokens=options.pop("max_num_tokens", None),
                            enable_chunked_context=options.pop("chunked", False))
    kv = KVCacheConfig(max_tokens=max_tokens, tokens_per_block=tokens_per_block,
                       enable_block_reuse=options.pop("reuse", False))
    manager = q.start(model, scheduler_config=sched, kv_cache_config=kv, **options)
    q.submit(*requests)
    results = q.wait_all(300)
    manager.shutdown()
    assert not manager.running
    for r in results:
        assert r.error == "", r.error
    return {r.request_id: r.tokens for r in results}, q


def generated(request: GenerationRequest, tokens: list[int]) -> list[int]:
    """The generated part of a result (streaming results carry generated tokens only)."""
    return tokens if request.streaming else tokens[len(request.input_ids):]


@pytest.fixture(scope="module")
def one_at_a_time(model):
    outputs, _ = run(model, workload(), max_batch_size=1)
    return outputs


def test_one_at_a_time_matches_the_reference_forward(model, one_at_a_time):
    """The paged path (KV cache, flat batches) against plain causal attention, no cache."""
    for request in workload()[:3]:
        tokens = list(request.input_ids)
        for _ in range(request.max_new_tokens):
            tokens.append(int(model.reference_logits(tokens)[-1].argmax()))
        assert generated(request, one_at_a_time[request.request_id]) == tokens[len(request.input_ids):]


def test_greedy_inflight_equals_one_at_a_time(model, one_at_a_time):
    outputs, q = run(model, workload())
    assert outputs == one_at_a_time
    # the requests did share iterations, and left at different ones
    assert max(s["Scheduled Requests"] for s in q.stats) > 4
    assert any(s["Context Requests"] and s["Generation Requests"] for s in q.stats)
    for request in workload():
        assert len(generated(request, outputs[request.request_id])) == request.max_new_tokens


def test_max_utilization_small_pool_pauses_and_gets_the_same_outputs(model, one_at_a_time):
    outputs, q = run(model, workload(), policy=CapacityPolicy.MAX_UTILIZATION, max_tokens=160)
    assert q.stats[0]["Max KV cache blocks"] == 20
    assert sum(s["Paused Requests"] for s in q.stats) > 0
    assert outputs == one_at_a_time


def test_guaranteed_no_evict_never_pauses(model, one_at_a_time):
    outputs, q = run(model, workload(), policy=CapacityPolicy.GUARANTEED_NO_EVICT, max_tokens=160)
    assert all(s["Paused Requests"] == 0 for s in q.stats)
    assert max(s["Active Request Count"] for s in q.stats) > 1
    assert outputs == one_at_a_time


def _admitted_mid_batch(stats) -> bool:
    """Some iteration admitted requests while earlier ones were still running."""
    running = 0
    for s in stats:
        if s["Admitted Requests"] and running:
            return True
        running = s["Active Request Count"]
    return False


def test_static_batch_never_admits_mid_batch(model, one_at_a_time):
    outputs, q = run(model, workload(), policy=CapacityPolicy.STATIC_BATCH, max_batch_size=4)
    assert not _admitted_mid_batch(q.stats)
    assert outputs == one_at_a_time
    # the same workload in flight does admit mid-batch (so the check above can fail)
    _, q = run(model, workload(), policy=CapacityPolicy.GUARANTEED_NO_EVICT, max_batch_size=4)
    assert _admitted_mid_batch(q.stats)


@pytest.mark.parametrize("policy", list(CapacityPolicy))
@pytest.mark.parametrize("reuse", [False, True], ids=["plain", "reuse"])
def test_block_accounting_every_iteration(model, policy, reuse):
    shared = workload(1, seed=3)[0].input_ids * 3  # a prefix to reuse, in the first batch and later
    requests = [GenerationRequest(100, shared + [0], max_new_tokens=5)] + workload(10, seed=3)[1:]
    requests += [GenerationRequest(100 + i, shared + [i], max_new_tokens=5) for i in range(1, 4)]
    _, q = run(model, requests, policy=policy, max_tokens=240, reuse=reuse)
    for s in q.stats:
        assert s["Used KV cache blocks"] + s["Free KV cache blocks"] == s["Max KV cache blocks"]
        assert s["Used KV cache blocks"] <= s["Max KV cache blocks"]
    assert q.stats[-1]["Used KV cache blocks"] == 0
    assert max(s["Used KV cache blocks"] for s in q.stats) > 0
    if reuse:
        assert q.stats[-1]["Reused KV cache blocks"] > 0


def test_chunked_context_and_block_reuse_give_the_same_outputs(model, one_at_a_time):
    requests = workload()
    twin = GenerationRequest(100, requests[4].input_ids, requests[4].max_new_tokens)
    outputs, q = run(model, requests + [twin], max_num_tokens=16, chunked=True, reuse=True)
    assert {i: outputs[i] for i in one_at_a_time} == one_at_a_time
    assert generated(twin, outputs[100]) == generated(requests[4], one_at_a_time[4])
    assert max(s["Total Context Tokens"] + s["Generation Requests"] for s in q.stats) <= 16
    assert any(s["Context Requests"] and s["Total Context Tokens"] < 40 for s in q.stats)


def test_duplicate_ids_are_rejected_until_final(model):
    batches = [[GenerationRequest(7, [1, 2, 3], 30), GenerationRequest(7, [4, 5], 3)]]
    responses: list[tuple[int, bool, str, int]] = []
    done = threading.Event()

    def get(n):
        return batches.pop(0) if batches else []

    def send(rid, tensors, final, error):
        responses.append((rid, final, error, tensors["output_ids"].size if tensors else 0))
        if final and not error:
            if len([r for r in responses if r[1] and not r[2]]) == 1:
                batches.append([GenerationRequest(7, [9, 9], 2)])  # reusable after final
            else:
                done.set()

    manager = BatchManager(model, get_new_requests=get, send_response=send,
                           kv_cache_config=KVCacheConfig(max_tokens=1024))
    assert done.wait(60)
    manager.shutdown()
    rejected = [r for r in responses if r[2]]
    assert len(rejected) == 1 and rejected[0][1] and "already in flight" in rejected[0][2]
    finals = [r for r in responses if r[1] and not r[2]]
    assert [r[3] for r in finals] == [3 + 30, 2 + 2]


def test_stop_signal_ends_a_request_and_frees_its_blocks(model):
    stopped = threading.Event()

    def on_response(rid, tensors, final, error):
        if rid == 1 and not final and not stopped.is_set():
            q.stop(1)
            stopped.set()

    q = RequestQueue(on_response=on_response)
    manager = q.start(model, kv_cache_config=KVCacheConfig(max_tokens=1024))
    q.submit(GenerationRequest(1, [5, 6, 7], 200, streaming=True),
             GenerationRequest(2, [8, 9], 20))
    r1, r2 = q.result(1), q.result(2)
    manager.shutdown()
    assert r1.error == "" and 1 <= len(r1.tokens) < 200
    assert len(r2.tokens) == 2 + 20
    assert q.stats[-1]["Used KV cache blocks"] == 0


def test_shutdown_waits_for_the_requests_in_flight(model):
    q = RequestQueue()
    manager = q.start(model, kv_cache_config=KVCacheConfig(max_tokens=1024))
    q.submit(*workload(4))
    manager.shutdown()
    assert not manager.running
    assert all(r.done and not r.error for r in q.results.values())


def test_rejections_are_final_errors(model):
    requests = [GenerationRequest(1, [], 4), GenerationRequest(2, [VOCAB], 4),
                GenerationRequest(3, [1], 0), GenerationRequest(4, [1] * 250, 10),
                GenerationRequest(5, [1], 4, beam_width=2), GenerationRequest(6, [1, 2], 3)]
    q = RequestQueue()
    manager = q.start(model, kv_cache_config=KVCacheConfig(max_tokens=1024))
    q.submit(*requests)
    results = {r.request_id: r for r in q.wait_all(60)}
    manager.shutdown()
    assert "empty" in results[1].error
    assert "out of the vocabulary" in results[2].error
    assert "at least 1" in results[3].error
    assert "maximum sequence length" in results[4].error
    assert "beam width 2" in results[5].error
    assert results[6].error == "" and len(results[6].tokens) == 5


def test_sampling_is_seeded_per_request(model):
    def req(i, seed, **kw):
        return GenerationRequest(i, [3, 4, 5], 20, sampling=SamplingParams(seed=seed, **kw))

    alone, _ = run(model, [req(1, 11, temperature=0.8, top_k=20)], max_batch_size=1)
    batch, _ = run(model, [req(1, 11, temperature=0.8, top_k=20), req(2, 11, temperature=0.8, top_k=20),
                           req(3, 99, temperature=0.8, top_k=20), req(4, 5, top_p=0.9),
                           req(5, 5, top_k=1)])
    greedy, _ = run(model, [GenerationRequest(5, [3, 4, 5], 20)])
    assert batch[1] == alone[1] == batch[2]
    assert batch[3] != batch[1]
    assert batch[5] == greedy[5]


def test_log_probs_and_logits(model):
    request = GenerationRequest(1, [10, 20, 30, 40], 6, return_log_probs=True,
                                return_context_logits=True, return_generation_logits=True)
    q = RequestQueue()
    manager = q.start(model, kv_cache_config=KVCacheConfig(max_tokens=1024))
    q.submit(request)
    result = q.result(1)
    manager.shutdown()
    (out,) = result.responses
    tokens = out["output_ids"].reshape(-1).tolist()
    reference = model.reference_logits(tokens[:-1]).float().numpy()
    assert out["sequence_length"].tolist() == [[10]]
    np.testing.assert_allclose(out["context_logits"], reference[None, :4], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["generation_logits"], reference[None, None, 3:], rtol=1e-5, atol=1e-5)
    log_softmax = torch.log_softmax(torch.from_numpy(reference[3:]).double(), -1).numpy()
    expected = [log_softmax[i, t] for i, t in enumerate(tokens[4:])]
    np.testing.assert_allclose(out["output_log_probs"].reshape(-1), expected, rtol=1e-5)
    np.testing.assert_allclose(out["cum_log_probs"].reshape(-1), [sum(expected)], rtol=1e-5)


def test_context_logits_cover_the_whole_prompt_when_its_blocks_are_reusable(model):
    prompt = list(range(1, 12))  # more than two blocks of 4 tokens
    q = RequestQueue()
    manager = q.start(model, kv_cache_config=KVCacheConfig(max_tokens=1024, tokens_per_block=4,
                                                           enable_block_reuse=True))
    q.submit(GenerationRequest(1, prompt, 2))
    q.result(1)  # its prompt's blocks are now registered for reuse
    q.submit(GenerationRequest(2, prompt, 2, return_context_logits=True))
    (out,) = q.result(2).responses
    manager.shutdown()
    reference = model.reference_logits(prompt).float().numpy()
    assert out["context_logits"].shape[:2] == (1, len(prompt))
    np.testing.assert_allclose(out["context_logits"], reference[None], rtol=1e-5, atol=1e-5)


def test_logits_post_processor(model):
    seen = []

    def force(request_id, logits, beams, client_id):
        seen.append((request_id, len(beams[0]), client_id))
        out = torch.full_like(logits, -torch.inf)
        out[42] = 0.0
        return out

    outputs, _ = run(model, [GenerationRequest(1, [1, 2], 5, logits_post_processor=force, client_id=9),
                             GenerationRequest(2, [1, 2], 5)])
    assert outputs[1][2:] == [42] * 5
    assert outputs[2][2:] != [42] * 5
    assert seen == [(1, n, 9) for n in range(2, 7)]


def test_end_id_stops_generation(model, one_at_a_time):
    request = workload()[2]  # not streaming
    free_run = generated(request, one_at_a_time[2])
    end = free_run[2]
    stopped = GenerationRequest(2, request.input_ids, request.max_new_tokens, end_id=end)
    outputs, _ = run(model, [stopped])
    assert generated(stopped, outputs[2]) == free_run[:free_run.index(end) + 1]


def decoding(rng: random.Random, lengths: list[int], bs: int, spare: int):
    """Sequences in generation with `lengths` tokens each (the last one not yet cached), their
    blocks drawn out of order with `spare` unused blocks after each; and the pool's size in
    blocks."""
    from host.inflight.request import Phase, Sequence

    seqs, used = [], 0
    for i, length in enumerate(lengths):
        seq = Sequence(GenerationRequest(i, [rng.randrange(VOCAB) for _ in range(length)], 4))
        seq.num_cached, seq.phase = length - 1, Phase.GENERATION
        blocks = -(-length // bs)
        seq.block_table = rng.sample(range(used, used + blocks + spare), blocks)
        used += blocks + spare
        seqs.append(seq)
    return seqs, used


@pytest.mark.parametrize("kv_heads,window", [(2, None), (4, 20), (1, None)])
def test_decode_attention_paths_agree(kv_heads, window, monkeypatch):
    """Decode attention's two ways of forming the products (every query head x every KV head of a
    block, kept on the diagonal, for few query heads; head-major copies for many) give the same
    values, the last block's empty slots and a window masked alike."""
    from host.inflight import attention
    from host.inflight.step import build_step

    bs, heads, dim = 4, 8, 16
    seqs, used = decoding(random.Random(3), [1, 4, 5, 23, 40], bs, 2)
    batch = build_step(seqs, [], bs)
    gen = torch.Generator().manual_seed(0)
    keys = torch.randn(used * bs, kv_heads, dim, generator=gen, dtype=torch.float64)
    values = torch.randn(used * bs, kv_heads, dim, generator=gen, dtype=torch.float64)
    q = torch.randn(len(seqs), heads, dim, generator=gen, dtype=torch.float64)
    diagonal = attention.decode_attention(q, keys, values, batch, window)
    monkeypatch.setattr(attention, "DIAGONAL_MAX_HEADS", 0)
    head_major = attention.decode_attention(q, keys, values, batch, window)
    torch.testing.assert_close(diagonal, head_major)
    # and both are plain softmax attention over each request's own slots
    for i, seq in enumerate(seqs):
        n = seq.num_cached + 1
        slots = torch.tensor([seq.block_table[p // bs] * bs + p % bs for p in range(n)])
        first = 0 if window is None else max(0, n - window)
        k, v = keys[slots[first:]], values[slots[first:]]
        group = heads // kv_heads
        kr, vr = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)  # [n, H, D]
        w = torch.softmax(torch.einsum("hd,nhd->hn", q[i], kr) / dim ** 0.5, -1)
        torch.testing.assert_close(diagonal[i], torch.einsum("hn,nhd->hd", w, vr))


@pytest.mark.parametrize("kv_heads,window,dim", [(2, None, 16), (4, 20, 16), (1, None, 64), (8, 7, 8)])
def test_compiled_decode_attention_matches(kv_heads, window, dim):
    """The compiled float32 decode kernel (host/inflight/_attention.c) gives what the PyTorch path
    gives, for grouped, multi- and single-KV-head layouts, a window, blocks out of order and
    requests from one token to several blocks; it writes the decode rows only."""
    from host.inflight import attention
    from host.inflight.step import build_step

    assert attention._attention is not None, "the kernel is compiled wherever the tests run"
    bs, heads = 4, 8
    seqs, used = decoding(random.Random(5), [1, 3, 4, 5, 23, 61], bs, 3)
    batch = build_step(seqs, [], bs)
    assert batch.decode_lengths.tolist() == [1, 3, 4, 5, 23, 61]
    gen = torch.Generator().manual_seed(1)
    keys = torch.randn(used * bs, kv_heads, dim, generator=gen)
    values = torch.randn(used * bs, kv_heads, dim, generator=gen)
    q = torch.randn(len(seqs), heads, dim, generator=gen)
    assert attention.compiled_applies(q, keys, values)
    expected = attention.decode_attention(q, keys, values, batch, window)
    out = torch.full((len(seqs) + 2, heads, dim), 7.0)  # two rows past the decode tokens
    attention.compiled_decode_attention(q, keys, values, batch, window, out)
    torch.testing.assert_close(out[:len(seqs)], expected, rtol=1e-5, atol=1e-5)
    assert bool((out[len(seqs):] == 7.0).all())
    # not for other dtypes: those take the PyTorch path
    assert not attention.compiled_applies(q.double(), keys.double(), values.double())


def test_compiled_decode_attention_threads():
    """With several intra-op threads and enough work, the kernel splits the requests between
    threads (parts of about equal tokens); the result is the single-threaded one, exactly."""
    from host.inflight import attention
    from host.inflight.step import build_step

    rng = random.Random(9)
    bs, heads, kv_heads, dim = 16, 8, 2, 32
    # 24 requests of 1-700 tokens: well over the kernel's threshold for a second thread
    seqs, used = decoding(rng, [rng.randint(1, 700) for _ in range(24)], bs, 1)
    batch = build_step(seqs, [], bs)
    gen = torch.Generator().manual_seed(2)
    keys = torch.randn(used * bs, kv_heads, dim, generator=gen)
    values = torch.randn(used * bs, kv_heads, dim, generator=gen)
    q = torch.randn(len(seqs), heads, dim, generator=gen)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 3, 7):
            torch.set_num_threads(threads)
            out = torch.empty(len(seqs), heads, dim)
            attention.compiled_decode_attention(q, keys, values, batch, 300, out)
            results.append(out)
    finally:
        torch.set_num_threads(before)
    for out in results[1:]:
        assert torch.equal(out, results[0])
    torch.testing.assert_close(results[0], attention.decode_attention(q, keys, values, batch, 300),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [0, 1, 3, 17, 40])
@pytest.mark.parametrize("bias", [True, False])
def test_dense_layers_compute_f_linear(rows, bias, monkeypatch):
    """A decoder's linear layer with its weight laid out for the CPU's matrix library gives
    F.linear's result (up to summation order) for any row count; float64 weights, pack=False
    and MODELHOST_PACKED_WEIGHTS=0 keep the plain weight."""
    from host.inflight import linear

    gen = torch.Generator().manual_seed(rows)
    w, b = torch.randn(96, 48, generator=gen), torch.randn(96, generator=gen)
    x = torch.randn(rows, 48, generator=gen)
    layer = linear.Dense(w, b if bias else None)
    assert layer.packed, "this PyTorch build has oneDNN and MKL"
    expected = torch.nn.functional.linear(x, w, b if bias else None)
    torch.testing.assert_close(layer(x), expected, rtol=1e-4, atol=1e-4)
    assert not linear.Dense(w.double(), None).packed
    assert not linear.Dense(w, None, pack=False).packed
    monkeypatch.setenv("MODELHOST_PACKED_WEIGHTS", "0")
    linear._available.cache_clear()
    try:
        plain = linear.Dense(w, b if bias else None)
        assert not plain.packed
        torch.testing.assert_close(plain(x), expected)
    finally:
        monkeypatch.delenv("MODELHOST_PACKED_WEIGHTS")
        linear._available.cache_clear()
