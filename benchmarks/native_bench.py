#!/usr/bin/env python3
"""perf_analyzer: one identity model as a native backend and as a python-backend model, in
modelhost and in the real NVIDIA Triton, side by side in one run.

- `identity_native`: the project's identity test backend (tests/native/identity.c, built with
  -DIDENTITY_LEAN: copy only) as `<repo>/identity_native/libtriton_identity.so`, so both
  servers load the very same library file from the model folder;
- `identity_py`: the anchor's python identity model (the model of benchmarks/perf_vs_triton.py).

Both are OUTPUT0 = INPUT0, FP32, request shape [1024], one CPU instance, no batching. Each pass
starts modelhost, measures both models, stops it, then does the same with Triton (the servers
never run at the same time). Prints a table and writes docs/native.md.

    python benchmarks/native_bench.py [--passes 2] [--concurrency 8] [--protocol http grpc]
                                      [--skip-triton] [--out docs/native.md] [--no-write]

Reuses benchmarks/perf_vs_triton.py for the servers and perf_analyzer (same flags, same anchor).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import perf_vs_triton as pvt  # noqa: E402

REPO_ROOT = pvt.REPO_ROOT
NATIVE, PYTHON = "identity_native", "identity_py"
NATIVE_CONFIG = """name: "identity_native"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


def build_repository(python: str) -> str:
    repo = tempfile.mkdtemp(prefix="native_bench_repo_")
    for name in (NATIVE, PYTHON):
        os.makedirs(os.path.join(repo, name, "1"))
    shutil.copyfile(os.path.join(pvt.ANCHOR_DIR, "model.py"), os.path.join(repo, PYTHON, "1", "model.py"))
    with open(os.path.join(pvt.ANCHOR_DIR, "config.pbtxt.in")) as f:
        cfg = f.read().replace("@NAME@", PYTHON)
    with open(os.path.join(repo, PYTHON, "config.pbtxt"), "w") as f:
        f.write(cfg)
    with open(os.path.join(repo, NATIVE, "config.pbtxt"), "w") as f:
        f.write(NATIVE_CONFIG)
    # Compiled against modelhost's headers, with the installed package's helper.
    lib = os.path.join(repo, NATIVE, "libtriton_identity.so")
    code = ("import sys; from pathlib import Path; from host.native.testing import build_library; "
            "build_library(Path(sys.argv[1]), Path(sys.argv[2]), ['-DIDENTITY_LEAN'])")
    subprocess.run([python, "-c", code, os.path.join(REPO_ROOT, "tests", "native", "identity.c"), lib],
                   check=True, cwd=REPO_ROOT)
    return repo


def wait_ready(server: pvt.Server, model: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pvt.http_get(f"http://127.0.0.1:{server.http_port}/v2/models/{model}/ready")[0] == 200:
            return
        time.sleep(0.25)
    raise RuntimeError(f"{server.name}: model {model} not ready:\n{server.log_tail()}")


CLK_TCK = os.sysconf("SC_CLK_TCK")


def group_cpu_seconds(pgid: int) -> float:
    """utime + stime of every live process in the server's process group (python-backend stubs
    and gunicorn workers included: the servers start in their own session)."""
    total = 0
    for stat in os.listdir("/proc"):
        if not stat.isdigit():
            continue
        try:
            with open(f"/proc/{stat}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # after the name: state ppid pgrp ... utime(14th field overall) stime(15th)
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


def served(server: pvt.Server, model: str) -> int:
    """Requests the model has answered so far (success + failure), from the statistics extension."""
    code, body = pvt.http_get(f"http://127.0.0.1:{server.http_port}/v2/models/{model}/stats")
    if code != 200:
        return -1
    n = 0
    for m in json.loads(body).get("model_stats", []):
        stats = m.get("inference_stats", {})
        n += int(stats.get("success", {}).get("count", 0)) + int(stats.get("fail", {}).get("count", 0))
    return n


def measure(server: pvt.Server, models: list[str], protocols: list[str], concurrency: list[int],
            resdir: str, pass_no: int) -> list[dict]:
    rows = []
    for model in models:
        pvt.MODEL = model  # what run_pa drives
        for protocol in protocols:
            for conc in concurrency:
                cpu0, n0 = group_cpu_seconds(server.proc.pid), served(server, model)
                row = pvt.run_pa(server, protocol, conc, resdir, f"p{pass_no}.{server.name}.{model}.{protocol}")
                cpu1, n1 = group_cpu_seconds(server.proc.pid), served(server, model)
                row.update(model=model, **{"pass": pass_no})
                row["cpu_us"] = (cpu1 - cpu0) / (n1 - n0) * 1e6 if n0 >= 0 and n1 > n0 else None
                pvt.log(f"{server.name:9s} {model:15s} {protocol:11s} c={conc}: " + (
                    f"{row['infer_s']:.1f} infer/s, p50 {row['p50_ms']:.2f} ms, p99 {row['p99_ms']:.2f} ms, "
                    f"server CPU {row['cpu_us'] or 0:.0f} us/request" if row["ok"] else row["error"]))
                rows.append(row)
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    keys = []
    for r in rows:
        k = (r["server"], r["model"], r["protocol"], r["concurrency"])
        if k not in keys:
            keys.append(k)
    out = []
    for k in keys:
        good = [r for r in rows if (r["server"], r["model"], r["protocol"], r["concurrency"]) == k and r["ok"]]
        s = dict(zip(("server", "model", "protocol", "concurrency"), k), ok=len(good),
                 passes=sum(1 for r in rows if (r["server"], r["model"], r["protocol"], r["concurrency"]) == k))
        if good:
            s.update(infer_s=statistics.median(r["infer_s"] for r in good),
                     lo=min(r["infer_s"] for r in good), hi=max(r["infer_s"] for r in good),
                     p50_ms=statistics.median(r["p50_ms"] for r in good),
                     p99_ms=statistics.median(r["p99_ms"] for r in good))
            cpu = [r["cpu_us"] for r in good if r.get("cpu_us")]
            s["cpu_us"] = statistics.median(cpu) if cpu else None
        out.append(s)
    return out


def find(summary, server, model, protocol, conc):
    return next((s for s in summary if (s["server"], s["model"], s["protocol"], s["concurrency"])
                 == (server, model, protocol, conc) and "infer_s" in s), None)


def table(summary: list[dict]) -> list[str]:
    lines = ["| server | model | protocol | concurrency | infer/s (median) | range | p50 ms | p99 ms "
             "| server CPU us/request | passes ok |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for s in summary:
        vals = (f"{s['infer_s']:.1f} | {s['lo']:.0f}-{s['hi']:.0f} | {s['p50_ms']:.2f} | {s['p99_ms']:.2f} | "
                + (f"{s['cpu_us']:.0f}" if s.get("cpu_us") else "-")
                if "infer_s" in s else "failed | - | - | - | -")
        lines.append(f"| {s['server']} | {s['model']} | {s['protocol']} | {s['concurrency']} | {vals} | "
                     f"{s['ok']}/{s['passes']} |")
    lines.append("")
    for s in summary:
        if s["server"] != "modelhost" or "infer_s" not in s:
            continue
        tr = find(summary, "triton", s["model"], s["protocol"], s["concurrency"])
        if not tr:
            continue
        target = 1.0 if s["model"] == NATIVE else 0.6
        cpu = (f"server CPU per request x{s['cpu_us'] / tr['cpu_us']:.2f} of Triton's (target: at most "
               f"x{target:.1f})" if s.get("cpu_us") and tr.get("cpu_us") else "server CPU: not measured")
        lines.append(f"- {s['model']}, {s['protocol']} c={s['concurrency']}: {cpu}; infer/s "
                     f"x{s['infer_s'] / tr['infer_s']:.2f}; p99 {s['p99_ms']:.2f} ms vs Triton's {tr['p99_ms']:.2f} ms")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[8])
    ap.add_argument("--protocol", nargs="+", default=["http"], choices=sorted(pvt.MODES))
    ap.add_argument("--skip-triton", action="store_true")
    ap.add_argument("--python", default=sys.executable, help="the Python that runs modelhost")
    ap.add_argument("--out", default=os.path.join(REPO_ROOT, "docs", "native.md"))
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)

    pvt.ensure_anchor(need_triton=not args.skip_triton)
    started = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    repo = build_repository(args.python)
    resdir = tempfile.mkdtemp(prefix="native_bench_results_")
    rows: list[dict] = []
    for p in range(1, args.passes + 1):
        servers = [pvt.modelhost_server(repo, resdir, args.python)]
        if not args.skip_triton:
            servers.append(pvt.triton_server(repo, resdir))
        if p % 2 == 0:
            servers.reverse()  # alternate who goes first, so drifting load falls on both
        for server in servers:
            pvt.MODEL = NATIVE  # Server.start waits for this model
            server.start()
            try:
                wait_ready(server, PYTHON)
                models = [NATIVE, PYTHON] if p % 2 else [PYTHON, NATIVE]
                rows += measure(server, models, args.protocol, args.concurrency, resdir, p)
            finally:
                server.stop()
    summary = summarize(rows)
    lines = table(summary)
    print("\n".join(lines))
    machine = pvt.machine_info()
    if not args.no_write:
        perf_doc = os.path.basename(args.out) == "performance.md"
        md = ["# Native Triton backends in modelhost", "",
              "Written by `benchmarks/native_bench.py`; regenerate rather than edit. How native backends "
              "and caches work is in the sections after the figures.", "",
              "## Benchmark: native vs python identity, modelhost vs Triton", ""] if not perf_doc else [
              "# Performance: modelhost vs Triton, per request", "",
              "The table is written by `benchmarks/native_bench.py --out docs/performance.md`; regenerate "
              "rather than edit. The sections after it (from \"## How it works\") are kept.", "",
              "## Benchmark: CPU per request, throughput and latency", "",
              "Server CPU per request is the utime + stime of the server's whole process group during a "
              "perf_analyzer run, divided by the requests the model served in it (the statistics "
              "extension's success + fail counts).", ""]
        md += [
              "The same identity model (`OUTPUT0 = INPUT0`, FP32, request shape [1024], one CPU instance) "
              "as a native backend (`identity_native`: tests/native/identity.c built with -DIDENTITY_LEAN, "
              "one library file loaded by both servers from the model folder) and as a python-backend "
              "model (`identity_py`, the anchor's model.py). perf_analyzer, closed loop, flags "
              f"`{' '.join(pvt.PA_FLAGS)}`; the servers run one at a time, median over passes.", "",
              *lines, "",
              f"- Date: {started}; run took {time.monotonic() - t0:.0f} s; passes: {args.passes}",
              f"- Machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory']}, {machine['os']}; "
              f"shared with other jobs (load average {load0:.2f} at start, {os.getloadavg()[0]:.2f} at end), "
              "and perf_analyzer runs on the same cores, so the figures are noisy: compare within one run only.",
              f"- Command: `python benchmarks/native_bench.py {' '.join(argv if argv is not None else sys.argv[1:])}`",
              ""]
        old = ""
        if os.path.exists(args.out):
            with open(args.out) as f:
                old = f.read()
        marker = "\n## How it works"
        rest = old[old.index(marker):] if marker in old else ""
        with open(args.out, "w") as f:
            f.write("\n".join(md) + rest)
        pvt.log(f"wrote {args.out}")
    shutil.rmtree(repo, ignore_errors=True)
    return 0 if all(s.get("ok") for s in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
