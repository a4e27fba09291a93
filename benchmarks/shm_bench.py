#!/usr/bin/env python3
"""System shared memory vs request bodies, modelhost vs the real Triton, with memcpy as the floor.

For tensors of 4 KiB, 1 MiB, 16 MiB and 64 MiB (FP32, the python identity model of
perf_vs_triton.py), perf_analyzer measures at concurrency 1:

- ``shm``       inputs and outputs in system shared memory (``--shared-memory system``), over HTTP
- ``http-body`` the binary HTTP body (inputs and outputs in the request/response)
- ``grpc-raw``  gRPC raw_input_contents / raw_output_contents

against modelhost (``--allow-client-shm=true``) and against Triton, in one run; the floor is one
``memcpy`` of the tensor (numpy.copyto into a pre-touched buffer), timed in this process.
Prints a table and writes docs/shm_benchmarks.md.

    python benchmarks/shm_bench.py [--sizes 4K 1M 16M 64M] [--modes shm http-body grpc-raw]
                                   [--skip-triton] [--no-write]
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import perf_vs_triton as pvt  # noqa: E402 - the servers and anchor set-up live there, once

SIZES = {"4K": 4 << 10, "1M": 1 << 20, "16M": 16 << 20, "64M": 64 << 20}
MODES = {  # mode -> (perf_analyzer protocol, extra flags given the tensor's byte size)
    "shm": ("http", lambda n: ["--shared-memory", "system", "--output-shared-memory-size", str(n)]),
    "shm-grpc": ("grpc", lambda n: ["--shared-memory", "system", "--output-shared-memory-size", str(n)]),
    "http-body": ("http", lambda n: []),
    "grpc-raw": ("grpc", lambda n: []),
}
PA_FLAGS = ["--measurement-interval", "1500", "--max-trials", "8", "--stability-percentage", "80"]
PA_TIMEOUT = 240


def memcpy_ms(nbytes: int, repeats: int = 30) -> float:
    src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # touch every page first: the floor is the copy, not page faults
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def run_pa(server: pvt.Server, mode: str, size: str, resdir: str) -> dict:
    protocol, flags = MODES[mode]
    nbytes = SIZES[size]
    url = f"127.0.0.1:{server.http_port if protocol == 'http' else server.grpc_port}"
    tag = f"{server.name}.{mode}.{size}"
    row = {"server": server.name, "mode": mode, "size": size}
    row.update(pvt.perf_analyzer(
        pvt.MODEL, url, protocol,
        ["--shape", f"INPUT0:{nbytes // 4}", "--concurrency-range", "1:1", *flags(nbytes), *PA_FLAGS],
        os.path.join(resdir, tag + ".csv"), os.path.join(resdir, tag + ".log"), timeout=PA_TIMEOUT))
    return row


def _medians(passes: list[dict]) -> list[dict]:
    """One row per (server, mode, size): medians over the passes that measured."""
    groups: dict[tuple, list[dict]] = {}
    for row in passes:
        groups.setdefault((row["server"], row["mode"], row["size"]), []).append(row)
    out = []
    for (server, mode, size), rows in groups.items():
        ok = [r for r in rows if r["ok"]]
        if not ok:
            out.append(rows[-1])
            continue
        out.append({"server": server, "mode": mode, "size": size, "ok": True,
                    **{k: statistics.median(r[k] for r in ok) for k in ("infer_s", "p50_ms", "p99_ms")},
                    "n": len(ok)})
    return out


def table(rows: list[dict], floors: dict[str, float], sizes: list[str], modes: list[str],
          servers: list[str]) -> list[str]:
    by = {(r["server"], r["mode"], r["size"]): r for r in rows}
    lines = ["| size | memcpy (ms) | server | mode | infer/s | p50 (ms) | p99 (ms) | p50 / memcpy |",
             "|---|---|---|---|---|---|---|---|"]
    for size in sizes:
        for server in servers:
            for mode in modes:
                r = by.get((server, mode, size))
                if r is None:
                    continue
                if not r["ok"]:
                    lines.append(f"| {size} | {floors[size]:.3f} | {server} | {mode} | failed: {r['error'][:80]} |||")
                    continue
                lines.append(f"| {size} | {floors[size]:.3f} | {server} | {mode} | {r['infer_s']:.1f} | "
                             f"{r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {r['p50_ms'] / floors[size]:.2f}x |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    ap.add_argument("--modes", nargs="+", default=["shm", "http-body", "grpc-raw"], choices=list(MODES))
    ap.add_argument("--skip-triton", action="store_true")
    ap.add_argument("--passes", type=int, default=3, help="alternating passes; medians are reported")
    ap.add_argument("--out", default=os.path.join(pvt.REPO_ROOT, "docs", "shm_benchmarks.md"))
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)

    pvt.ensure_anchor(need_triton=not args.skip_triton)
    started = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    t0 = time.monotonic()
    repo = pvt.build_repository()
    resdir = tempfile.mkdtemp(prefix="shm_bench_")
    passes: list[dict] = []
    copies: dict[str, list[float]] = {size: [] for size in args.sizes}
    servers = []
    if not args.skip_triton:
        servers.append(pvt.triton_server(repo, resdir))
    mh = pvt.modelhost_server(repo, resdir, sys.executable)
    # Triton takes a 64 MiB tensor plus its JSON header in one HTTP body; so must modelhost
    mh.argv += ["--allow-client-shm=true", "--http-max-input-size", str(256 << 20)]
    servers.append(mh)
    # Passes alternate the servers (Triton, modelhost, Triton, ...) and re-measure the memcpy
    # floor each time, so that the noise of a shared machine falls on all of them alike.
    for n in range(args.passes):
        for size in args.sizes:
            copies[size].append(memcpy_ms(SIZES[size]))
        for server in servers:
            server.start()
            try:
                for size in args.sizes:
                    for mode in args.modes:
                        row = run_pa(server, mode, size, resdir)
                        passes.append(row)
                        pvt.log(f"pass {n + 1} {server.name:9s} {mode:9s} {size:>4s} " + (
                            f"{row['infer_s']:8.1f} infer/s p50 {row['p50_ms']:8.3f} ms" if row["ok"]
                            else "FAILED " + row["error"]))
            finally:
                server.stop()
    floors = {size: statistics.median(v) for size, v in copies.items()}
    rows = _medians(passes)
    lines = table(rows, floors, args.sizes, args.modes, [s.name for s in servers])
    print("\n".join(lines))
    if not args.no_write:
        machine = pvt.machine_info()
        doc = ["# Shared-memory benchmark", "",
               f"Generated by `python benchmarks/shm_bench.py` on {started} "
               f"({time.monotonic() - t0:.0f} s).", "",
               f"Machine: {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores, "
               f"{machine.get('memory', '?')}; shared with other work while it ran, so expect noise.", "",
               "Model: the python identity model (`identity_py`, FP32[-1]) in both servers; perf_analyzer "
               f"at concurrency 1; medians of {args.passes} passes that alternate the servers (failed "
               "measurements left out). `p50 / memcpy` is the median round trip over the median time "
               "of one `memcpy` of the tensor, re-measured at the start of every pass.",
               "", *lines, ""]
        with open(args.out, "w") as f:
            f.write("\n".join(doc))
        pvt.log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
