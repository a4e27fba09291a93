"""One iteration's batch, packed flat: the tokens of every scheduled request side by side.

There is no padding: a request in generation contributes one token, a request in context the
tokens of its chunk. The first `num_decode` tokens are the generation requests' (one each); the
context chunks follow. For attention each token needs the cache slots of its own request's
tokens up to itself: `decode_kv_slots` / `decode_segment` list them for all decode tokens at
once (segment i is decode token i's request), `contexts` per context chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from host.inflight.request import Sequence


@dataclass
class ContextChunk:
    start: int  # first row of the chunk in the flat batch
    length: int  # its tokens
    offset: int  # tokens of the request already in the cache before this chunk
    kv_slots: "torch.Tensor"  # slots of the request's tokens 0 .. offset+length-1
    mask: "torch.Tensor | None"  # [length, offset+length] bool; None: plain causal (offset 0)


@dataclass
class StepBatch:
    input_ids: "torch.Tensor"  # [T] int64
    positions: "torch.Tensor"  # [T] int64
    slots: "torch.Tensor"  # [T] int64: where each token's key/value goes
    num_decode: int
    decode_kv_slots: "torch.Tensor"  # [S] int64
    decode_segment: "torch.Tensor"  # [S] int64 in 0..num_decode-1
    contexts: list[ContextChunk]
    logits_index: "torch.Tensor"  # [R] rows whose logits the step needs
    # per scheduled sequence: (first logits row, number of logits rows) in the model's output
    logits_rows: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


def _slot_table(seq: Sequence, tokens_per_block: int) -> "torch.Tensor":
    """All slots of the sequence's blocks in order; cached until its block table changes."""
    import torch

    cached = seq.extra.get("slots")
    if cached is None or seq.extra.get("slots_blocks") != len(seq.block_table):
        blocks = torch.tensor(seq.block_table, dtype=torch.int64)
        cached = (blocks[:, None] * tokens_per_block
                  + torch.arange(tokens_per_block, dtype=torch.int64)).reshape(-1)
        seq.extra["slots"], seq.extra["slots_blocks"] = cached, len(seq.block_table)
    return cached


def build_step(decode: list[Sequence], context: list[tuple[Sequence, int]],
               tokens_per_block: int) -> StepBatch:
    """Pack one iteration: `decode` sequences compute their last token; each `(seq, n)` of
    `context` computes its next `n` uncached tokens. Block tables must already cover them."""
    import torch

    ids: list[int] = []
    pos: list[int] = []
    slot_parts = []
    dec_write: list[int] = []
    dec_slots, dec_lengths = [], []
    logits_index: list[int] = []
    logits_rows: list[tuple[int, int]] = []
    for i, seq in enumerate(decode):
        n = seq.num_cached
        ids.append(seq.tokens[n])
        pos.append(n)
        dec_write.append(seq.block_table[n // tokens_per_block] * tokens_per_block
                         + n % tokens_per_block)
        table = _slot_table(seq, tokens_per_block)
        dec_slots.append(table[:n + 1])
        dec_lengths.append(n + 1)
        logits_rows.append((len(logits_index), 1))
        logits_index.append(i)
    if decode:
        slot_parts.append(torch.tensor(dec_write, dtype=torch.int64))
    contexts = []
    row = len(decode)
    for seq, n in context:
        start = seq.num_cached
        ids.extend(seq.tokens[start:start + n])
        pos.extend(range(start, start + n))
        table = _slot_table(seq, tokens_per_block)
        kv = table[:start + n]
        slot_parts.append(kv[start:])
        mask = None
        if start:
            q_pos = torch.arange(start, start + n)
            mask = torch.arange(start + n)[None, :] <= q_pos[:, None]
        contexts.append(ContextChunk(row, n, start, kv, mask))
        done = start + n == len(seq.tokens)
        if seq.request.return_context_logits and start < seq.prompt_len:
            first = len(logits_index)  # every prompt row of the chunk (and the last, to sample)
            logits_index.extend(range(row, row + n))
            logits_rows.append((first, n))
        elif done:
            logits_rows.append((len(logits_index), 1))
            logits_index.append(row + n - 1)
        else:
            logits_rows.append((len(logits_index), 0))
        row += n
    if dec_slots:
        decode_kv_slots = torch.cat(dec_slots)
        decode_segment = torch.repeat_interleave(
            torch.arange(len(decode)), torch.tensor(dec_lengths))
    else:
        decode_kv_slots = decode_segment = torch.empty(0, dtype=torch.int64)
    return StepBatch(
        input_ids=torch.tensor(ids, dtype=torch.int64),
        positions=torch.tensor(pos, dtype=torch.int64),
        slots=torch.cat(slot_parts) if slot_parts else torch.empty(0, dtype=torch.int64),
        num_decode=len(decode),
        decode_kv_slots=decode_kv_slots,
        decode_segment=decode_segment,
        contexts=contexts,
        logits_index=torch.tensor(logits_index, dtype=torch.int64),
        logits_rows=logits_rows,
    )
