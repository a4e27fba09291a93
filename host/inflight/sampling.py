"""Choosing each request's next token from its logits row.

The greedy rows of a step are decided by one argmax over all of them; only requests that sample
(temperature / top-k / top-p), have penalties, bad words, min_tokens or a logits post-processor
cost per-request work. Each sampling request draws from its own generator, seeded by its `seed`,
so its tokens are the same whatever else shares the batch (and after a pause and recomputation,
since the generator keeps its state).

Per row, in this order: the logits post-processor, penalties, min_tokens and bad words (masks),
then temperature, top-k, top-p and the draw. Log probabilities are those of the distribution the
token was drawn from before truncation: log_softmax(logits / temperature) (temperature 1 for
greedy), after the post-processor and the penalties.

A row that fails (a post-processor that raises, a distribution with nothing left to choose)
fails its own request only: `sample` reports it and the manager ends that request with the error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from host.inflight.request import Sequence


@dataclass
class Choice:
    tokens: list[int]
    log_probs: list[float | None]
    top: list[tuple[list[int], list[float]] | None]
    errors: dict[int, str] = field(default_factory=dict)  # row -> why its request fails


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


def _scaled(row: torch.Tensor, temperature: float) -> torch.Tensor:
    """row / temperature in float64, shifted by its maximum first so a small temperature cannot
    overflow (masked -inf entries stay -inf)."""
    row = row.double()
    return (row - row.max()) / temperature


def _draw(seq: Sequence, row: torch.Tensor) -> int:
    s = seq.request.sampling
    if seq.generator is None:
        seq.generator = torch.Generator().manual_seed(s.seed)
    probs = torch.softmax(_truncate(_scaled(row.cpu(), s.temperature), s.top_k, s.top_p), -1)
    if not bool(torch.isfinite(probs).all()) or float(probs.sum()) <= 0:
        raise ValueError("no token left to sample from (every logit is -inf after the masks)")
    return int(torch.multinomial(probs, 1, generator=seq.generator))


_NUMPY_ARGMAX = (torch.float32, torch.float64)


def _argmax(rows: torch.Tensor) -> list[int]:
    if rows.is_cpu and rows.dtype in _NUMPY_ARGMAX:  # (is_cpu: no device object made)
        return rows.numpy().argmax(-1).tolist()  # numpy's is several times faster on the CPU
    return rows.argmax(-1).tolist()


def needs_row_work(seq: Sequence) -> bool:
    r = seq.request
    return (r.logits_post_processor is not None or r.sampling.penalized or bool(r.bad_words)
            or (r.sampling.min_tokens > 0 and seq.generated < r.sampling.min_tokens))


def adjust(seq: Sequence, row: torch.Tensor) -> torch.Tensor:
    """The post-processor, penalties and masks applied to one row (a float32 copy may be made)."""
    r, s = seq.request, seq.request.sampling
    if r.logits_post_processor is not None:
        out = r.logits_post_processor(seq.request_id, row, [seq.tokens[:]], r.client_id)
        if not isinstance(out, torch.Tensor) or out.shape != row.shape:
            raise ValueError(f"the logits post-processor returned {type(out).__name__} "
                             f"{getattr(out, 'shape', '')}, not a tensor of shape {tuple(row.shape)}")
        row = out
    row = row.float().clone() if row.dtype != torch.float64 else row.clone()
    if s.penalized:
        if s.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(seq.tokens)), dtype=torch.int64, device=row.device)
            values = row.index_select(0, seen)
            row.index_copy_(0, seen, torch.where(values > 0, values / s.repetition_penalty,
                                                 values * s.repetition_penalty))
        if seq.generated and (s.frequency_penalty or s.presence_penalty):
            out_tokens = torch.tensor(seq.tokens[seq.prompt_len:], dtype=torch.int64, device=row.device)
            counts = torch.bincount(out_tokens, minlength=row.shape[0]).to(row.dtype)
            row -= s.frequency_penalty * counts + s.presence_penalty * (counts > 0).to(row.dtype)
    if s.min_tokens and seq.generated < s.min_tokens:
        ends = [t for t in [r.end_id, *r.stop_token_ids] if t is not None]
        if ends:
            row[torch.tensor(ends, dtype=torch.int64, device=row.device)] = -torch.inf
    for words in r.bad_words:
        if len(words) == 1 or (len(words) - 1 <= len(seq.tokens)
                               and seq.tokens[len(seq.tokens) - len(words) + 1:] == words[:-1]):
            row[words[-1]] = -torch.inf
    return row


def sample(seqs: list[Sequence], logits: torch.Tensor) -> Choice:
    """Next token of each sequence from its row of `logits` [len(seqs), vocab]."""
    if all(seq.plain for seq in seqs):  # every row greedy as it is: one argmax
        none: list = [None] * len(seqs)
        return Choice(_argmax(logits), none, none)
    rows = logits
    errors: dict[int, str] = {}
    for i, seq in enumerate(seqs):
        if needs_row_work(seq):
            try:
                row = adjust(seq, rows[i])
            except Exception as exc:  # noqa: BLE001 - the request's own hook or values
                errors[i] = f"{type(exc).__name__}: {exc}"
                continue
            if rows is logits:
                rows = logits.float() if logits.dtype not in (torch.float32, torch.float64) else logits.clone()
            rows[i] = row
    tokens = _argmax(rows)  # the greedy answer for every row, in one call
    log_probs: list[float | None] = [None] * len(seqs)
    top: list[tuple[list[int], list[float]] | None] = [None] * len(seqs)
    for i, seq in enumerate(seqs):
        if i in errors:
            continue
        r = seq.request
        s = r.sampling
        try:
            if not s.greedy:
                tokens[i] = _draw(seq, rows[i])
            if r.return_log_probs or r.top_log_probs:
                scaled = rows[i].double() if s.greedy else _scaled(rows[i], s.temperature)
                lp = torch.log_softmax(scaled, -1)
                log_probs[i] = float(lp[tokens[i]])
                if r.top_log_probs:
                    values, ids = torch.topk(lp, min(r.top_log_probs, lp.shape[0]))
                    top[i] = (ids.tolist(), values.tolist())
        except Exception as exc:  # noqa: BLE001 - this row's distribution, not the batch's
            errors[i] = f"{type(exc).__name__}: {exc}"
    return Choice(tokens, log_probs, top, errors)
