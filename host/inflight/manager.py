"""The batch manager: a worker thread that runs the token generation loop (TensorRT-LLM's
GptManager, in Python).

    manager = BatchManager(model, get_new_requests=..., send_response=...,
                           poll_stop_signal=..., return_stats=...,
                           scheduler_config=SchedulerConfig(...), kv_cache_config=KVCacheConfig(...))
    ...
    manager.shutdown()  # the thread ends once no request remains

Callbacks (the seed's, with Python types), all called on the worker thread:
- `get_new_requests(n) -> list[GenerationRequest]` at the start of each iteration; `n` is how many
  it may return, negative meaning any number (`max_queue_size` None). A request whose id is in
  flight, or that can never fit (too long for the model, the token budget or the KV pool, beam
  width above 1), is answered at once through `send_response` with final set and an error.
- `send_response(request_id, tensors, final, error)` at the end of an iteration, for each request
  that has something to say: `tensors` maps output names to numpy arrays (output_ids,
  sequence_length, and when asked: cum_log_probs, output_log_probs, context_logits,
  generation_logits); `error` is "" unless something failed (then `final` is True). When it says
  final, every state of the request is gone (its KV blocks are free) and its id can be used again.
- `poll_stop_signal() -> set[int]` (optional) at the end of each iteration: requests to stop; each
  gets a final response with what it produced so far (no error).
- `return_stats(json_text)` (optional) at the end of each iteration that ran a batch.

Between iterations with nothing to do the thread waits `idle_wait_s` (or until `notify()`), so a
client that queues requests from another thread calls `notify()` to have them picked up at once.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable

import numpy as np
import torch

from host.inflight.kv_cache import KVCache, KVCacheConfig, free_memory_bytes, pool_blocks
from host.inflight.request import GenerationRequest, Phase, Sequence
from host.inflight.sampling import sample
from host.inflight.scheduler import CapacityPolicy, Scheduler, SchedulerConfig
from host.inflight.step import build_step

if TYPE_CHECKING:
    from host.inflight.step import StepBatch

log = logging.getLogger(__name__)

GetNewRequests = Callable[[int], Iterable[GenerationRequest]]
SendResponse = Callable[[int, dict[str, np.ndarray], bool, str], None]
PollStopSignal = Callable[[], Iterable[int]]
ReturnStats = Callable[[str], None]

MAX_BEAM_WIDTH = 1
_ONE = np.ones((1, 1), np.int32)
_ONE.flags.writeable = False


class BatchManager:
    def __init__(self, model: Any, *, get_new_requests: GetNewRequests, send_response: SendResponse,
                 poll_stop_signal: PollStopSignal | None = None, return_stats: ReturnStats | None = None,
                 scheduler_config: SchedulerConfig | None = None,
                 kv_cache_config: KVCacheConfig | None = None, max_queue_size: int | None = None,
                 idle_wait_s: float = 0.005, start: bool = True) -> None:
        self.model = model
        self.config = scheduler_config or SchedulerConfig()
        self.kv_config = kv_cache_config or KVCacheConfig()
        self._get, self._send = get_new_requests, send_response
        self._poll_stop, self._return_stats = poll_stop_signal, return_stats
        self.max_queue_size = max_queue_size
        self.idle_wait_s = idle_wait_s

        element = torch.empty((), dtype=model.dtype).element_size()
        kv_heads = getattr(model, "kv_heads", model.heads)
        bytes_per_token = 2 * model.layers * kv_heads * model.head_dim * element
        blocks = pool_blocks(self.kv_config, bytes_per_token, free_memory_bytes(model.device),
                             self.config.max_batch_size * model.max_seq_len)
        self.cache = KVCache(layers=model.layers, heads=kv_heads, head_dim=model.head_dim,
                             num_blocks=blocks, tokens_per_block=self.kv_config.tokens_per_block,
                             dtype=model.dtype, device=model.device,
                             enable_block_reuse=self.kv_config.enable_block_reuse)
        self.scheduler = Scheduler(self.config, self.cache)

        self.active: list[Sequence] = []
        self.waiting: collections.deque[Sequence] = collections.deque()
        self._by_id: dict[int, Sequence] = {}
        self.iteration = 0
        # Step costs (ns), for the benchmark and the docs: forward pass vs everything else.
        self.forward_ns = 0
        self.host_ns = 0
        self.steps = 0
        # Per iteration, when a benchmark asks for it: (start, forward) in wall-clock ns, the
        # scheduled requests, (start, forward) in CPU ns of the worker thread (on a shared machine
        # the CPU time is what other processes disturb least).
        self.step_log: list[tuple[int, int, int, int, int]] | None = None
        self._shutdown = False
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="inflight-batch-manager", daemon=True)
        self.error: BaseException | None = None
        if start:
            self._thread.start()

    # --- control -------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the worker thread (the constructor does, unless given start=False)."""
        self._thread.start()

    def notify(self) -> None:
        """New requests are waiting in the client's queue: start the next iteration now."""
        self._wake.set()

    def shutdown(self, wait: bool = True, timeout: float | None = None) -> None:
        """Stop once every request (active, waiting, and any the callback still returns) is done."""
        self._shutdown = True
        self._wake.set()
        if wait and self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def __enter__(self) -> BatchManager:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    # --- the loop ------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                if not self.step():
                    if self._shutdown and not self.active and not self.waiting:
                        return
                    self._wake.wait(self.idle_wait_s)
                    self._wake.clear()
        except BaseException as exc:  # a bug: fail what is in flight rather than hang clients
            log.exception("batch manager loop failed")
            self.error = exc
            for seq in list(self.active) + list(self.waiting):
                self._finish(seq, f"batch manager failed: {exc}", with_outputs=False)

    def step(self) -> bool:
        """One iteration; False when there was nothing to run."""
        start, cpu_start = time.perf_counter_ns(), time.thread_time_ns()
        room = -1 if self.max_queue_size is None else max(0, self.max_queue_size - len(self.waiting))
        if room:
            for request in self._get(room) or ():
                self._accept(request)
        if not self.active and not self.waiting:
            return False
        plan = self.scheduler.schedule(self.active, self.waiting, self.iteration)
        if plan.empty:
            self._apply_stops()
            return False
        batch = build_step(plan.decode, plan.context, self.cache.tokens_per_block)
        if self.model.device.type != "cpu":
            batch = batch.to(self.model.device)
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        try:
            logits = self.model.forward(batch, self.cache)
        except Exception as exc:
            log.exception("forward pass failed")
            for seq in plan.decode + [s for s, _ in plan.context]:
                self._finish(seq, f"forward pass failed: {type(exc).__name__}: {exc}",
                             with_outputs=False)
            return True
        t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
        self._advance(plan.decode + [s for s, _ in plan.context],
                      [1] * len(plan.decode) + [n for _, n in plan.context], batch, logits)
        self._apply_stops()
        self.iteration += 1
        end = time.perf_counter_ns()
        self.forward_ns += t1 - t0
        self.host_ns += (end - start) - (t1 - t0)
        self.steps += 1
        if self.step_log is not None:
            self.step_log.append((start, t1 - t0, len(plan.decode) + len(plan.context),
                                  cpu_start, c1 - c0))
        self._report(plan, batch, end - start, t1 - t0)
        return True

    # --- requests in -----------------------------------------------------------------------------
    def _accept(self, request: GenerationRequest) -> None:
        rid = request.request_id
        if rid in self._by_id:
            self._send(rid, {}, True, f"request id {rid} is already in flight")
            return
        problem = self.check(request)
        if problem:
            self._send(rid, {}, True, problem)
            return
        seq = Sequence(request)
        self._by_id[rid] = seq
        self.waiting.append(seq)

    def check(self, r: GenerationRequest) -> str:
        """Why `r` can never run here ('' if it can). Thread-safe: reads settings only."""
        model, cfg = self.model, self.config
        n = len(r.input_ids)
        if r.beam_width != 1:
            return f"beam width {r.beam_width} is not supported (max beam width {MAX_BEAM_WIDTH})"
        if n == 0:
            return "input_ids is empty"
        if r.max_new_tokens < 1:
            return f"the number of tokens to generate must be at least 1, got {r.max_new_tokens}"
        bad = [t for t in r.input_ids if not 0 <= t < model.vocab_size]
        if bad:
            return f"token id {bad[0]} is out of the vocabulary (0..{model.vocab_size - 1})"
        if n + r.max_new_tokens > model.max_seq_len:
            return (f"prompt ({n} tokens) + tokens to generate ({r.max_new_tokens}) exceed the "
                    f"model's maximum sequence length {model.max_seq_len}")
        if self.cache.blocks_for(n + r.max_new_tokens) > self.cache.num_blocks:
            return (f"the request needs up to {self.cache.blocks_for(n + r.max_new_tokens)} KV "
                    f"cache blocks; the pool has {self.cache.num_blocks}")
        if cfg.max_num_tokens is not None and not cfg.enable_chunked_context:
            # without chunks a context runs in one iteration; after a pause (MAX_UTILIZATION)
            # that context is the prompt and every token generated so far
            longest = n + r.max_new_tokens - 1 if cfg.policy is CapacityPolicy.MAX_UTILIZATION else n
            if longest > cfg.max_num_tokens:
                return (f"a context of up to {longest} tokens exceeds max_num_tokens "
                        f"{cfg.max_num_tokens} and chunked context is off")
        return ""

    # --- after the forward pass ------------------------------------------------------------------
    def _advance(self, seqs: list[Sequence], counts: list[int], batch: StepBatch,
                 logits: torch.Tensor) -> None:
        sampling: list[Sequence] = []
        rows: list[int] = []
        for seq, n, (first, count) in zip(seqs, counts, batch.logits_rows):
            start = seq.num_cached
            seq.num_cached += n
            if seq.request.return_context_logits and seq.context_logits is None and count:
                prompt_rows = min(count, seq.prompt_len - start)
                part = logits[first:first + prompt_rows].float().numpy().copy()
                seq.extra.setdefault("ctx", []).append(part)
                if start + prompt_rows >= seq.prompt_len:
                    seq.context_logits = np.concatenate(seq.extra.pop("ctx"))
            if seq.num_cached == len(seq.tokens):
                sampling.append(seq)
                rows.append(first + count - 1)
            self._register_blocks(seq)
        if not sampling:
            return
        chosen = logits[torch.tensor(rows, device=logits.device)] if len(rows) != logits.shape[0] else logits
        tokens, log_probs = sample(sampling, chosen)
        for i, (seq, token, lp) in enumerate(zip(sampling, tokens, log_probs)):
            seq.tokens.append(token)
            seq.phase = Phase.GENERATION
            if lp is not None:
                seq.log_probs.append(lp)
            if seq.request.return_generation_logits:
                seq.generation_logits.append(chosen[i].float().numpy().copy())
            if seq.finished():
                self._finish(seq, "")
            elif seq.request.streaming:
                self._send(seq.request_id, self._outputs(seq), False, "")

    def _register_blocks(self, seq: Sequence) -> None:
        cache = self.cache
        if not cache.enable_block_reuse:
            return
        full = min(seq.num_cached // cache.tokens_per_block, len(seq.block_table))
        done = len(seq.block_hashes)
        if full > done:
            previous = seq.block_hashes[-1] if done else 0
            for b, h in enumerate(cache.block_hashes(seq.tokens, full - done, done, previous), done):
                cache.register(seq.block_table[b], h)
                seq.block_hashes.append(h)

    def _apply_stops(self) -> None:
        if self._poll_stop is None:
            return
        for rid in self._poll_stop() or ():
            seq = self._by_id.get(rid)
            if seq is not None:
                self._finish(seq, "")

    def _finish(self, seq: Sequence, error: str, with_outputs: bool = True) -> None:
        """Free everything of `seq`, then send its final response."""
        if seq.phase is Phase.WAITING:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass
        else:
            try:
                self.active.remove(seq)
            except ValueError:
                pass
        self.scheduler.release(seq)
        self._by_id.pop(seq.request_id, None)
        outputs = self._outputs(seq) if with_outputs and not error else {}
        self._send(seq.request_id, outputs, True, error)

    def _outputs(self, seq: Sequence) -> dict[str, np.ndarray]:
        """The response tensors: the new tokens for streaming, everything otherwise."""
        r = seq.request
        if r.streaming:
            first = seq.sent
            ids = seq.tokens[seq.prompt_len + first:]
            if len(ids) == 1 and not (r.return_log_probs or r.return_generation_logits
                                      or r.return_context_logits):  # the common case, made cheap
                seq.sent = seq.generated
                return {"output_ids": np.full((1, 1, 1), ids[0], np.int32), "sequence_length": _ONE}
        else:
            first = 0
            ids = seq.tokens[seq.prompt_len:] if r.exclude_input_in_output else seq.tokens
        seq.sent = seq.generated
        out: dict[str, np.ndarray] = {
            "output_ids": np.asarray(ids, dtype=np.int32).reshape(1, 1, -1),
            "sequence_length": np.asarray([[len(ids)]], dtype=np.int32),
        }
        if r.return_log_probs:
            out["output_log_probs"] = np.asarray(seq.log_probs[first:], np.float32).reshape(1, 1, -1)
            out["cum_log_probs"] = np.asarray([[sum(seq.log_probs)]], np.float32)
        if r.return_context_logits and seq.context_logits is not None and first == 0:
            out["context_logits"] = seq.context_logits[None]
        if r.return_generation_logits:
            rows = seq.generation_logits[first:]
            vocab = self.model.vocab_size
            out["generation_logits"] = (np.stack(rows) if rows else np.zeros((0, vocab), np.float32)
                                        ).reshape(1, 1, -1, vocab)
        return out

    # --- statistics ------------------------------------------------------------------------------
    def _report(self, plan: Any, batch: StepBatch, iteration_ns: int, forward_ns: int) -> None:
        if self._return_stats is None:
            return
        cache = self.cache
        stats = {
            "Timestamp": time.strftime("%m-%d-%Y %H:%M:%S"),
            "Iteration Counter": self.iteration,
            "Active Request Count": len(self.active),
            "Max Request Count": self.config.max_batch_size,
            "Max KV cache blocks": cache.num_blocks,
            "Free KV cache blocks": cache.num_free,
            "Used KV cache blocks": cache.num_used,
            "Tokens per KV cache block": cache.tokens_per_block,
            "Scheduled Requests": len(plan.decode) + len(plan.context),
            "Context Requests": len(plan.context),
            "Generation Requests": len(plan.decode),
            "Total Context Tokens": sum(n for _, n in plan.context),
            "MicroBatch ID": 0,
            # beyond the seed's list
            "Waiting Requests": len(self.waiting),
            "Admitted Requests": len(plan.admitted),
            "Paused Requests": len(plan.paused),
            "Reused KV cache blocks": cache.reused_blocks,
            "Iteration Time (us)": iteration_ns // 1000,
            "Forward Time (us)": forward_ns // 1000,
        }
        self._return_stats(json.dumps(stats))
