#!/usr/bin/env python3
"""In-flight batching against the static schemes, on one seeded workload, in one run.

    python benchmarks/inflight_bench.py            # 5-10 minutes on a shared 2-core CPU
    python benchmarks/inflight_bench.py --quick    # smaller model and workload, 1-3 minutes
    python benchmarks/inflight_bench.py --scale 1  # the full lengths below (about 4x longer)

Workload (seeded): prompt lengths uniform in [32, 256], output lengths exponential with mean 128
capped at 512, both multiplied by --scale (default 0.5 to keep the run short on a small CPU,
--quick 0.25; printed), random prompt tokens; every request runs to its output length (no end
id). Arrivals: offline (all at t=0) and Poisson at
--load (default 0.7) times the in-flight capacity measured offline.

Modes, all through `host.inflight.BatchManager` and the same decoder weights:
- one-at-a-time: max batch size 1;
- static-padded: the classic static batcher: up to B waiting requests form a batch, their
  prompts are left-padded to the longest and all run for the batch's longest output; the next
  batch starts when this one ends (only the requested tokens count as output);
- STATIC_BATCH: the capacity policy: batches of up to B, no padding, finished requests leave,
  nobody joins until the batch is empty;
- in-flight: GUARANTEED_NO_EVICT, max batch B, chunked context: requests join and leave at every
  iteration.

Reported: output tokens per second of wall-clock time and per CPU-second of the manager's thread
(with one torch thread all the work runs there; on a machine shared with other processes the CPU
time is the steadier figure), time to first token (p50/p99), and, from the in-flight run's
iteration log, the step costs at batch >= 8: forward pass, host work (everything else in the
loop: scheduling, packing, sampling, responses, statistics) and its share of the step.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from host.inflight import (BatchManager, CapacityPolicy, DecoderConfig, GenerationRequest,  # noqa: E402
                           KVCacheConfig, SchedulerConfig, TinyDecoder)


@dataclass
class Item:
    rid: int
    prompt: list[int]
    output_len: int
    arrival: float = 0.0  # seconds after the start


def make_workload(count: int, seed: int, vocab: int, scale: float) -> list[Item]:
    rng = random.Random(seed)
    items = []
    for i in range(count):
        prompt_len = max(1, round(rng.randint(32, 256) * scale))
        output_len = max(1, min(round(512 * scale), round(rng.expovariate(1 / (128 * scale)))))
        items.append(Item(i, [rng.randrange(1, vocab) for _ in range(prompt_len)], output_len))
    return items


def poisson(items: list[Item], rate: float, seed: int) -> list[Item]:
    rng = random.Random(seed + 1)
    t, out = 0.0, []
    for item in items:
        t += rng.expovariate(rate)
        out.append(Item(item.rid, item.prompt, item.output_len, t))
    return out


@dataclass
class Outcome:
    mode: str
    arrivals: str
    wall_s: float
    output_tokens: int
    ttft: list[float] = field(default_factory=list)
    iterations: int = 0
    cpu_s: float = 0.0  # CPU time of the manager's thread (the only one working: 1 torch thread)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s

    @property
    def tokens_per_cpu_s(self) -> float:
        return self.output_tokens / self.cpu_s

    def pct(self, p: float) -> float:
        xs = sorted(self.ttft)
        return xs[min(len(xs) - 1, max(0, math.ceil(p / 100 * len(xs)) - 1))]


class Driver:
    """The client side of the callbacks: releases requests at their arrival times and records
    first-token and finish times. `padded_batch`: act as the static batcher with padding."""

    def __init__(self, items: list[Item], padded_batch: int = 0, pad_id: int = 0) -> None:
        self.items = sorted(items, key=lambda i: i.arrival)
        self.by_rid = {i.rid: i for i in items}
        self.next = 0
        self.padded_batch, self.pad_id = padded_batch, pad_id
        self.outstanding = 0
        self.first: dict[int, float] = {}
        self.done: dict[int, float] = {}
        self.all_done = threading.Event()
        self.t0 = 0.0
        self.cpu0 = self.cpu1 = 0  # the worker thread's CPU time at its first call and at the end

    def start(self) -> None:
        self.t0 = time.perf_counter()

    def _arrived(self, limit: int) -> list[Item]:
        now = time.perf_counter() - self.t0
        out = []
        while self.next < len(self.items) and self.items[self.next].arrival <= now and \
                (limit < 0 or len(out) < limit):
            out.append(self.items[self.next])
            self.next += 1
        return out

    def get_new_requests(self, n: int) -> list[GenerationRequest]:
        if not self.cpu0:
            self.cpu0 = time.thread_time_ns()
        if not self.padded_batch:
            return [GenerationRequest(i.rid, i.prompt, i.output_len, streaming=True)
                    for i in self._arrived(n)]
        if self.outstanding:
            return []
        batch = self._arrived(self.padded_batch)
        if not batch:
            return []
        longest = max(len(i.prompt) for i in batch)
        steps = max(i.output_len for i in batch)
        self.outstanding = len(batch)
        return [GenerationRequest(i.rid, [self.pad_id] * (longest - len(i.prompt)) + i.prompt, steps,
                                  streaming=True) for i in batch]

    def send_response(self, rid: int, tensors: dict, final: bool, error: str) -> None:
        if error:
            raise RuntimeError(f"request {rid}: {error}")
        now = time.perf_counter() - self.t0
        if rid not in self.first and tensors and tensors["output_ids"].size:
            self.first[rid] = now
        if final:
            self.done[rid] = now
            if self.padded_batch:
                self.outstanding -= 1
            if len(self.done) == len(self.items):
                self.cpu1 = time.thread_time_ns()
                self.all_done.set()


def run(mode: str, model: TinyDecoder, items: list[Item], batch: int, kv_tokens: int,
        arrivals: str) -> tuple[Outcome, BatchManager]:
    policy = {"one-at-a-time": CapacityPolicy.GUARANTEED_NO_EVICT,
              "static-padded": CapacityPolicy.STATIC_BATCH,
              "STATIC_BATCH": CapacityPolicy.STATIC_BATCH,
              "in-flight": CapacityPolicy.GUARANTEED_NO_EVICT}[mode]
    size = 1 if mode == "one-at-a-time" else batch
    driver = Driver(items, padded_batch=batch if mode == "static-padded" else 0)
    chunked = mode == "in-flight"
    manager = BatchManager(
        model, get_new_requests=driver.get_new_requests, send_response=driver.send_response,
        scheduler_config=SchedulerConfig(policy=policy, max_batch_size=size,
                                         max_num_tokens=512 if chunked else None,
                                         enable_chunked_context=chunked),
        kv_cache_config=KVCacheConfig(max_tokens=kv_tokens, tokens_per_block=16),
        idle_wait_s=0.0005, start=False)
    manager.step_log = []
    driver.start()
    manager.start()
    driver.all_done.wait()
    manager.shutdown()
    wall = max(driver.done.values()) - min(i.arrival for i in items)
    ttft = [driver.first[i.rid] - i.arrival for i in items]
    outcome = Outcome(mode, arrivals, wall, sum(i.output_len for i in items), ttft, manager.iteration,
                      (driver.cpu1 - driver.cpu0) / 1e9)
    return outcome, manager


def step_costs(manager: BatchManager, min_batch: int) -> dict[str, float]:
    """Mean step (start to next start), forward pass and host work (the rest) over the iterations
    that ran at least `min_batch` requests, in the worker thread's CPU time (and wall time)."""
    log = manager.step_log or []
    steps, forwards, wall_steps, wall_forwards = [], [], [], []
    for (start, forward, scheduled, cpu, cpu_forward), (next_start, _, _, next_cpu, _) in zip(log, log[1:]):
        if scheduled >= min_batch:
            steps.append(next_cpu - cpu)
            forwards.append(cpu_forward)
            wall_steps.append(next_start - start)
            wall_forwards.append(forward)
    if not steps:
        return {}
    step, fwd = statistics.fmean(steps) / 1e6, statistics.fmean(forwards) / 1e6
    wall, wall_fwd = statistics.fmean(wall_steps) / 1e6, statistics.fmean(wall_forwards) / 1e6
    return {"iterations": len(steps), "step_cpu_ms": step, "forward_cpu_ms": fwd,
            "host_cpu_us": (step - fwd) * 1e3, "host_share_pct": 100 * (step - fwd) / step,
            "step_wall_ms": wall, "forward_wall_ms": wall_fwd,
            "host_wall_share_pct": 100 * (wall - wall_fwd) / wall}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller model, fewer and shorter requests")
    p.add_argument("--requests", type=int, help="requests per run (default 32, quick 16)")
    p.add_argument("--scale", type=float, help="length multiplier (default 0.5, quick 0.25)")
    p.add_argument("--batch", type=int, default=8, help="max batch size of the batched modes")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (inter-op: 1)")
    p.add_argument("--load", type=float, default=0.7, help="Poisson rate / in-flight capacity")
    p.add_argument("--d-model", type=int, help="default 384, quick 256")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--kv-heads", type=int, help="grouped-query attention (default heads / 4)")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps-only", action="store_true",
                   help="only the offline in-flight run and its step costs (e.g. for a larger --d-model)")
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args(argv)
    count = args.requests or (16 if args.quick else 32)
    scale = args.scale or (0.25 if args.quick else 0.5)
    d_model = args.d_model or (256 if args.quick else 384)

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    heads = max(1, d_model // 64)
    config = DecoderConfig(vocab_size=args.vocab, d_model=d_model, heads=heads,
                           kv_heads=args.kv_heads or max(1, heads // 4), layers=args.layers, d_ff=4 * d_model, max_seq_len=1024, seed=args.seed)
    model = TinyDecoder(config)
    params = sum(p.numel() for p in model.parameters())
    kv_tokens = args.batch * 1024
    items = make_workload(count, args.seed, args.vocab, scale)
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs (load {os.getloadavg()[0]:.1f}), torch {torch.__version__}, "
          f"threads intra-op {torch.get_num_threads()} inter-op {torch.get_num_interop_threads()}")
    print(f"# model: {config.layers} layers, d_model {config.d_model}, {config.heads} heads "
          f"({config.kv_heads} KV heads), vocab "
          f"{config.vocab_size}, {params / 1e6:.1f}M parameters, float32")
    print(f"# workload: {count} requests, scale {scale}: prompts {min(len(i.prompt) for i in items)}-"
          f"{max(len(i.prompt) for i in items)} tokens, outputs mean "
          f"{statistics.fmean(i.output_len for i in items):.0f} (max {max(i.output_len for i in items)}), "
          f"batch {args.batch}, KV pool {kv_tokens} tokens")

    outcomes: list[Outcome] = []
    managers: dict[str, BatchManager] = {}
    modes = ("in-flight",) if args.steps_only else ("one-at-a-time", "static-padded", "STATIC_BATCH",
                                                    "in-flight")
    for mode in modes:
        outcome, manager = run(mode, model, items, args.batch, kv_tokens, "offline")
        outcomes.append(outcome)
        managers[mode] = manager
        print(f"offline  {mode:14s} {outcome.tokens_per_s:8.1f} tok/s  {outcome.tokens_per_cpu_s:8.1f} "
              f"tok/CPU-s  wall {outcome.wall_s:6.1f} s  iterations {outcome.iterations}", flush=True)
    inflight = outcomes[-1]
    if args.steps_only:
        costs = step_costs(managers["in-flight"], args.batch)
        print(f"step_costs_batch_ge_{args.batch}: " + ", ".join(f"{k} {v:.2f}" for k, v in costs.items()))
        return
    capacity = len(items) / inflight.wall_s  # requests/s the in-flight batcher sustains offline
    rate = args.load * capacity
    arriving = poisson(items, rate, args.seed)
    for mode in ("static-padded", "STATIC_BATCH", "in-flight"):
        outcome, _ = run(mode, model, arriving, args.batch, kv_tokens, f"poisson {rate:.2f}/s")
        outcomes.append(outcome)
        print(f"poisson  {mode:14s} TTFT p50 {outcome.pct(50) * 1e3:8.0f} ms  p99 "
              f"{outcome.pct(99) * 1e3:8.0f} ms  {outcome.tokens_per_s:8.1f} tok/s", flush=True)

    by = {(o.mode, o.arrivals.split()[0]): o for o in outcomes}
    costs = step_costs(managers["in-flight"], args.batch)
    one = step_costs(managers["one-at-a-time"], 1)

    def ratio(attr: str, other: str) -> float:
        return getattr(inflight, attr) / getattr(by[other, "offline"], attr)

    summary = {
        "inflight_vs_static_padded_throughput": ratio("tokens_per_s", "static-padded"),
        "inflight_vs_one_at_a_time_throughput": ratio("tokens_per_s", "one-at-a-time"),
        "inflight_vs_STATIC_BATCH_throughput": ratio("tokens_per_s", "STATIC_BATCH"),
        "inflight_vs_static_padded_per_cpu_s": ratio("tokens_per_cpu_s", "static-padded"),
        "inflight_vs_one_at_a_time_per_cpu_s": ratio("tokens_per_cpu_s", "one-at-a-time"),
        "inflight_vs_STATIC_BATCH_per_cpu_s": ratio("tokens_per_cpu_s", "STATIC_BATCH"),
        "p99_ttft_static_padded_over_inflight": by["static-padded", "poisson"].pct(99) / by["in-flight", "poisson"].pct(99),
        "p99_ttft_STATIC_BATCH_over_inflight": by["STATIC_BATCH", "poisson"].pct(99) / by["in-flight", "poisson"].pct(99),
        "p50_ttft_static_padded_over_inflight": by["static-padded", "poisson"].pct(50) / by["in-flight", "poisson"].pct(50),
        "p50_ttft_STATIC_BATCH_over_inflight": by["STATIC_BATCH", "poisson"].pct(50) / by["in-flight", "poisson"].pct(50),
        "poisson_rate_per_s": rate,
        "step_costs_batch_ge_%d" % args.batch: costs,
        "step_costs_batch_1": one,
    }
    print("\n# targets: in-flight >= 2x static-padded and >= 3x one-at-a-time tokens/s; "
          "p99 TTFT >= 10x lower than static; host work < 2% of the step at batch >= 8")
    for key, value in summary.items():
        if isinstance(value, dict):
            print(f"{key}: " + ", ".join(f"{k} {v:.2f}" for k, v in value.items()))
        else:
            print(f"{key}: {value:.2f}")
    if args.json:
        args.json.write_text(json.dumps({
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "threads": args.threads,
            "model": config.as_dict(), "parameters": params, "requests": count, "scale": scale,
            "outcomes": [{"mode": o.mode, "arrivals": o.arrivals, "tokens_per_s": o.tokens_per_s,
                          "tokens_per_cpu_s": o.tokens_per_cpu_s,
                          "wall_s": o.wall_s, "ttft_p50_ms": o.pct(50) * 1e3, "ttft_p99_ms": o.pct(99) * 1e3,
                          "iterations": o.iterations} for o in outcomes],
            "summary": summary}, indent=2))


if __name__ == "__main__":
    main()
