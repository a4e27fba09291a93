"""Beam search: a request with beam_width W runs as W sequences that share the prompt's KV blocks.

The request's own sequence computes the prompt. Its first sample forks it: the W most likely
first tokens start W beams, the W-1 new ones (hidden from the client) taking references to the
prompt's full blocks and a copy of its last, partly filled one. Every later iteration all live
beams decode side by side; `BeamGroup.step` scores every continuation of every beam
(cumulative log probability), keeps the 2W best, moves those that end (an end token) to the
finished hypotheses (the first W ranks only, as `transformers` does) and the best W others on as
the new beams. A new beam takes its parent's blocks: the first child of a parent takes them as
they are, the others share the full blocks and copy the partial last one (copy-on-write at the
fork, never later: a full block is never written again).

The request ends at max_new_tokens, or once W hypotheses are finished and no running beam can
beat the worst of them (score = cum_log_prob / length ** length_penalty, the generated length).
The response holds the W best hypotheses, best first: output_ids [1, W, n] padded with pad_id
(end_id, else 0), sequence_length, cum_log_probs, output_log_probs [1, W, n].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from host.inflight.request import Phase, Sequence
from host.inflight.sampling import adjust, needs_row_work

if TYPE_CHECKING:
    from host.inflight.kv_cache import KVCache


@dataclass
class Hypothesis:
    tokens: list[int]  # generated tokens
    log_probs: list[float]
    score: float


@dataclass
class BeamGroup:
    leader: Sequence
    width: int
    beams: list[Sequence] = field(default_factory=list)  # leader first
    cum: list[float] = field(default_factory=list)
    done: list[Hypothesis] = field(default_factory=list)
    finished: bool = False

    @property
    def children(self) -> list[Sequence]:
        return self.beams[1:]

    def score(self, cum: float, length: int) -> float:
        return cum / max(length, 1) ** self.leader.request.length_penalty


def _log_probs(seq: Sequence, row: torch.Tensor) -> torch.Tensor:
    if needs_row_work(seq):
        row = adjust(seq, row)
    return torch.log_softmax(row.double(), -1)


def _ends(seq: Sequence) -> set[int]:
    r = seq.request
    return {t for t in [r.end_id, *r.stop_token_ids] if t is not None}


def _fork(cache: KVCache, seq: Sequence) -> list[int]:
    """A block table with the contents of `seq`'s: full blocks shared, the partial one copied."""
    table = seq.block_table
    full = seq.num_cached // cache.tokens_per_block
    shared = table[:full]
    cache.retain(shared)
    out = list(shared)
    if len(table) > full:
        (block,) = cache.allocate(1)
        cache.copy_block(table[full], block)
        out.append(block)
        if len(table) > full + 1:  # blocks allocated ahead (none today): fresh ones
            out.extend(cache.allocate(len(table) - full - 1))
    return out


def start(cache: KVCache, leader: Sequence, row: torch.Tensor) -> BeamGroup:
    """Fork the leader (prompt computed, `row` its logits) into `width` beams."""
    width = leader.request.beam_width
    lp = _log_probs(leader, row)
    values, ids = torch.topk(lp, width)
    group = BeamGroup(leader, width)
    for i in range(width):
        seq = leader if i == 0 else Sequence(leader.request)
        if i:
            seq.tokens = list(leader.tokens)
            seq.num_cached = leader.num_cached
            seq.block_table = _fork(cache, leader)
            seq.phase = Phase.GENERATION
            seq.admitted_at = leader.admitted_at
        seq.beam = group
        group.beams.append(seq)
        group.cum.append(0.0)
    for i, (tok, v) in enumerate(zip(ids.tolist(), values.tolist())):
        seq = group.beams[i]
        seq.tokens.append(tok)
        seq.log_probs.append(v)
        group.cum[i] = v
    group.leader.phase = Phase.GENERATION
    _close_ended(group, cache)
    return group


def _close_ended(group: BeamGroup, cache: KVCache) -> None:
    """After tokens were appended: the group is done at max length (every beam a hypothesis)."""
    leader = group.leader
    if leader.generated >= leader.request.max_new_tokens:
        for seq, cum in zip(group.beams, group.cum):
            group.done.append(Hypothesis(seq.tokens[seq.prompt_len:], list(seq.log_probs),
                                         group.score(cum, seq.generated)))
        group.finished = True


def step(group: BeamGroup, cache: KVCache, rows: torch.Tensor) -> None:
    """One beam-search step; `rows` [width, vocab] are the beams' logits, in group order."""
    w = group.width
    scores = torch.stack([_log_probs(seq, rows[i]) for i, seq in enumerate(group.beams)])
    vocab = scores.shape[-1]
    total = scores + torch.tensor(group.cum, dtype=scores.dtype, device=scores.device)[:, None]
    values, flat = torch.topk(total.reshape(-1), 2 * w)
    ends = _ends(group.leader)
    chosen: list[tuple[int, int, float]] = []  # (parent beam, token, cumulative log prob)
    for rank, (v, f) in enumerate(zip(values.tolist(), flat.tolist())):
        parent, tok = divmod(f, vocab)
        if tok in ends:
            if rank < w:
                seq = group.beams[parent]
                group.done.append(Hypothesis(seq.tokens[seq.prompt_len:] + [tok],
                                             seq.log_probs + [float(scores[parent, tok])],
                                             group.score(v, seq.generated + 1)))
            continue
        chosen.append((parent, tok, v))
        if len(chosen) == w:
            break
    _reassign(group, cache, chosen, scores)
    _close_ended(group, cache)
    if not group.finished and len(group.done) >= w:
        worst = min(h.score for h in group.done)
        best_running = max(group.score(c, group.leader.generated) for c in group.cum)
        if best_running <= worst:
            group.finished = True


def _reassign(group: BeamGroup, cache: KVCache, chosen: list[tuple[int, int, float]],
              scores: torch.Tensor) -> None:
    old = [(list(s.tokens), list(s.log_probs), list(s.block_table)) for s in group.beams]
    parents = {parent for parent, _, _ in chosen}
    for i in range(len(group.beams)):
        if i not in parents:  # first, so the forks below find the blocks free
            cache.release(old[i][2])
    taken: set[int] = set()
    tables: list[list[int]] = []
    for parent, _, _ in chosen:
        if parent not in taken:  # the first child of a parent takes its blocks as they are
            taken.add(parent)
            tables.append(old[parent][2])
        else:
            tables.append(_fork(cache, group.beams[parent]))
    for seq, (parent, tok, _), table in zip(group.beams, chosen, tables):
        tokens, log_probs, _ = old[parent]
        seq.tokens = tokens + [tok]
        seq.log_probs = log_probs + [float(scores[parent, tok])]
        seq.block_table = table
    group.cum = [v for _, _, v in chosen]


def outputs(group: BeamGroup, pad_id: int, with_prompt: bool) -> dict[str, np.ndarray]:
    """The W best hypotheses (running beams count when the request was stopped early)."""
    hyps = list(group.done)
    if not group.finished or len(hyps) < group.width:
        hyps += [Hypothesis(s.tokens[s.prompt_len:], list(s.log_probs), group.score(c, s.generated))
                 for s, c in zip(group.beams, group.cum)]
    hyps = sorted(hyps, key=lambda h: h.score, reverse=True)[:group.width]
    prompt = group.leader.tokens[:group.leader.prompt_len] if with_prompt else []
    rows = [prompt + h.tokens for h in hyps]
    n = max(len(r) for r in rows)
    ids = np.full((1, len(rows), n), pad_id, np.int32)
    lps = np.zeros((1, len(rows), max(len(h.log_probs) for h in hyps)), np.float32)
    for i, (r, h) in enumerate(zip(rows, hyps)):
        ids[0, i, :len(r)] = r
        lps[0, i, :len(h.log_probs)] = h.log_probs
    return {"output_ids": ids,
            "sequence_length": np.asarray([[len(r) for r in rows]], np.int32),
            "cum_log_probs": np.asarray([[sum(h.log_probs) for h in hyps]], np.float32),
            "output_log_probs": lps}
