"""One iteration's batch, packed flat: the tokens of every scheduled request side by side.

There is no padding: a request in generation contributes one token, a request in context the
tokens of its chunk. The first `num_decode` tokens are the generation requests' (one each); the
context chunks follow. For attention each token needs the cache slots of its own request's
tokens up to itself. Decode tokens read whole blocks: `decode_blocks` lists the blocks of
every decode token's request, `decode_block_segment` which decode token each belongs to, and
`decode_block_empty` which of its slots hold no token yet (only in a request's last
block). Context chunks list their slots (`contexts`).
"""

from __future__ import annotations

import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from host.inflight.request import Sequence


@dataclass
class ContextChunk:
    start: int  # first row of the chunk in the flat batch
    length: int  # its tokens
    offset: int  # tokens of the request already in the cache before this chunk
    kv_slots: torch.Tensor  # slots of the request's tokens 0 .. offset+length-1
    mask: torch.Tensor | None  # [length, offset+length] bool; None: plain causal (offset 0)


@dataclass
class StepBatch:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    slots: torch.Tensor  # [T] int64: where each token's key/value goes
    tokens_per_block: int
    num_decode: int
    decode_blocks: torch.Tensor  # [B] int64 block ids
    decode_block_segment: torch.Tensor  # [B] int64 in 0..num_decode-1
    decode_block_empty: torch.Tensor  # [B, tokens_per_block] bool: slots past the last token
    # the same for the compiled decode kernel: decode token i's blocks are
    # decode_blocks[decode_starts[i]:decode_starts[i + 1]], and it attends over decode_lengths[i]
    decode_starts: torch.Tensor  # [num_decode + 1] int64
    decode_lengths: torch.Tensor  # [num_decode] int64
    contexts: list[ContextChunk]
    logits_index: torch.Tensor  # [R] rows whose logits the step needs
    # per scheduled sequence: (first logits row, number of logits rows) in the model's output
    logits_rows: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    def to(self, device: torch.device) -> StepBatch:
        """The same batch with its tensors on `device` (built on the CPU, run where the model is)."""
        moved = {name: getattr(self, name).to(device, non_blocking=True)
                 for name in ("input_ids", "positions", "slots", "decode_blocks",
                              "decode_block_segment", "decode_block_empty", "decode_starts",
                              "decode_lengths", "logits_index")}
        contexts = [ContextChunk(c.start, c.length, c.offset, c.kv_slots.to(device),
                                 None if c.mask is None else c.mask.to(device)) for c in self.contexts]
        return StepBatch(tokens_per_block=self.tokens_per_block, num_decode=self.num_decode,
                         contexts=contexts, logits_rows=self.logits_rows, **moved)


def _kv_slots(table: list[int], count: int, tokens_per_block: int) -> list[int]:
    """The slots of a sequence's first `count` tokens, in order, from its block table."""
    bs = tokens_per_block
    out: list[int] = []
    for block in table[:-(-count // bs)]:
        out.extend(range(block * bs, block * bs + bs))
    del out[count:]
    return out


_EMPTY_BYTES: dict[int, tuple[bytes, list[bytes]]] = {}


def _empty_bytes(tokens_per_block: int) -> tuple[bytes, list[bytes]]:
    """The rows of `decode_block_empty` as bytes (bool 0/1), made once per block size: a full
    block's (no empty slot), and per fill f (1..tokens_per_block) a last block's holding f tokens."""
    rows = _EMPTY_BYTES.get(tokens_per_block)
    if rows is None:
        bs = tokens_per_block
        rows = _EMPTY_BYTES[bs] = (bytes(bs), [bytes(int(j >= f) for j in range(bs))
                                               for f in range(bs + 1)])
    return rows


_DECODE_ROWS: list[tuple[int, int]] = [(i, 1) for i in range(256)]


def _decode_rows(n: int) -> list[tuple[int, int]]:
    """[(0, 1), (1, 1), ... (n-1, 1)]: the logits rows of n decode tokens (a slice of a list made
    once; a larger one replaces it, whole, so threads of other managers never see it half made)."""
    global _DECODE_ROWS
    rows = _DECODE_ROWS
    if len(rows) < n:
        rows = _DECODE_ROWS = [(i, 1) for i in range(2 * n)]
    return rows[:n]


def build_step(decode: list[Sequence], context: list[tuple[Sequence, int]],
               tokens_per_block: int) -> StepBatch:
    """Pack one iteration: `decode` sequences compute their last token; each `(seq, n)` of
    `context` computes its next `n` uncached tokens. Block tables must already cover them."""
    ids: list[int] = []
    pos: list[int] = []
    writes: list[int] = []
    dec_blocks: list[int] = []
    dec_segment: list[int] = []
    dec_starts: list[int] = [0]
    dec_lengths: list[int] = []
    logits_index: list[int] = []
    logits_rows: list[tuple[int, int]] = []
    bs = tokens_per_block
    # the empty-slot mask is made as bytes here (a full block's row, then the last block's),
    # not by tensor operations: each torch or numpy call costs tens of microseconds right after
    # a forward pass (its code and data are out of the CPU's caches by then)
    full_row, last_rows = _empty_bytes(bs)
    empty = bytearray()
    # the hot loop of the host path: bound methods, one divmod per request
    add_id, add_pos, add_write = ids.append, pos.append, writes.append
    add_blocks, add_segment = dec_blocks.extend, dec_segment.extend
    add_start, add_length = dec_starts.append, dec_lengths.append
    first_block = 0
    for i, seq in enumerate(decode):
        n = seq.num_cached
        table = seq.block_table
        full, offset = divmod(n, bs)  # the new token is slot `offset` of block `full`
        add_id(seq.tokens[n])
        add_pos(n)
        add_write(table[full] * bs + offset)
        add_blocks(table[:full + 1])
        add_segment([i] * (full + 1))
        first_block += full + 1
        add_start(first_block)
        add_length(n + 1)
        empty += full_row * full
        empty += last_rows[offset + 1]
    logits_index.extend(range(len(decode)))
    logits_rows.extend(_decode_rows(len(decode)))
    # contexts: their new tokens' slots follow the decode tokens' (one `slots` section), and the
    # slots of each context's tokens so far (its keys for attention) are sections of the same
    # buffer, so the whole batch is one tensor split in views
    chunks = []
    kv_parts: list[int] = []
    kv_sizes: list[int] = []
    row = len(decode)
    for seq, n in context:
        start = seq.num_cached
        ids.extend(seq.tokens[start:start + n])
        pos.extend(range(start, start + n))
        kv = _kv_slots(seq.block_table, start + n, bs)
        writes.extend(kv[start:])
        kv_parts.extend(kv)
        kv_sizes.append(start + n)
        mask = None
        if start:
            q_pos = torch.arange(start, start + n)
            mask = torch.arange(start + n)[None, :] <= q_pos[:, None]
        chunks.append((row, n, start, mask))
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
    # one tensor for every integer list (a tensor per list costs more than the packing)
    sizes = [len(ids), len(pos), len(writes), len(dec_blocks), len(dec_segment), len(dec_starts),
             len(dec_lengths), len(logits_index), *kv_sizes]
    flat = torch.frombuffer(  # through array.array: twice as fast as torch.tensor(list)
        array.array("q", ids + pos + writes + dec_blocks + dec_segment + dec_starts + dec_lengths
                    + logits_index + kv_parts),
        dtype=torch.int64)
    (input_ids, positions, slots, blocks, segment, starts, lengths, logits_at,
     *kv_slots) = flat.split_with_sizes(sizes)
    contexts = [ContextChunk(at, n, start, kv, mask)
                for (at, n, start, mask), kv in zip(chunks, kv_slots)]
    return StepBatch(
        input_ids=input_ids,
        positions=positions,
        slots=slots,
        tokens_per_block=tokens_per_block,
        num_decode=len(decode),
        decode_blocks=blocks,
        decode_block_segment=segment,
        decode_block_empty=(torch.frombuffer(empty, dtype=torch.bool).view(-1, bs) if empty
                            else torch.zeros((0, bs), dtype=torch.bool)),
        decode_starts=starts,
        decode_lengths=lengths,
        contexts=contexts,
        logits_index=logits_at,
        logits_rows=logits_rows,
    )
