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
  flight, or that can never run (a generation parameter out of range, too long for the model, the
  token budget or the KV pool, a beam width above `max_beam_width`), is answered at once through
  `send_response` with final set and an error.
- `send_response(request_id, tensors, final, error)` at the end of an iteration, for each request
  that has something to say: `tensors` maps output names to numpy arrays (output_ids,
  sequence_length, and when asked: cum_log_probs, output_log_probs, context_logits,
  generation_logits; a streamed one-token response's arrays are read-only, shared between
  responses); `error` is "" unless something failed (then `final` is True). When it says
  final, every state of the request is gone (its KV blocks are free) and its id can be used again.
- `poll_stop_signal() -> set[int]` (optional) at the end of each iteration: requests to stop; each
  gets a final response with what it produced so far (no error).
- `return_stats(json_text)` (optional) at the end of each iteration that ran a batch.

Between iterations with nothing to do the thread waits `idle_wait_s` (or until `notify()`), so a
client that queues requests from another thread calls `notify()` to have them picked up at once.

Failures stay as small as they can: a request whose own sampling fails (its logits post-processor
raises, its distribution is empty) ends alone with the error; a forward pass that fails ends the
requests of that batch. Anything else is a bug: the loop fails every request in flight, records
`error`, calls `on_failure(exc)` and ends; `check` then refuses every request, so a client never
waits on a thread that is gone.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable

import numpy as np
import orjson
import torch

from host.inflight import beam as beams
from host.inflight.kv_cache import KVCache, KVCacheConfig, free_memory_bytes, pool_blocks
from host.inflight.metrics import ServingMetrics
from host.inflight.request import GenerationRequest, Phase, Sequence
from host.inflight.sampling import sample
from host.inflight.scheduler import BatchingScheme, CapacityPolicy, Scheduler, SchedulerConfig
from host.inflight.step import build_step

if TYPE_CHECKING:
    from host.inflight.step import StepBatch

log = logging.getLogger(__name__)

GetNewRequests = Callable[[int], Iterable[GenerationRequest]]
SendResponse = Callable[[int, dict[str, np.ndarray], bool, str], None]
PollStopSignal = Callable[[], Iterable[int]]
ReturnStats = Callable[[str], None]

OnFailure = Callable[[BaseException], None]
_ONE = np.ones((1, 1), np.int32)
_ONE.flags.writeable = False
# output_ids of a streamed response holding one token, one read-only array per token id (as
# _ONE): a dictionary look-up instead of building an array per token; bounded, the rest are built
_TOKEN: dict[int, np.ndarray] = {}
_TOKEN_CACHE_LIMIT = 1 << 15


def _one_token(token: int) -> np.ndarray:
    """output_ids [1, 1, 1] holding `token`, read-only (shared by every response that sends it)."""
    ids = _TOKEN.get(token)
    if ids is None:
        ids = np.full((1, 1, 1), token, np.int32)
        ids.flags.writeable = False
        if len(_TOKEN) < _TOKEN_CACHE_LIMIT:
            _TOKEN[token] = ids
    return ids


class BatchManager:
    def __init__(self, model: Any, *, get_new_requests: GetNewRequests, send_response: SendResponse,
                 poll_stop_signal: PollStopSignal | None = None, return_stats: ReturnStats | None = None,
                 scheduler_config: SchedulerConfig | None = None,
                 kv_cache_config: KVCacheConfig | None = None, max_queue_size: int | None = None,
                 idle_wait_s: float = 0.005, start: bool = True, max_beam_width: int = 1,
                 max_attention_window: int | None = None, on_failure: OnFailure | None = None) -> None:
        self.model = model
        self.config = scheduler_config or SchedulerConfig()
        self.kv_config = kv_cache_config or KVCacheConfig()
        self._get, self._send = get_new_requests, send_response
        self._poll_stop, self._return_stats = poll_stop_signal, return_stats
        self.max_queue_size = max_queue_size
        self.idle_wait_s = idle_wait_s
        self.max_beam_width = max_beam_width
        self._on_failure = on_failure
        if max_attention_window is not None:  # the seed's maxAttentionWindow: sliding window
            if max_attention_window < 1:
                raise ValueError(f"max_attention_window must be at least 1, got {max_attention_window}")
            current = getattr(model, "window", None)
            model.window = max_attention_window if current is None else min(current, max_attention_window)
        self.metrics = ServingMetrics()
        self._v1_batch = 0
        self._stamp: tuple[int, str] = (0, "")

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
            with torch.inference_mode():  # once for the thread: the forward pass then skips it
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
                if seq.beam is None or seq is seq.beam.leader:
                    try:
                        self._finish(seq, f"batch manager failed: {exc}", with_outputs=False)
                    except BaseException:  # noqa: BLE001 - keep failing the others
                        log.exception("failing a request after the loop failed")
            if self._on_failure is not None:
                try:
                    self._on_failure(exc)
                except Exception:  # noqa: BLE001
                    log.exception("on_failure callback failed")

    def step(self) -> bool:
        """One iteration; False when there was nothing to run."""
        logged = self.step_log is not None  # CPU times (a system call each) only for the log
        start, cpu_start = time.perf_counter_ns(), time.thread_time_ns() if logged else 0
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
        now = time.monotonic_ns()
        for seq in plan.admitted:
            if not seq.first_scheduled_ns:  # not a resumed pause
                seq.first_scheduled_ns = now
                self.metrics.queue_time.observe((now - seq.request.arrival_ns) / 1e9)
                self.metrics.prompt_tokens += seq.prompt_len
        if self.config.batching is BatchingScheme.V1 and plan.admitted:
            self._v1_batch = len(self.active)
        batch = build_step(plan.decode, plan.context, self.cache.tokens_per_block)
        if self.model.device.type != "cpu":
            batch = batch.to(self.model.device)
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns() if logged else 0
        try:
            logits = self.model.forward(batch, self.cache)
        except Exception as exc:
            log.exception("forward pass failed")
            failed = plan.decode + [s for s, _ in plan.context]
            for seq in failed:
                self.cache.forget(seq.block_table)  # registered for reuse, never computed
            for seq in failed:
                if seq.beam is None or seq is seq.beam.leader:
                    self._finish(seq, f"forward pass failed: {type(exc).__name__}: {exc}",
                                 with_outputs=False)
            return True
        t1, c1 = time.perf_counter_ns(), time.thread_time_ns() if logged else 0
        generated = self._advance(plan.decode + [s for s, _ in plan.context],
                                  [1] * len(plan.decode) + [n for _, n in plan.context], batch, logits)
        self._apply_stops()
        self.iteration += 1
        end = time.perf_counter_ns()
        self.forward_ns += t1 - t0
        self.host_ns += (end - start) - (t1 - t0)
        self.steps += 1
        if logged and self.step_log is not None:
            self.step_log.append((start, t1 - t0, len(plan.decode) + len(plan.context),
                                  cpu_start, c1 - c0))
        self._report(plan, batch, end - start, t1 - t0, generated)
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
        if self.error is not None:
            return f"the batch manager is not running: it failed ({self.error})"
        model, cfg = self.model, self.config
        n = len(r.input_ids)
        if r.beam_width != 1 and (not isinstance(r.beam_width, int) or r.beam_width > self.max_beam_width):
            return (f"beam width {r.beam_width} is not supported (beam_width above the model's "
                    f"max_beam_width {self.max_beam_width})")
        problem = r.problem()
        if problem:
            return problem
        if r.beam_width > 1:
            if r.streaming:
                return "streaming is not supported with beam width > 1"
            if r.return_generation_logits or r.top_log_probs:
                return "generation logits and top log probs are not supported with beam width > 1"
            if r.beam_width > cfg.max_batch_size:
                return f"beam width {r.beam_width} exceeds the maximum batch size {cfg.max_batch_size}"
        if r.logits_post_processor is not None and cfg.batching is BatchingScheme.V1:
            return "the logits post-processor is not supported with the V1 batching scheme"
        if n == 0:
            return "input_ids is empty"
        vocab = model.vocab_size
        bad = [t for t in r.input_ids if not 0 <= t < vocab]
        if bad:
            return f"token id {bad[0]} is out of the vocabulary (0..{vocab - 1})"
        for name in ("stop_words", "bad_words"):
            wrong = [t for words in getattr(r, name) for t in words if not 0 <= t < vocab]
            if wrong:
                return f"{name}: token id {wrong[0]} is out of the vocabulary (0..{vocab - 1})"
        wrong = [t for t in r.stop_token_ids if not isinstance(t, int)]
        if wrong:
            return f"stop token ids must be integers, got {wrong[0]!r}"
        if n + r.max_new_tokens > model.max_seq_len:
            return (f"prompt ({n} tokens) + tokens to generate ({r.max_new_tokens}) exceed the "
                    f"model's maximum sequence length {model.max_seq_len}")
        need = self.cache.blocks_for(n + r.max_new_tokens) * r.beam_width
        if need > self.cache.num_blocks:
            return (f"the request needs up to {need} KV cache blocks; the pool has "
                    f"{self.cache.num_blocks}")
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
                 logits: torch.Tensor) -> int:
        """Take this iteration's logits: sample, step beams, answer. Returns the tokens made."""
        sampling: list[Sequence] = []
        rows: list[int] = []
        for seq, n, (first, count) in zip(seqs, counts, batch.logits_rows):
            start = seq.num_cached
            seq.num_cached += n
            if seq.request.return_context_logits and seq.context_logits is None and count:
                prompt_rows = min(count, seq.prompt_len - start)
                part = logits[first:first + prompt_rows].float().cpu().numpy().copy()
                seq.extra.setdefault("ctx", []).append(part)
                if start + prompt_rows >= seq.prompt_len:
                    seq.context_logits = np.concatenate(seq.extra.pop("ctx"))
            if seq.num_cached == len(seq.tokens):
                sampling.append(seq)
                rows.append(first + count - 1)
        if not sampling:
            return 0
        chosen = logits[torch.tensor(rows, device=logits.device)] if len(rows) != logits.shape[0] else logits
        if self.max_beam_width > 1:  # (beam search needs it: check() refuses the others)
            plain = [i for i, seq in enumerate(sampling) if seq.request.beam_width == 1]
            if len(plain) != len(sampling):
                self._advance_beams(sampling, chosen)
                if not plain:
                    return len(sampling)
                sampling = [sampling[i] for i in plain]
                chosen = chosen[torch.tensor(plain, device=chosen.device)]
        choice = sample(sampling, chosen)
        now = time.monotonic_ns()
        send, outputs, errors, generation = self._send, self._outputs, choice.errors, Phase.GENERATION
        m = self.metrics
        gaps: list[float] = []  # inter-token latencies, observed together after the loop
        gap, token_ids = gaps.append, _TOKEN
        for i, (seq, token) in enumerate(zip(sampling, choice.tokens)):
            if errors and i in errors:
                self._finish(seq, f"sampling failed: {errors[i]}", with_outputs=False)
                continue
            seq.tokens.append(token)
            seq.phase = generation
            # _timed, inlined (this loop runs for every request, every step)
            if seq.first_token_ns:
                gap((now - seq.last_token_ns) / 1e9)
            else:
                seq.first_token_ns = now
                m.ttft.observe((now - seq.request.arrival_ns) / 1e9)
            seq.last_token_ns = now
            if seq.quick:  # plain, no stop_check: nothing more to record, answer
                r = seq.request
                generated = len(seq.tokens) - seq.prompt_len
                # seq.finished() for a sequence with no stop_check, inlined (one token made)
                if (generated >= r.max_new_tokens or seq.stopped or token == r.end_id
                        or token in r.stop_token_ids or (r.stop_words and seq.finished())):
                    self._finish(seq, "")
                elif r.streaming:
                    if seq.sent == generated - 1 and not r.return_context_logits:
                        seq.sent = generated  # _outputs' common case (the one new token), inlined
                        ids = token_ids.get(token)
                        send(r.request_id, {"output_ids": _one_token(token) if ids is None else ids,
                                            "sequence_length": _ONE}, False, "")
                    else:
                        send(r.request_id, outputs(seq), False, "")
                continue
            log_prob, top = choice.log_probs[i], choice.top[i]
            if log_prob is not None:
                seq.log_probs.append(log_prob)
            if top is not None:
                seq.top.append(top)
            if seq.request.return_generation_logits:
                seq.generation_logits.append(chosen[i].float().cpu().numpy().copy())
            stop = seq.request.stop_check
            if stop is not None:
                try:
                    seq.stopped = bool(stop(seq.tokens[seq.prompt_len:]))
                except Exception as exc:  # noqa: BLE001 - the request's own hook
                    self._finish(seq, f"stop check failed: {type(exc).__name__}: {exc}",
                                 with_outputs=False)
                    continue
            if seq.finished():
                self._finish(seq, "")
            elif seq.request.streaming:
                self._send(seq.request_id, self._outputs(seq), False, "")
        m.generation_tokens += len(sampling) - len(errors)
        if gaps:
            m.inter_token.observe_all(gaps)
        return len(sampling)

    def _timed(self, seq: Sequence, now: int) -> None:
        m = self.metrics
        if not seq.first_token_ns:
            seq.first_token_ns = now
            m.ttft.observe((now - seq.request.arrival_ns) / 1e9)
        else:
            m.inter_token.observe((now - seq.last_token_ns) / 1e9)
        seq.last_token_ns = now
        m.generation_tokens += 1

    def _advance_beams(self, sampling: list[Sequence], chosen: torch.Tensor) -> None:
        """Beam-search requests: fork the ones whose prompt is done, step the others."""
        groups: dict[int, tuple[Any, dict[int, int]]] = {}
        now = time.monotonic_ns()
        for i, seq in enumerate(sampling):
            if seq.request.beam_width == 1:
                continue
            if seq.beam is None:  # the prompt is computed: fork into beams
                try:
                    group = beams.start(self.cache, seq, chosen[i])
                except Exception as exc:  # noqa: BLE001 - this request's own failure
                    self._finish(seq, f"beam search failed: {type(exc).__name__}: {exc}",
                                 with_outputs=False)
                    continue
                self.active.extend(group.children)
                self._timed(seq, now)
                if group.finished:
                    self._finish(seq, "")
                continue
            group = seq.beam
            groups.setdefault(id(group), (group, {}))[1][group.beams.index(seq)] = i
        for group, rows in groups.values():
            leader = group.leader
            try:
                if len(rows) != len(group.beams):
                    raise RuntimeError(f"{len(rows)} of {len(group.beams)} beams were scheduled")
                order = torch.tensor([rows[b] for b in range(len(group.beams))], device=chosen.device)
                beams.step(group, self.cache, chosen[order])
            except Exception as exc:  # noqa: BLE001
                self._finish(leader, f"beam search failed: {type(exc).__name__}: {exc}",
                             with_outputs=False)
                continue
            self._timed(leader, now)
            if group.finished:
                self._finish(leader, "")

    def _apply_stops(self) -> None:
        if self._poll_stop is None:
            return
        for rid in self._poll_stop() or ():
            seq = self._by_id.get(rid)
            if seq is not None:
                self._finish(seq, "")

    def _finish(self, seq: Sequence, error: str, with_outputs: bool = True) -> None:
        """Free everything of `seq` (and its beams), then send its final response."""
        group = seq.beam
        for s in [seq] if group is None else group.beams:
            if s.phase is Phase.WAITING:
                try:
                    self.waiting.remove(s)
                except ValueError:
                    pass
            else:
                try:
                    self.active.remove(s)
                except ValueError:
                    pass
        outputs = self._outputs(seq) if with_outputs and not error else {}
        for s in [seq] if group is None else group.beams:
            self.scheduler.release(s)
        self._by_id.pop(seq.request_id, None)
        m, r = self.metrics, seq.request
        if error:
            reason = "error"
        elif group is None and not seq.finished():
            reason = "abort"
        elif seq.generated >= r.max_new_tokens:
            reason = "length"
        else:
            reason = "stop"
        m.finished[reason] += 1
        m.e2e.observe((time.monotonic_ns() - r.arrival_ns) / 1e9)
        self._send(seq.request_id, outputs, True, error)

    def _outputs(self, seq: Sequence) -> dict[str, np.ndarray]:
        """The response tensors: the new tokens for streaming, everything otherwise."""
        r = seq.request
        pad = r.pad_id if r.pad_id is not None else (r.end_id if r.end_id is not None else 0)
        if seq.beam is not None:
            beam_out = beams.outputs(seq.beam, pad, not r.exclude_input_in_output)
            if r.pad_to_max_length:
                beam_out["output_ids"] = _padded(beam_out["output_ids"], self.model.max_seq_len, pad)
            return beam_out
        if r.streaming:
            first = seq.sent
            ids = seq.tokens[seq.prompt_len + first:]
            if len(ids) == 1 and not (r.return_log_probs or r.return_generation_logits
                                      or r.return_context_logits):  # the common case, made cheap
                seq.sent = seq.generated
                if not r.top_log_probs:
                    return {"output_ids": _one_token(ids[0]), "sequence_length": _ONE}
        else:
            first = 0
            ids = seq.tokens[seq.prompt_len:] if r.exclude_input_in_output else seq.tokens
        seq.sent = seq.generated
        out: dict[str, np.ndarray] = {
            "output_ids": np.asarray(ids, dtype=np.int32).reshape(1, 1, -1),
            "sequence_length": np.asarray([[len(ids)]], dtype=np.int32),
        }
        if r.pad_to_max_length and not r.streaming:
            out["output_ids"] = _padded(out["output_ids"], self.model.max_seq_len, pad)
        if r.return_log_probs:
            out["output_log_probs"] = np.asarray(seq.log_probs[first:], np.float32).reshape(1, 1, -1)
            out["cum_log_probs"] = np.asarray([[sum(seq.log_probs)]], np.float32)
        if r.top_log_probs:
            top = seq.top[first:]
            k = len(top[0][0]) if top else r.top_log_probs
            out["top_token_ids"] = np.asarray([t[0] for t in top], np.int32).reshape(1, 1, -1, k)
            out["top_log_probs"] = np.asarray([t[1] for t in top], np.float32).reshape(1, 1, -1, k)
        if r.return_context_logits and seq.context_logits is not None and first == 0:
            out["context_logits"] = seq.context_logits[None]
        if r.return_generation_logits:
            rows = seq.generation_logits[first:]
            vocab = self.model.vocab_size
            out["generation_logits"] = (np.stack(rows) if rows else np.zeros((0, vocab), np.float32)
                                        ).reshape(1, 1, -1, vocab)
        return out

    # --- statistics ------------------------------------------------------------------------------
    def _report(self, plan: Any, batch: StepBatch, iteration_ns: int, forward_ns: int,
                generated: int) -> None:
        if self._return_stats is None:
            return
        cache = self.cache
        now = int(time.time())
        if now != self._stamp[0]:  # strftime once a second, not once an iteration
            self._stamp = (now, time.strftime("%m-%d-%Y %H:%M:%S", time.localtime(now)))
        stats = {
            "Timestamp": self._stamp[1],
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
        if self.config.batching is BatchingScheme.V1:
            stats["Total Generation Tokens"] = generated
            stats["Empty Generation Slots"] = max(
                0, self._v1_batch - len(plan.decode) - len(plan.context))
        self._return_stats(orjson.dumps(stats).decode())


def _padded(ids: np.ndarray, length: int, pad: int) -> np.ndarray:
    """output_ids [1, beam, n] -> [1, beam, length], filled with `pad` (the seed's shape)."""
    out = np.full(ids.shape[:2] + (max(length, ids.shape[2]),), pad, np.int32)
    out[:, :, :ids.shape[2]] = ids
    return out
