"""Choosing each request's next token from its logits row.

The greedy rows of a step are decided by one argmax over all of them; only requests that sample
(temperature / top-k / top-p) or have a logits post-processor cost per-request work. Each sampling
request draws from its own generator, seeded by its `seed`, so its tokens are the same whatever
else shares the batch (and after a pause and recomputation, since the generator keeps its state).

Log probabilities are those of the distribution the token was drawn from before truncation:
log_softmax(logits / temperature) (temperature 1 for greedy), after the post-processor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from host.inflight.request import Sequence


def _truncate(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, -torch.inf)
    if 0.0 < top_p < 1.0:
        ordered, index = torch.sort(logits, descending=True)
        probs = torch.softmax(ordered, -1)
        # keep a token while the probability of the tokens before it is below top_p
        drop = (torch.cumsum(probs, -1) - probs) >= top_p
        ordered = ordered.masked_fill(drop, -torch.inf)
        logits = torch.empty_like(logits).scatter_(0, index, ordered)
    return logits


def _draw(seq: Sequence, row: torch.Tensor) -> int:
    s = seq.request.sampling
    if seq.generator is None:
        seq.generator = torch.Generator().manual_seed(s.seed)
    probs = torch.softmax(_truncate(row.cpu() / s.temperature, s.top_k, s.top_p).double(), -1)
    return int(torch.multinomial(probs, 1, generator=seq.generator))


def _argmax(rows: torch.Tensor) -> list[int]:
    if rows.device.type == "cpu" and rows.dtype in (torch.float32, torch.float64):
        return rows.numpy().argmax(-1).tolist()  # numpy's is several times faster on the CPU
    return rows.argmax(-1).tolist()


def sample(seqs: list[Sequence], logits: torch.Tensor) -> tuple[list[int], list[float | None]]:
    """Next token of each sequence from its row of `logits` [len(seqs), vocab]."""
    rows = logits
    for i, seq in enumerate(seqs):
        hook = seq.request.logits_post_processor
        if hook is not None:
            if rows is logits:
                rows = logits.clone()
            beams = [seq.tokens[:]]
            rows[i] = hook(seq.request_id, rows[i], beams, seq.request.client_id)
    tokens = _argmax(rows)  # the greedy answer for every row, in one call
    log_probs: list[float | None] = [None] * len(seqs)
    for i, seq in enumerate(seqs):
        s = seq.request.sampling
        if not s.greedy:
            tokens[i] = _draw(seq, rows[i])
        if seq.request.return_log_probs:
            scaled = rows[i] if s.greedy else rows[i] / s.temperature
            log_probs[i] = float(torch.log_softmax(scaled.double(), -1)[tokens[i]])
    return tokens, log_probs
