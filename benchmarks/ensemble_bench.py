#!/usr/bin/env python3
"""Ensemble benchmark: a 3-step ensemble of python identity models, modelhost vs the real NVIDIA
Triton (the anchor), same repository, one run.

The repository holds the anchor's python identity model (OUTPUT0 = INPUT0, FP32[-1]) three times
(`identity_py`, `identity_py_b`, `identity_py_c`), `ensemble_1` (one step: identity_py) and
`ensemble_3` (identity_py -> identity_py_b -> identity_py_c). perf_analyzer 2.41 drives each server
at concurrency 8 (HTTP by default) with 1024 elements per request, for each of:

- `identity_py`: the model called directly (C1),
- `ensemble_1`: the same model as the only step of an ensemble (E1),
- `ensemble_3`: three steps (E3).

With the throughput and latencies it reads the server's CPU time per request (user + system of the
server's process group from /proc, `cache_bench.group_cpu_seconds`), which the noise of a shared
machine disturbs much less than throughput. Per step:

- `E1 - C1`: what running a model as an ensemble step costs on top of calling it directly (the
  ensemble's own work plus the step request's pass through the host's stages): the target
  "at most 20 us of server CPU per ensemble step on top of the step's own model";
- `(E3 - E1) / 2`: what one more step costs, the step's model included;
- in process, with steps that answer at once (no model, no host stages), `(E3 - E1) / 2` is the
  ensemble scheduler's own CPU per step;
- in process, with the real models and no front end (`in_process_cost`, `--in-process-only`
  runs just that): `(E3 - E1) / 2 - C1`, what one more step costs beyond a direct request to its
  model, and `E1 - C1`, the ensemble request's own fixed cost.

The servers alternate over `--passes` (Triton, modelhost, Triton, ...); figures are medians.

    python benchmarks/ensemble_bench.py [--passes 2] [--concurrency 8] [--protocol http]
                                        [--skip-triton] [--out FILE.md]

Uses the helpers of benchmarks/perf_vs_triton.py (anchor set-up, servers, perf_analyzer).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import perf_vs_triton as pvt
from cache_bench import group_cpu_seconds

IDENTITIES = ["identity_py", "identity_py_b", "identity_py_c"]
MODELS = ["identity_py", "ensemble_1", "ensemble_3"]
# A loose stability bound: on a shared machine a strict one fails the run and leaves no figure
# (the CPU per request, read from the server, does not depend on it).
PA_FLAGS = ["--shape", "INPUT0:1024", "--measurement-interval", "3000", "--max-trials", "5",
            "--stability-percentage", "80"]
IO = ('input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
      'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n')


def build_repository(workdir: str) -> str:
    repo = os.path.join(workdir, "models")
    with open(os.path.join(pvt.ANCHOR_DIR, "config.pbtxt.in")) as f:
        template = f.read()
    for name in IDENTITIES:
        os.makedirs(os.path.join(repo, name, "1"))
        shutil.copyfile(os.path.join(pvt.ANCHOR_DIR, "model.py"), os.path.join(repo, name, "1", "model.py"))
        with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
            f.write(template.replace("@NAME@", name))
    for name, steps in (("ensemble_1", IDENTITIES[:1]), ("ensemble_3", IDENTITIES)):
        tensors = ["INPUT0", *[f"t{i}" for i in range(1, len(steps))], "OUTPUT0"]
        rendered = ", ".join(
            f'{{ model_name: "{m}" model_version: -1 input_map {{ key: "INPUT0" value: "{tensors[i]}" }} '
            f'output_map {{ key: "OUTPUT0" value: "{tensors[i + 1]}" }} }}' for i, m in enumerate(steps))
        os.makedirs(os.path.join(repo, name, "1"))
        with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
            f.write(f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 0\n{IO}'
                    f'ensemble_scheduling {{ step [ {rendered} ] }}\n')
    return repo


def successes(server: pvt.Server, model: str) -> int:
    code, body = pvt.http_get(f"http://127.0.0.1:{server.http_port}/v2/models/{model}/stats")
    stats = json.loads(body)["model_stats"][0] if code == 200 else {}
    return int(stats.get("inference_stats", {}).get("success", {}).get("count", 0))


def measure(server: pvt.Server, protocol: str, conc: int, resdir: str, tag: str) -> list[dict]:
    rows = []
    server.start()
    try:
        base = f"http://127.0.0.1:{server.http_port}"
        for model in MODELS:
            deadline = time.monotonic() + 60
            while pvt.http_get(f"{base}/v2/models/{model}/ready")[0] != 200:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{server.name}: {model} not ready")
                time.sleep(0.25)
        port = server.http_port if protocol == "http" else server.grpc_port
        for model in MODELS:
            before_n, before_cpu = successes(server, model), group_cpu_seconds(server.proc.pid)
            row = {"server": server.name, "model": model, "concurrency": conc}
            row.update(pvt.perf_analyzer(model, f"127.0.0.1:{port}", protocol,
                                         ["--concurrency-range", f"{conc}:{conc}", *PA_FLAGS],
                                         os.path.join(resdir, f"{tag}.{model}.csv"),
                                         os.path.join(resdir, f"{tag}.{model}.log")))
            cpu, n = group_cpu_seconds(server.proc.pid) - before_cpu, successes(server, model) - before_n
            row["cpu_us"] = cpu / n * 1e6 if n else None
            pvt.log(fmt(row))
            rows.append(row)
    finally:
        server.stop()
    return rows


def fmt(r: dict) -> str:
    if not r["ok"]:
        return f"{r['server']:10s} {r['model']:12s} FAILED {r['error']}"
    cpu = f"{r['cpu_us']:7.0f}" if r.get("cpu_us") else "      ?"
    return (f"{r['server']:10s} {r['model']:12s} {r['infer_s']:9.1f} infer/s  p50={r['p50_ms']:6.2f} ms  "
            f"p99={r['p99_ms']:6.2f} ms  cpu={cpu} us/req")


def median(rows: list[dict], server: str, model: str, key: str) -> float | None:
    values = [r[key] for r in rows if r["server"] == server and r["model"] == model
              and (r["ok"] or key == "cpu_us") and r.get(key) is not None]
    return statistics.median(values) if values else None


def report(rows: list[dict], servers: list[str]) -> list[str]:
    lines = ["| server | model | infer/s | p50 ms | p99 ms | server CPU us/request |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    for server in servers:
        for model in MODELS:
            vals = [median(rows, server, model, k) for k in ("infer_s", "p50_ms", "p99_ms", "cpu_us")]
            cpu = f"{vals[3]:.0f}" if vals[3] is not None else "?"
            if vals[0] is None:
                lines.append(f"| {server} | {model} | failed | | | {cpu} |")
                continue
            lines.append(f"| {server} | {model} | {vals[0]:.0f} | {vals[1]:.2f} | {vals[2]:.2f} | {cpu} |")
    lines.append("")
    for server in servers:
        c1, e1, e3 = (median(rows, server, m, "cpu_us") for m in MODELS)
        if None not in (c1, e1, e3):
            lines.append(f"- {server}: a step on top of its model (E1 - C1) = {e1 - c1:.0f} us; one more "
                         f"step, model included ((E3 - E1) / 2) = {(e3 - e1) / 2:.0f} us")
    mh, tr = median(rows, "modelhost", "ensemble_3", "infer_s"), median(rows, "triton", "ensemble_3", "infer_s")
    if mh and tr:
        lines.append(f"- ensemble_3 throughput, modelhost / Triton: {mh / tr:.2f}x (target >= 2x)")
    return lines


def machinery_cost(repo: str, requests: int = 5000) -> dict:
    """In process, CPU time of the ensemble's own work per step: the steps answer at once (no
    model, no host stages), so `(E3 - E1) / 2` is what the scheduler adds for one step, and
    `E1 - direct` what an ensemble request costs beyond a request to one model that does nothing."""
    import numpy as np

    from host.core import Host
    from host.inference import InferenceRequest, InferenceResponse, Tensor
    from host.options import ServerOptions

    host = Host(ServerOptions(model_repositories=[repo]))
    host.start()
    x = np.ones(1024, np.float32)
    out = Tensor("OUTPUT0", "FP32", [1024], x)
    host.ensembles.submit = lambda mv, request, callback: callback(InferenceResponse(outputs=[out]), True)

    def cpu_us(model: str) -> float:
        start = time.process_time()
        for _ in range(requests):
            host.infer(InferenceRequest(model, inputs={"INPUT0": Tensor("INPUT0", "FP32", [1024], x)}))
        return (time.process_time() - start) / requests * 1e6

    try:
        e1 = statistics.median(cpu_us("ensemble_1") for _ in range(3))
        e3 = statistics.median(cpu_us("ensemble_3") for _ in range(3))
    finally:
        host.stop()
    return {"ensemble_1": e1, "ensemble_3": e3, "per_step": (e3 - e1) / 2}


def in_process_cost(repo: str, requests: int = 4000) -> dict:
    """In process, the real python models, no front end: CPU per request of C1, E1 and E3."""
    import numpy as np

    from host.core import Host
    from host.inference import InferenceRequest, Tensor
    from host.options import ServerOptions

    host = Host(ServerOptions(model_repositories=[repo]))
    host.start()
    x = np.ones(1024, np.float32)

    def cpu_us(model: str, n: int = requests) -> float:
        start = time.process_time()
        for _ in range(n):
            host.infer(InferenceRequest(model, inputs={"INPUT0": Tensor("INPUT0", "FP32", [1024], x)}))
        return (time.process_time() - start) / n * 1e6

    models = ("identity_py", "ensemble_1", "ensemble_3")
    try:
        for model in models:
            cpu_us(model, 500)  # warm-up
        c1, e1, e3 = (statistics.median(cpu_us(m) for _ in range(3)) for m in models)
    finally:
        host.stop()
    return {"direct": c1, "ensemble_1": e1, "ensemble_3": e3,
            "step_beyond_direct": (e3 - e1) / 2 - c1, "ensemble_fixed": e1 - c1}


def _in_process_line(cost: dict) -> str:
    return (f"- in process, real models, no front end: identity_py {cost['direct']:.1f} us, "
            f"ensemble_1 {cost['ensemble_1']:.1f} us, ensemble_3 {cost['ensemble_3']:.1f} us of CPU "
            f"per request: one more step costs {cost['step_beyond_direct']:.1f} us beyond a direct "
            f"request to its model (target <= 20 us); the ensemble request's own fixed cost is "
            f"{cost['ensemble_fixed']:.1f} us")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--protocol", choices=["http", "grpc"], default="http")
    ap.add_argument("--skip-triton", action="store_true")
    ap.add_argument("--out", help="also write the table to this markdown file")
    ap.add_argument("--in-process-only", action="store_true",
                    help="only the in-process figures (no servers, no perf_analyzer, no anchor)")
    args = ap.parse_args()
    if args.in_process_only:
        repo = build_repository(tempfile.mkdtemp(prefix="ensemble_bench_"))
        print(f"ensemble_bench {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, in process; "
              f"machine: {pvt.machine_info()}")
        print(_in_process_line(in_process_cost(repo)))
        return 0
    pvt.ensure_anchor(need_triton=not args.skip_triton)
    workdir = tempfile.mkdtemp(prefix="ensemble_bench_")
    repo = build_repository(workdir)
    pvt.MODEL = "identity_py"  # what Server.start waits for
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows: list[dict] = []
    servers = ["modelhost"] if args.skip_triton else ["triton", "modelhost"]
    for p in range(args.passes):
        for name in servers:
            server = (pvt.triton_server(repo, workdir) if name == "triton"
                      else pvt.modelhost_server(repo, workdir, sys.executable))
            rows.extend(measure(server, args.protocol, args.concurrency, workdir, f"{name}.p{p}"))
    title = (f"ensemble_bench {started}, {args.protocol}, concurrency {args.concurrency}, "
             f"{args.passes} pass(es), medians; machine: {pvt.machine_info()}")
    lines = [title, "", *report(rows, servers)]
    cost = machinery_cost(repo)
    lines.append(f"- in process, steps answered at once: ensemble_1 {cost['ensemble_1']:.1f} us, "
                 f"ensemble_3 {cost['ensemble_3']:.1f} us of CPU per request: the scheduler's own "
                 f"work per step = {cost['per_step']:.1f} us")
    lines.append(_in_process_line(in_process_cost(repo)))
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
