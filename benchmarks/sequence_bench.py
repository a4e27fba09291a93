#!/usr/bin/env python3
"""Sequence batcher benchmark: modelhost against the real NVIDIA Triton, same python accumulator.

Both servers serve the example repository's `sequence_accumulator` (model.py unchanged) twice:
`seq_direct` (its config: direct strategy, max_batch_size 8) and `seq_oldest` (the same with
`oldest { max_candidate_sequences: 8 }`). Per server and strategy:

- throughput: perf_analyzer (gRPC unary calls and the gRPC stream unless --protocol says otherwise), 8
  concurrent sequences of 100 requests
  (`--concurrency-range 8 --sequence-length 100 --sequence-length-variation 0 --serial-sequences`:
  one request in flight per sequence);
- CPU per request, and correctness: a tritonclient run of 8 threads, each one sequence of 100
  requests, every answer checked against the running sum; the server's CPU time (user + system of
  its whole process group, from /proc, so Triton's python-backend stub counts too) over that exact
  number of requests. The other jobs on a shared machine disturb it less than throughput.

    python benchmarks/sequence_bench.py [--rounds 2] [--sequences 8] [--length 100]
                                        [--passes 3] [--protocol grpc grpc-stream http] [--skip-triton]
                                        [--out docs/sequences_benchmark.md] [--no-write]

The servers run one after the other, `--passes` times (alternating, so that the noise of a shared
machine falls on both), each for one perf_analyzer run and `--rounds` tritonclient rounds per
strategy after a short warm-up; figures are medians. Uses the helpers of
benchmarks/perf_vs_triton.py (anchor set-up, server processes) and cache_bench.py (CPU time of a
process group).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cache_bench  # noqa: E402
import perf_vs_triton as pvt  # noqa: E402

EXAMPLE = os.path.join(pvt.REPO_ROOT, "model_repository", "sequence_accumulator")
STRATEGIES = {"direct": "seq_direct", "oldest": "seq_oldest"}
TARGET = 1.5  # modelhost / Triton throughput
# Loose stability: on a busy shared machine a strict criterion fails more often than it helps.
PA_FLAGS = ["--measurement-interval", "3000", "--max-trials", "5", "--stability-percentage", "100"]


def build_repository() -> str:
    """perf_vs_triton's repository (its identity model tells when a server is ready) plus the
    accumulator under both strategies."""
    repo = pvt.build_repository()
    add_models(repo)
    return repo


def add_models(repo: str) -> None:
    """The accumulator under both strategies (STRATEGIES), added to the repository at `repo`."""
    with open(os.path.join(EXAMPLE, "config.pbtxt")) as f:
        config = f.read()
    for strategy, name in STRATEGIES.items():
        os.makedirs(os.path.join(repo, name, "1"))
        shutil.copyfile(os.path.join(EXAMPLE, "1", "model.py"), os.path.join(repo, name, "1", "model.py"))
        text = config.replace('name: "sequence_accumulator"', f'name: "{name}"')
        if strategy == "oldest":
            text = text.replace("direct { }", "oldest { max_candidate_sequences: 8 }")
        with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
            f.write(text)


def run_sequences(url: str, model: str, sequences: int, length: int, first_id: int) -> tuple[int, list[str]]:
    """`sequences` threads, each one sequence of `length` requests; returns (requests, errors)."""
    import tritonclient.grpc as grpcclient

    errors: list[str] = []

    def one(sequence_id: int) -> None:
        client = grpcclient.InferenceServerClient(url)
        total = 0
        try:
            for k in range(length):
                value = (sequence_id + k) % 7
                i = grpcclient.InferInput("INPUT", [1, 1], "INT32")
                i.set_data_from_numpy(np.array([[value]], dtype=np.int32))
                r = client.infer(model, [i], sequence_id=sequence_id, sequence_start=k == 0,
                                 sequence_end=k == length - 1)
                total += value
                got = int(r.as_numpy("OUTPUT").item())
                if got != total:
                    errors.append(f"sequence {sequence_id} request {k}: {got} != {total}")
                    return
        except Exception as exc:  # reported with the figures
            errors.append(f"sequence {sequence_id}: {exc}")
        finally:
            client.close()

    threads = [threading.Thread(target=one, args=(first_id + s,)) for s in range(sequences)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sequences * length, errors


def measure(server: pvt.Server, args, rows: list[dict], pa_rows: list[dict]) -> None:
    server.start()
    try:
        url = f"127.0.0.1:{server.grpc_port}"
        pgid = os.getpgid(server.proc.pid)
        for strategy, model in STRATEGIES.items():
            run_sequences(url, model, args.sequences, 10, 1)  # warm-up
            for protocol in args.protocol:
                resdir = tempfile.mkdtemp(prefix=f"sequence_bench_{server.name}_{strategy}_{protocol}_")
                pa_protocol, extra = pvt.MODES[protocol]
                pa_url = url if pa_protocol == "grpc" else f"127.0.0.1:{server.http_port}"
                pa = pvt.perf_analyzer(model, pa_url, pa_protocol, [
                    *extra, "--concurrency-range", f"{args.sequences}:{args.sequences}",
                    "--sequence-length", str(args.length), "--sequence-length-variation", "0",
                    "--serial-sequences", "--sequence-id-range", "100000:10000000", *PA_FLAGS],
                    os.path.join(resdir, "pa.csv"), os.path.join(resdir, "pa.log"))
                pvt.log(f"{server.name:9s} {strategy:6s} {protocol:11s} perf_analyzer: " + (
                    f"{pa['infer_s']:.1f} infer/s, p50 {pa['p50_ms']:.2f} ms" if pa["ok"] else pa["error"]))
                pa_rows.append({"server": server.name, "strategy": strategy, "protocol": protocol, **pa})
            for round_ in range(args.rounds):
                cpu0, t0 = cache_bench.group_cpu_seconds(pgid), time.perf_counter()
                count, errors = run_sequences(url, model, args.sequences, args.length,
                                              1000 * (round_ + 1))
                wall, cpu = time.perf_counter() - t0, cache_bench.group_cpu_seconds(pgid) - cpu0
                row = {"server": server.name, "strategy": strategy, "round": round_ + 1,
                       "requests": count, "infer_s": count / wall, "cpu_us": 1e6 * cpu / count,
                       "errors": errors}
                pvt.log(f"{server.name:9s} {strategy:6s} round {round_ + 1}: {row['infer_s']:7.1f} infer/s, "
                        f"{row['cpu_us']:6.0f} us CPU/request" + (f", ERRORS {errors[:2]}" if errors else ""))
                rows.append(row)
    finally:
        server.stop()


def summarize(rows: list[dict], pa_rows: list[dict]) -> dict:
    out: dict = {}
    for r in rows:
        out.setdefault((r["server"], r["strategy"]), []).append(r)
    summary = {key: {"client_infer_s": statistics.median(r["infer_s"] for r in rs),
                     "cpu_us": statistics.median(r["cpu_us"] for r in rs),
                     "errors": sum(len(r["errors"]) for r in rs)} for key, rs in out.items()}
    by_key: dict = {}
    for r in pa_rows:
        by_key.setdefault((r["server"], r["strategy"], r["protocol"]), []).append(r)
    for (server, strategy, protocol), rs in by_key.items():
        ok = [r for r in rs if r["ok"]]
        entry = summary.setdefault((server, strategy), {}).setdefault("pa", {})[protocol] = {}
        entry["infer_s"] = statistics.median(r["infer_s"] for r in ok) if ok else None
        entry["p50_ms"] = statistics.median(r["p50_ms"] for r in ok) if ok else None
        entry["pa_runs"] = f"{len(ok)}/{len(rs)}"
        entry["pa_error"] = next((r["error"] for r in rs if not r["ok"]), "")
    return summary


def report(summary: dict, args, started: _dt.datetime, wall: float, machine: dict) -> str:
    lines = [
        "# Sequence batcher benchmark: modelhost vs Triton",
        "",
        "Written by `benchmarks/sequence_bench.py`; regenerate rather than edit.",
        "",
        f"The example `sequence_accumulator` python model (unchanged) under the direct and the oldest "
        f"strategy; {args.sequences} concurrent sequences of {args.length} requests each, one request "
        f"in flight per sequence. Throughput: perf_analyzer over {' and '.join(args.protocol)} "
        f"(`--sequence-length "
        f"{args.length} --sequence-length-variation 0 --serial-sequences --concurrency-range "
        f"{args.sequences}`, {' '.join(PA_FLAGS)}). The servers alternate, {args.passes} passes; "
        f"figures are medians over them. CPU per request and correctness: {args.rounds} "
        f"rounds of {args.sequences} tritonclient threads, one sequence of {args.length} requests "
        "each, every answer checked; user + system time of the server's process group (Triton's "
        "python-backend stub included) over those requests.",
        "",
        "| server | strategy | perf_analyzer protocol | infer/s (perf_analyzer) | p50 ms | "
        "perf_analyzer runs ok |",
        "|---|---|---|---:|---:|---:|",
    ]
    for (server, strategy), s in sorted(summary.items()):
        for protocol in args.protocol:
            p = s.get("pa", {}).get(protocol)
            if p is None:
                continue
            pa = (f"{p['infer_s']:.1f} | {p['p50_ms']:.2f} | {p['pa_runs']}" if p.get("infer_s")
                  else f"failed: {p.get('pa_error', '')[:80]} | - | {p.get('pa_runs', '-')}")
            lines.append(f"| {server} | {strategy} | {protocol} | {pa} |")
    lines += [
        "",
        "| server | strategy | infer/s (tritonclient run) | server CPU per request (us) | "
        "wrong answers |",
        "|---|---|---:|---:|---:|",
    ]
    for (server, strategy), s in sorted(summary.items()):
        lines.append(f"| {server} | {strategy} | {s['client_infer_s']:.1f} | {s['cpu_us']:.0f} | "
                     f"{s['errors']} |")
    lines.append("")
    for strategy in STRATEGIES:
        mh, tr = summary.get(("modelhost", strategy)), summary.get(("triton", strategy))
        if not (mh and tr):
            continue
        parts = []
        for protocol in args.protocol:
            m, t = mh.get("pa", {}).get(protocol, {}), tr.get("pa", {}).get(protocol, {})
            if m.get("infer_s") and t.get("infer_s"):
                ratio = m["infer_s"] / t["infer_s"]
                parts.append(f"throughput (perf_analyzer, {protocol}) x{ratio:.2f} (target: at least "
                             f"x{TARGET}: {'met' if ratio >= TARGET else 'NOT met'})")
        parts.append(f"throughput (tritonclient run) x{mh['client_infer_s'] / tr['client_infer_s']:.2f}")
        parts.append(f"server CPU per request x{mh['cpu_us'] / tr['cpu_us']:.2f}")
        lines.append(f"- {strategy}, modelhost / Triton: " + "; ".join(parts))
    lines += [
        "",
        "Reading: modelhost's server CPU per request is about half of Triton's (no process "
        "boundary between the front end and the python model, and a gRPC polling thread reads "
        "every request that is ready before it runs the batch they make: requests of different "
        "sequences share one execute, host.scheduler.defer). That work is Python in one process, "
        "serialized by the interpreter lock: CPU per request times infer/s comes to about one "
        "core for modelhost, more for Triton, whose C++ front end and python stub run in "
        "parallel. With the load generator on the same two cores, modelhost's throughput is "
        "bounded by that one core rather than by its CPU per request; the gRPC stream costs "
        "less per request than unary calls (no call to set up and end per request), hence its "
        "higher figure.",
        "",
        f"- Date: {started:%Y-%m-%d %H:%M} UTC; run took {wall:.0f} s",
        f"- Machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory']}; shared with other "
        f"jobs (load average at the end {os.getloadavg()[0]:.2f}), and the client runs on the same "
        "cores: compare within one run only.",
        f"- Command: `python benchmarks/sequence_bench.py {' '.join(sys.argv[1:])}`".rstrip(),
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--passes", type=int, default=3,
                    help="the servers run one after the other, this many times (figures: medians)")
    ap.add_argument("--sequences", type=int, default=8)
    ap.add_argument("--length", type=int, default=100)
    ap.add_argument("--skip-triton", action="store_true")
    ap.add_argument("--protocol", choices=sorted(pvt.MODES), nargs="+", default=["grpc", "grpc-stream"],
                    help="perf_analyzer's protocols, each measured (the tritonclient run is always gRPC)")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--out", default=os.path.join(pvt.REPO_ROOT, "docs", "sequences_benchmark.md"))
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    pvt.ensure_anchor(need_triton=not args.skip_triton)
    repo, logdir = build_repository(), tempfile.mkdtemp(prefix="sequence_bench_logs_")
    started, t0 = _dt.datetime.now(_dt.timezone.utc), time.monotonic()
    rows: list[dict] = []
    pa_rows: list[dict] = []
    for _ in range(args.passes):  # alternate the servers, so that noise falls on both alike
        measure(pvt.modelhost_server(repo, logdir, args.python), args, rows, pa_rows)
        if not args.skip_triton:
            measure(pvt.triton_server(repo, logdir), args, rows, pa_rows)
    summary = summarize(rows, pa_rows)
    text = report(summary, args, started, time.monotonic() - t0, pvt.machine_info())
    print(text)
    if not args.no_write:
        with open(args.out, "w") as f:
            f.write(text)
        pvt.log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
