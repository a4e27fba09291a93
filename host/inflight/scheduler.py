"""Which requests run in the next iteration, and with how many tokens each.

Each iteration, in this order:
1. every running request gets its work: one token for a request in generation, the rest of its
   prompt (or, with chunked context, as much of it as the token budget leaves) for one in context;
2. the KV blocks for that work are allocated. Under MAX_UTILIZATION, when they do not fit, the
   most recently admitted requests are paused (blocks given back, sent to the head of the waiting
   queue; they resume later by recomputing their keys and values from prompt + tokens so far,
   which the client does not see);
3. waiting requests are admitted, oldest first (paused ones are the oldest), while the batch has
   room (`max_batch_size`), the token budget (`max_num_tokens`) allows, and the capacity policy
   agrees:
   - MAX_UTILIZATION: the blocks of its first chunk are free now;
   - GUARANTEED_NO_EVICT: the worst case (prompt + max new tokens) of every running request plus
     its own fits in the pool, so no request ever has to be paused;
   - STATIC_BATCH: as GUARANTEED_NO_EVICT, but only when no request is running: a batch runs to
     its end before the next one starts.
   Admission stops at the first request that does not fit (no overtaking).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from host.inflight.request import Phase

if TYPE_CHECKING:
    import collections

    from host.inflight.kv_cache import KVCache
    from host.inflight.request import Sequence


class BatchingScheme(enum.Enum):
    """The seed's modelType. V1: a batch runs in lockstep to its end before the next one is
    admitted (STATIC_BATCH admission whatever the policy; the statistics add Total Generation
    Tokens and Empty Generation Slots). InflightBatching: requests join and leave every iteration.
    InflightFusedBatching: the same here (its extra operation fusion is TensorRT's; this decoder
    has nothing more to fuse)."""

    V1 = "V1"
    INFLIGHT = "InflightBatching"
    INFLIGHT_FUSED = "InflightFusedBatching"


class CapacityPolicy(enum.Enum):
    MAX_UTILIZATION = "MAX_UTILIZATION"
    GUARANTEED_NO_EVICT = "GUARANTEED_NO_EVICT"
    STATIC_BATCH = "STATIC_BATCH"


@dataclass
class SchedulerConfig:
    policy: CapacityPolicy = CapacityPolicy.GUARANTEED_NO_EVICT
    max_batch_size: int = 8  # requests running at once
    max_num_tokens: int | None = None  # tokens per iteration (None: no limit)
    enable_chunked_context: bool = False
    batching: BatchingScheme = BatchingScheme.INFLIGHT_FUSED

    def __post_init__(self) -> None:
        self.policy = CapacityPolicy(self.policy)
        self.batching = BatchingScheme(self.batching)
        if self.max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        if self.max_num_tokens is not None and self.max_num_tokens < self.max_batch_size:
            raise ValueError("max_num_tokens must be at least max_batch_size "
                             "(every request in generation needs one token per iteration)")


@dataclass
class Plan:
    """One iteration's work: `(sequence, tokens to compute)` in the order of the flat batch."""

    decode: list[Sequence] = field(default_factory=list)
    context: list[tuple[Sequence, int]] = field(default_factory=list)
    admitted: list[Sequence] = field(default_factory=list)
    paused: list[Sequence] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.decode and not self.context


class Scheduler:
    def __init__(self, config: SchedulerConfig, cache: KVCache) -> None:
        self.config = config
        self.cache = cache

    def worst_case_blocks(self, seq: Sequence) -> int:
        return self.cache.blocks_for(seq.max_total) * seq.request.beam_width

    def schedule(self, active: list[Sequence], waiting: collections.deque[Sequence],
                 iteration: int) -> Plan:
        cfg, cache = self.config, self.cache
        budget = cfg.max_num_tokens if cfg.max_num_tokens is not None else 1 << 62
        batch_was_running = bool(active)
        work: list[tuple[Sequence, int]] = []
        # generation first (one token each: the beams of a request always step together), then
        # the contexts in admission order with what the budget leaves
        generation = Phase.GENERATION
        decode: list[Sequence] = []  # the sequences of the generation work, in its order
        contexts = []
        bs = cache.tokens_per_block
        need = 0  # new blocks for the work (inlined: this loop runs for every request, every step)
        for seq in active:
            if seq.phase is not generation:
                contexts.append(seq)
                continue
            n = len(seq.tokens) - seq.num_cached
            if n > budget:
                n = self._chunk(seq, budget)
            if n:
                work.append((seq, n))
                decode.append(seq)
                budget -= n
                need += max(0, -(-(seq.num_cached + n) // bs) - len(seq.block_table))
        for seq in contexts:
            n = self._chunk(seq, budget)
            if n:
                work.append((seq, n))
                budget -= n
                need += self._new_blocks(seq, n)
        plan = Plan()
        while need > cache.num_free:
            if cfg.policy is not CapacityPolicy.MAX_UTILIZATION:
                raise RuntimeError(f"KV cache exhausted under {cfg.policy.value}: "
                                   f"{need} blocks needed, {cache.num_free} free")
            victim = next((s for s in reversed(active) if s.beam is None
                           and s.request.beam_width == 1), None)  # the newest; beams never pause
            if victim is None:
                raise RuntimeError(f"KV cache exhausted by beam search: {need} blocks needed, "
                                   f"{cache.num_free} free")
            active.remove(victim)
            for i, (seq, n) in enumerate(work):
                if seq is victim:
                    need -= self._new_blocks(seq, n)
                    budget += n
                    del work[i]
                    break
            self.pause(victim)
            waiting.appendleft(victim)
            plan.paused.append(victim)
            need = sum(self._new_blocks(seq, n) for seq, n in work)
        if need:
            for seq, n in work:
                self._grow(seq, n)
        if cache.enable_block_reuse:
            for seq, n in work:
                self.register_blocks(seq, seq.num_cached + n)

        static = cfg.policy is CapacityPolicy.STATIC_BATCH or cfg.batching is BatchingScheme.V1
        guaranteed = cfg.policy is not CapacityPolicy.MAX_UTILIZATION or cfg.batching is BatchingScheme.V1
        admit = (not plan.paused and not (static and batch_was_running) and bool(waiting)
                 and len(active) < cfg.max_batch_size and budget > 0)
        reserved = beam_reserved = 0
        if admit:  # (summed only when someone can be admitted: most iterations admit nobody)
            reserved = sum(s.reserved_blocks for s in active)
            beam_reserved = sum(s.reserved_blocks for s in active if s.request.beam_width > 1)
        while admit and waiting and len(active) < cfg.max_batch_size and budget > 0:
            seq = waiting[0]
            worst = self.worst_case_blocks(seq)
            width = seq.request.beam_width
            if len(active) + width > cfg.max_batch_size:
                break
            if guaranteed and reserved + worst > cache.num_blocks:
                break
            if width > 1 and beam_reserved + worst > cache.num_blocks:
                break  # beams never pause: their worst cases must fit together
            beam_reserved += worst if width > 1 else 0
            # A request that returns its context logits computes its whole prompt: reused
            # blocks hold keys and values but no logits, so its tensor would lack their rows.
            blocks, hashes = (([], []) if seq.request.return_context_logits
                              else cache.match_prefix(seq.tokens))
            seq.block_table, seq.block_hashes = blocks, hashes
            seq.num_cached = len(blocks) * cache.tokens_per_block
            n = self._chunk(seq, budget)
            if n == 0 or self._new_blocks(seq, n) > cache.num_free:
                cache.release(blocks)
                seq.block_table, seq.block_hashes, seq.num_cached = [], [], 0
                break
            waiting.popleft()
            self._grow(seq, n)
            self.register_blocks(seq, seq.num_cached + n)
            seq.phase = Phase.CONTEXT
            seq.admitted_at = iteration
            seq.reserved_blocks = worst
            reserved += worst
            active.append(seq)
            plan.admitted.append(seq)
            work.append((seq, n))
            budget -= n

        if plan.paused:  # (a paused sequence is WAITING now, and out of the work)
            decode = [seq for seq in decode if seq.phase is generation]
        # the work is the generation requests' first, then the contexts and the admitted
        plan.decode, plan.context = decode, work[len(decode):]
        return plan

    def _chunk(self, seq: Sequence, budget: int) -> int:
        """Tokens `seq` computes this iteration within `budget` (0: it waits)."""
        n = seq.to_compute
        if n <= budget:
            return n
        return budget if self.config.enable_chunked_context else 0

    def _new_blocks(self, seq: Sequence, n: int) -> int:
        return max(0, self.cache.blocks_for(seq.num_cached + n) - len(seq.block_table))

    def _grow(self, seq: Sequence, n: int) -> None:
        extra = self._new_blocks(seq, n)
        if extra:
            seq.block_table.extend(self.cache.allocate(extra))

    def register_blocks(self, seq: Sequence, known: int) -> None:
        """Register the blocks of `seq` that are full once its first `known` tokens are cached
        (this iteration's forward pass writes them before anything reads them)."""
        cache = self.cache
        if not cache.enable_block_reuse or seq.beam is not None:
            return
        n = cache.tokens_per_block
        full = min(known // n, len(seq.block_table))
        done = len(seq.block_hashes)
        if full > done:
            previous = seq.block_hashes[-1] if done else 0
            for b, h in enumerate(cache.block_hashes(seq.tokens, full - done, done, previous), done):
                cache.register(seq.block_table[b], h, seq.tokens[b * n:(b + 1) * n],
                               seq.block_table[b - 1] if b else None)
                seq.block_hashes.append(h)

    def pause(self, seq: Sequence) -> None:
        """Give back the blocks of `seq`; it recomputes everything when it is admitted again."""
        self.release(seq)
        seq.phase = Phase.WAITING
        seq.paused_times += 1

    def release(self, seq: Sequence) -> None:
        self.cache.release(seq.block_table)
        seq.block_table, seq.block_hashes, seq.num_cached = [], [], 0
        seq.reserved_blocks = 0
