"""Attention over the paged KV cache, shared by every decoder the batch manager runs.

`paged_attention(q, keys, values, batch, window)` computes, for one layer, the attention of every
token of a flat iteration batch (`host.inflight.step.StepBatch`) over its own request's cached
keys and values (the caller has already written this iteration's keys and values into their
slots, so a context chunk sees its own tokens):

- decode tokens (one per request in generation) all at once. For float32 on a CPU, by the
  compiled kernel `host/inflight/_attention.c` (each request's slots read in place; 4-8 times
  faster than the PyTorch operations on this project's machine); otherwise (another dtype, a
  GPU, or a build without the kernel) with PyTorch operations: the requests' blocks are gathered
  into one run, scores computed block by block, and a softmax per request across its blocks
  (scatter max / index_add), so no request is padded to the longest (only the unused tail of each
  request's last block is masked);
- context chunks one by one with scaled_dot_product_attention over the request's cached keys
  (causal; a chunk after the first sees every earlier token of its request).

`window` (the seed's maxAttentionWindow, Mistral's sliding_window): a token attends to itself and
the `window - 1` tokens before it only; None attends to everything before it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch.nn import functional as F

if TYPE_CHECKING:
    from host.inflight.step import StepBatch

try:  # compiled with the package when a C compiler was there (setup.py); optional
    from host.inflight import _attention  # type: ignore[attr-defined]  # compiled: no source for mypy
except ImportError:  # pragma: no cover - a build without a C compiler
    _attention = None


def paged_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, batch: StepBatch,
                    window: int | None = None) -> torch.Tensor:
    """q [T, heads, dim]; keys/values [slots, kv_heads, dim] (one layer) -> [T, heads, dim]."""
    attn = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    nd = batch.num_decode
    if nd and compiled_applies(q, keys, values):
        compiled_decode_attention(q[:nd], keys, values, batch, window, attn)
    elif nd:
        attn[:nd] = decode_attention(q[:nd], keys, values, batch, window)
    for c in batch.contexts:
        qc = q[c.start:c.start + c.length].transpose(0, 1)  # [H, n, D]
        kc = keys.index_select(0, c.kv_slots).transpose(0, 1)
        vc = values.index_select(0, c.kv_slots).transpose(0, 1)
        mask = c.mask
        if window is not None and c.offset + c.length > window:
            q_pos = torch.arange(c.offset, c.offset + c.length, device=q.device)
            k_pos = torch.arange(c.offset + c.length, device=q.device)
            mask = (k_pos[None, :] <= q_pos[:, None]) & (k_pos[None, :] > q_pos[:, None] - window)
        if mask is None:
            o = F.scaled_dot_product_attention(qc, kc, vc, is_causal=True, enable_gqa=True)
        else:
            o = F.scaled_dot_product_attention(qc, kc, vc, attn_mask=mask, enable_gqa=True)
        attn[c.start:c.start + c.length] = o.transpose(0, 1)
    return attn


def compiled_applies(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> bool:
    """Whether the compiled decode kernel can take this layer: float32 tensors on the CPU, the
    cache's layer slices contiguous (they are: [slots, kv_heads, dim] of one pool)."""
    return (_attention is not None and q.device.type == "cpu" and q.dtype == torch.float32
            and keys.dtype == values.dtype == torch.float32 and keys.is_contiguous()
            and values.is_contiguous())


def compiled_decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                              batch: StepBatch, window: int | None, out: torch.Tensor) -> None:
    """The decode tokens' attention by `_attention.decode`, written into out[:num_decode]
    (`out` contiguous [T, heads, dim]); the same result as `decode_attention` up to rounding."""
    n, heads, dim = q.shape
    q = q.contiguous()
    starts, lengths, blocks = batch.decode_starts, batch.decode_lengths, batch.decode_blocks
    # the kernel reads raw memory: what it indexes must be what it expects
    assert starts.is_contiguous() and lengths.is_contiguous() and blocks.is_contiguous()
    assert starts.shape[0] == n + 1 and lengths.shape[0] == n and out.is_contiguous()
    _attention.decode(q.data_ptr(), keys.data_ptr(), values.data_ptr(), out.data_ptr(),
                      blocks.data_ptr(), starts.data_ptr(), lengths.data_ptr(), n, heads,
                      keys.shape[1], dim, batch.tokens_per_block, window or 0,
                      1.0 / math.sqrt(dim), torch.get_num_threads())


# Up to this many query heads, decode attention multiplies every query head by every KV head of
# a block (and keeps the matching pairs) rather than copying the gathered keys and values into a
# head-major layout. The extra products per byte the copies would move grow with the query heads:
# on one CPU core the products cost less up to 16 (12 heads / 4 KV heads: 15% less time, 12 / 12:
# 25% less), about the same at 32 / 4 and more at 32 / 8.
DIAGONAL_MAX_HEADS = 16


def decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, batch: StepBatch,
                     window: int | None = None) -> torch.Tensor:
    """Attention of one query per request over that request's keys, all requests at once.

    The requests' blocks are gathered whole ([B, tokens_per_block, KV heads, D]); slots past a
    request's last token (in its last block only) are masked, and with a window the slots before
    it. Softmax runs per request across its blocks: per-block maxima and sums, combined per
    request with scatter / index_add.

    The products, per block: with few query heads (DIAGONAL_MAX_HEADS), one matrix product of the
    block's query heads [H, D] with its slots of every KV head [tokens_per_block * KVH, D] as
    they lie in the cache, whose pairs of a query head with its own KV head are kept (a diagonal
    view), and for the values the weights placed on that diagonal of a zero matrix: no copy of
    the gathered keys and values (up to that many heads the extra products cost less than the
    copies, and a product with the zeros adds exact zeros). With more heads, the gathered
    blocks are made head-major ([B, KVH, tokens_per_block, D], a copy) and the G query heads of
    each KV head are one small product."""
    n, heads, dim = q.shape
    kvh, bs = keys.shape[1], batch.tokens_per_block
    group = heads // kvh
    seg = batch.decode_block_segment
    blocks = seg.shape[0]
    diagonal = heads <= DIAGONAL_MAX_HEADS
    if diagonal:
        kb = keys.view(-1, bs * kvh, dim).index_select(0, batch.decode_blocks)  # [B, bs*KVH, D]
        vb = values.view(-1, bs * kvh, dim).index_select(0, batch.decode_blocks)
        every = torch.matmul(q.index_select(0, seg), kb.transpose(1, 2))  # [B, H, bs*KVH]
        # [B, KVH, G, bs, KVH'] -> the pairs KVH == KVH' -> [B, G, bs, KVH] -> [B, KVH, G, bs]
        scores = every.view(blocks, kvh, group, bs, kvh).diagonal(dim1=1, dim2=4).permute(0, 3, 1, 2)
        scores = scores * (1.0 / math.sqrt(dim))
    else:
        kb = keys.view(-1, bs, kvh, dim).index_select(0, batch.decode_blocks).transpose(1, 2)
        vb = values.view(-1, bs, kvh, dim).index_select(0, batch.decode_blocks).transpose(1, 2)
        qb = q.view(n, kvh, group, dim).index_select(0, seg)  # [B, KVH, G, D]
        scores = torch.matmul(qb, kb.transpose(-1, -2)) * (1.0 / math.sqrt(dim))  # [B, KVH, G, bs]
    empty = batch.decode_block_empty
    if window is not None:
        # a request's blocks are contiguous in the run: its first block is where its segment starts
        index = torch.arange(blocks, device=q.device) - torch.searchsorted(seg, seg)
        slot_pos = index[:, None] * bs + torch.arange(bs, device=q.device)
        q_pos = batch.positions[:n].index_select(0, seg)
        empty = empty | (slot_pos <= (q_pos - window)[:, None])
    scores.masked_fill_(empty[:, None, None, :], -math.inf)
    peak = torch.full((n, kvh, group), -math.inf, dtype=scores.dtype, device=q.device)
    peak.scatter_reduce_(0, seg[:, None, None].expand(-1, kvh, group), scores.amax(-1), reduce="amax")
    # a block wholly outside the window has -inf scores only: exp(-inf - peak) is 0 there
    weights = torch.exp(scores - peak.index_select(0, seg)[..., None])
    total = torch.zeros((n, kvh, group), dtype=scores.dtype, device=q.device).index_add_(
        0, seg, weights.sum(-1))
    if diagonal:
        placed = torch.zeros((blocks, kvh, group, bs, kvh), dtype=q.dtype, device=q.device)
        placed.diagonal(dim1=1, dim2=4).copy_(weights.permute(0, 2, 3, 1))
        out = torch.matmul(placed.view(blocks, heads, bs * kvh), vb)  # [B, H, D]
        out = torch.zeros((n, heads, dim), dtype=q.dtype, device=q.device).index_add_(0, seg, out)
        return out / total.view(n, heads, 1)
    out = torch.matmul(weights, vb)  # [B, KVH, G, D]
    out = torch.zeros((n, kvh, group, dim), dtype=q.dtype, device=q.device).index_add_(0, seg, out)
    return (out / total[..., None]).view(n, heads, dim)
