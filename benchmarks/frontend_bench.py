#!/usr/bin/env python3
"""Scaling of the serving path with cores: one process against front-end processes
(`--frontend-processes N`, docs/process_model.md), with `taskset` choosing the cores.

The models of benchmarks/native_bench.py (the native identity backend and the python identity,
FP32[1024], one instance, no batching). Each configuration is a CPU set (`taskset -c`) and a
front-end count; every pass starts each configuration's server in turn (the order alternating
between passes), measures each model and protocol with perf_analyzer, and stops it. Triton runs
under the same CPU sets for reference unless --skip-triton. Reports infer/s, p50/p99 and server
CPU per request (utime+stime of the server's process group / requests served), and the scaling
of each configuration against one process on the first CPU set.

    python benchmarks/frontend_bench.py [--passes 2] [--cpus 0 0,1] [--frontends 1 2 3]
                                        [--concurrency 8] [--protocol http grpc] [--skip-triton]
                                        [--out docs/frontend_scaling.md] [--no-write]

perf_analyzer runs on the same machine and is not pinned: on a small machine it competes with
the server for the cores, which limits what any server can show.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import native_bench as nb  # noqa: E402
import perf_vs_triton as pvt  # noqa: E402

REPO_ROOT = pvt.REPO_ROOT


def configurations(cpu_sets: list[str], frontends: list[int], triton: bool) -> list[tuple[str, str, int]]:
    """(server, cpus, front ends): one process on every CPU set; front ends where there are at
    least two CPUs to spread over."""
    out = []
    for cpus in cpu_sets:
        count = len(cpus.split(","))
        for n in frontends:
            if n == 1 or count > 1:
                out.append(("modelhost", cpus, n))
        if triton:
            out.append(("triton", cpus, 0))
    return out


def wakeup_cost(cpus: tuple[int, int], rounds: int = 20000) -> tuple[float, float]:
    """A message ping-ponged between two processes over a Unix socket pair, each pinned to one
    of `cpus`: (wall us per round trip, CPU us per round trip, both processes). Every request that
    crosses from a front end to the engine and back pays at least this."""
    import socket

    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        os.sched_setaffinity(0, {cpus[1]})
        for _ in range(rounds):
            b.sendall(b.recv(64))
        os._exit(0)
    os.sched_setaffinity(0, {cpus[0]})
    c0, t0 = os.times(), time.perf_counter()
    for _ in range(rounds):
        a.sendall(b"x" * 48)
        a.recv(64)
    wall = time.perf_counter() - t0
    os.waitpid(pid, 0)
    c1 = os.times()
    os.sched_setaffinity(0, os.sched_getaffinity(0) | set(cpus))
    cpu = (c1.user + c1.system - c0.user - c0.system) + (c1.children_user + c1.children_system
                                                          - c0.children_user - c0.children_system)
    a.close()
    b.close()
    return wall / rounds * 1e6, cpu / rounds * 1e6


def make_server(kind: str, cpus: str, frontends: int, repo: str, resdir: str, python: str) -> pvt.Server:
    server = (pvt.triton_server(repo, resdir) if kind == "triton"
              else pvt.modelhost_server(repo, resdir, python))
    if kind == "modelhost" and frontends > 1:
        server.argv += ["--frontend-processes", str(frontends)]
    server.argv = ["taskset", "-c", cpus, *server.argv]
    server.name = f"{kind}[cpus {cpus}" + (f", {frontends} fe]" if kind == "modelhost" else "]")
    return server


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--cpus", nargs="+", default=["0", "0,1"], help="CPU sets (taskset -c), first is the base")
    ap.add_argument("--frontends", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[8])
    ap.add_argument("--protocol", nargs="+", default=["http", "grpc"], choices=sorted(pvt.MODES))
    ap.add_argument("--models", nargs="+", default=[nb.NATIVE, nb.PYTHON], choices=[nb.NATIVE, nb.PYTHON])
    ap.add_argument("--skip-triton", action="store_true")
    ap.add_argument("--python", default=sys.executable, help="the Python that runs modelhost")
    ap.add_argument("--out", default=os.path.join(REPO_ROOT, "docs", "frontend_scaling.md"))
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)

    pvt.ensure_anchor(need_triton=not args.skip_triton)
    allowed = sorted(os.sched_getaffinity(0))
    wakeups = [(pair, *wakeup_cost(pair)) for pair in ((allowed[0], allowed[0]), (allowed[0], allowed[-1]))
               if len(allowed) > 1 or pair[0] == pair[1]]
    for pair, wall, cpu in wakeups:
        pvt.log(f"process ping-pong on CPUs {pair}: {wall:.1f} us per round trip, {cpu:.1f} us of CPU")
    started = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    repo = nb.build_repository(args.python)
    resdir = tempfile.mkdtemp(prefix="frontend_bench_results_")
    configs = configurations(args.cpus, args.frontends, not args.skip_triton)
    rows: list[dict] = []
    for p in range(1, args.passes + 1):
        order = configs if p % 2 else list(reversed(configs))
        for kind, cpus, n in order:
            server = make_server(kind, cpus, n, repo, resdir, args.python)
            pvt.MODEL = args.models[0]
            server.start()
            try:
                for model in args.models:
                    nb.wait_ready(server, model)
                for row in nb.measure(server, args.models, args.protocol, args.concurrency, resdir, p):
                    row.update(kind=kind, cpus=cpus, frontends=n)
                    rows.append(row)
            finally:
                server.stop()
    lines = table(rows, args)
    print("\n".join(lines))
    if not args.no_write:
        machine = pvt.machine_info()
        md = ["# Front-end processes: scaling with cores", "",
              "Written by `benchmarks/frontend_bench.py`; regenerate rather than edit. The design is in "
              "[process_model.md](process_model.md).", "",
              "The identity models of [performance.md](performance.md) (FP32[1024], one instance, no "
              "batching). Each server runs under `taskset -c CPUS`; modelhost with one process or with "
              "`--frontend-processes N` (N front ends and the engine). perf_analyzer, closed loop, flags "
              f"`{' '.join(pvt.PA_FLAGS)}`, runs on the same cores (not pinned). Median over passes; "
              "scaling is infer/s over one modelhost process on the first CPU set, same model, protocol "
              "and concurrency.", "",
              *lines, "",
              "What a request's trip from a front end to the engine and back costs at least on this "
              "machine: one message ping-ponged between two processes over a Unix socket pair "
              "(`wakeup_cost` in the script):", "",
              "| CPUs of the two processes | wall us per round trip | CPU us per round trip (both) |",
              "| --- | ---: | ---: |",
              *[f"| {a} and {b} | {wall:.1f} | {cpu:.1f} |" for (a, b), wall, cpu in wakeups], "",
              f"- Date: {started}; run took {time.monotonic() - t0:.0f} s; passes: {args.passes}",
              f"- Machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory']}, {machine['os']}; "
              f"shared with other jobs (load average {load0:.2f} at start, {os.getloadavg()[0]:.2f} at end).",
              f"- Command: `python benchmarks/frontend_bench.py {' '.join(argv if argv is not None else sys.argv[1:])}`",
              ""]
        with open(args.out, "w") as f:
            f.write("\n".join(md))
        pvt.log(f"wrote {args.out}")
    shutil.rmtree(repo, ignore_errors=True)
    return 0 if all(r.get("ok") for r in rows) else 1


def table(rows: list[dict], args) -> list[str]:
    def median(values: list) -> float | None:
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    keys = []
    for r in rows:
        k = (r["kind"], r["cpus"], r["frontends"], r["model"], r["protocol"], r["concurrency"])
        if k not in keys:
            keys.append(k)
    summary = {}
    for k in keys:
        good = [r for r in rows if (r["kind"], r["cpus"], r["frontends"], r["model"], r["protocol"],
                                    r["concurrency"]) == k and r["ok"]]
        summary[k] = {"n": len(good), "infer_s": median([r["infer_s"] for r in good]),
                      "p50": median([r["p50_ms"] for r in good]), "p99": median([r["p99_ms"] for r in good]),
                      "cpu": median([r.get("cpu_us") for r in good])}
    base_cpus = args.cpus[0]
    lines = ["| server | cpus | front ends | model | protocol | concurrency | infer/s | p50 ms | p99 ms "
             "| server CPU us/request | scaling vs 1 process on cpus " + base_cpus + " |",
             "| --- | --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for k in sorted(keys, key=lambda k: (k[3], k[4], k[5], k[0] != "modelhost", len(k[1]), k[2])):
        kind, cpus, n, model, protocol, conc = k
        s = summary[k]
        if s["infer_s"] is None:
            lines.append(f"| {kind} | {cpus} | {n or '-'} | {model} | {protocol} | {conc} | failed | | | | |")
            continue
        base = summary.get(("modelhost", base_cpus, 1, model, protocol, conc), {}).get("infer_s")
        scale = f"x{s['infer_s'] / base:.2f}" if base else "-"
        cpu = f"{s['cpu']:.0f}" if s["cpu"] is not None else "-"
        lines.append(f"| {kind} | {cpus} | {n or '-'} | {model} | {protocol} | {conc} | {s['infer_s']:.0f} "
                     f"| {s['p50']:.2f} | {s['p99']:.2f} | {cpu} | {scale} |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
