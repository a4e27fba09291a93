#!/usr/bin/env python3
"""Python model instances: thread mode vs process mode (docs/process_model.md), against Triton's
python backend, on one CPU-bound model, in one run.

Models (one repository, all OUTPUT0 = f(INPUT0), INT32 [1], no batching):
- `cpu_thread_1`, `cpu_thread_2`: a pure-Python loop (about LOOP iterations per request) with
  `instance_group { count: 1 | 2 }`, in-process (EXECUTION_MODE thread, the default);
- `cpu_process_1`, `cpu_process_2`: the same with EXECUTION_MODE process (a stub process each);
- `ident_thread`, `ident_process`: FP32 [1024] identity, for the per-request cost of process mode
  at concurrency 1.
Triton (the anchor, python backend: one stub process per instance, always) serves the same model
file as `cpu_thread_1` / `cpu_thread_2` (it ignores EXECUTION_MODE).

Every server runs under `taskset -c 0` and then `taskset -c 0,1` (its stubs inherit the mask);
perf_analyzer drives the CPU models at concurrency 2 (so two instances can both be busy) and the
identity models at concurrency 1, over HTTP. Server CPU per request is the utime+stime of the
server's whole process tree (stub processes included, read from /proc) during the run, divided by
the requests served.

    python benchmarks/python_instances_bench.py [--loop 60000] [--skip-triton] [--out FILE]

Triton listens on 19800-19802 (this helper's port range); ROOT=/work/triton-anchor by default.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import shutil
import sys
import tempfile
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("ROOT", "/work/triton-anchor")
import perf_vs_triton as pvt

PA_FLAGS = ["--measurement-interval", "3000", "--max-trials", "3", "--stability-percentage", "999"]
TRITON_PORTS = (19800, 19801, 19802)
HZ = os.sysconf("SC_CLK_TCK")

CPU_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils

LOOP = {loop}

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = int(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0])
            acc = 0
            for i in range(LOOP):  # pure Python: holds the GIL the whole time
                acc = (acc + i * x) % 1000003
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", np.array([acc], dtype=np.int32))]))
        return out
'''

IDENT_MODEL = '''
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
'''


def _config(name: str, datatype: str, dims: int, count: int, mode: str | None) -> str:
    text = f'''
    name: "{name}"
    backend: "python"
    max_batch_size: 0
    input [ {{ name: "INPUT0" data_type: {datatype} dims: [ {dims} ] }} ]
    output [ {{ name: "OUTPUT0" data_type: {datatype} dims: [ {dims} ] }} ]
    instance_group [ {{ count: {count} kind: KIND_CPU }} ]
    '''
    if mode:
        text += f'parameters {{ key: "EXECUTION_MODE" value {{ string_value: "{mode}" }} }}\n'
    return textwrap.dedent(text)


def build(workdir: str, loop: int) -> tuple[str, str]:
    mh, tr = os.path.join(workdir, "modelhost"), os.path.join(workdir, "triton")
    models = {}
    for count in (1, 2):
        for mode in ("thread", "process"):
            models[(mh, f"cpu_{mode}_{count}")] = (_config(f"cpu_{mode}_{count}", "TYPE_INT32", 1, count, mode),
                                                   CPU_MODEL.format(loop=loop))
        models[(tr, f"cpu_thread_{count}")] = (_config(f"cpu_thread_{count}", "TYPE_INT32", 1, count, None),
                                               CPU_MODEL.format(loop=loop))
    for mode in ("thread", "process"):
        models[(mh, f"ident_{mode}")] = (_config(f"ident_{mode}", "TYPE_FP32", 1024, 1, mode), IDENT_MODEL)
    for (repo, name), (config, code) in models.items():
        os.makedirs(os.path.join(repo, name, "1"))
        with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
            f.write(config)
        with open(os.path.join(repo, name, "1", "model.py"), "w") as f:
            f.write(code)
    return mh, tr


def tree_cpu_seconds(root: int) -> float:
    """utime+stime of `root` and every live descendant (children's stubs included)."""
    parent, times = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry)
        parent[pid] = int(fields[1])
        times[pid] = int(fields[11]) + int(fields[12])
    total, stack = 0, [root]
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    while stack:
        pid = stack.pop()
        total += times.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total / HZ


def served(server: pvt.Server, model: str) -> int:
    """Requests the server counted for `model` (its statistics extension): exact, warm-up included."""
    import json
    code, body = pvt.http_get(f"http://127.0.0.1:{server.http_port}/v2/models/{model}/stats")
    if code != 200:
        return 0
    return sum(int(s["inference_stats"]["success"]["count"]) for s in json.loads(body)["model_stats"])


def measure(server: pvt.Server, model: str, conc: int, resdir: str, cpus: str) -> dict:
    before, n0 = tree_cpu_seconds(server.proc.pid), served(server, model)
    shape = "INPUT0:1024" if model.startswith("ident") else "INPUT0:1"
    tag = f"{server.name}.{model}.{cpus.replace(',', '_')}"
    row = pvt.perf_analyzer(model, f"127.0.0.1:{server.http_port}", "http",
                            ["--shape", shape, "--concurrency-range", f"{conc}:{conc}", *PA_FLAGS],
                            os.path.join(resdir, tag + ".csv"), os.path.join(resdir, tag + ".log"))
    cpu = tree_cpu_seconds(server.proc.pid) - before
    n = served(server, model) - n0
    row.update(server=server.name, model=model, cpus=cpus, concurrency=conc, cpu_s=cpu, served=n)
    row["cpu_us_per_req"] = (cpu / n * 1e6) if n else None
    return row


def start(name: str, argv: list[str], env: dict, cwd: str, http: int, grpc: int, logdir: str,
          first_model: str) -> pvt.Server:
    pvt.MODEL = first_model  # Server.start waits until this model is ready
    server = pvt.Server(name, argv, env, cwd, http, grpc, logdir)
    server.start()
    return server


def modelhost(repo: str, cpus: str, logdir: str) -> pvt.Server:
    base = pvt.modelhost_server(repo, logdir, sys.executable)
    argv = ["taskset", "-c", cpus] + base.argv
    return start(f"modelhost[{cpus}]", argv, base.env, base.cwd, base.http_port, base.grpc_port,
                 logdir, "ident_process")


def triton(repo: str, cpus: str, logdir: str) -> pvt.Server:
    base = pvt.triton_server(repo, logdir)
    http, grpc, metrics = TRITON_PORTS
    argv = [a for a in base.argv if not a.split("=")[0].endswith(("-port",))]
    argv += [f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}"]
    return start(f"triton[{cpus}]", ["taskset", "-c", cpus] + argv, base.env, base.cwd, http, grpc,
                 logdir, "cpu_thread_2")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loop", type=int, default=60000, help="loop iterations per request")
    ap.add_argument("--skip-triton", action="store_true")
    ap.add_argument("--out", help="also write the markdown table to this file")
    args = ap.parse_args()
    started = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    work = tempfile.mkdtemp(prefix="pyinst_bench_")
    resdir = os.path.join(work, "results")
    os.makedirs(resdir)
    mh_repo, tr_repo = build(work, args.loop)
    rows = []
    try:
        for cpus in ("0", "0,1"):
            server = modelhost(mh_repo, cpus, resdir)
            try:
                for model in ("cpu_thread_1", "cpu_thread_2", "cpu_process_1", "cpu_process_2"):
                    rows.append(measure(server, model, 2, resdir, cpus))
                    pvt.log(_fmt(rows[-1]))
                if cpus == "0,1":
                    for model in ("ident_thread", "ident_process"):
                        rows.append(measure(server, model, 1, resdir, cpus))
                        pvt.log(_fmt(rows[-1]))
            finally:
                server.stop()
            if not args.skip_triton:
                server = triton(tr_repo, cpus, resdir)
                try:
                    for model in ("cpu_thread_1", "cpu_thread_2"):
                        rows.append(measure(server, model, 2, resdir, cpus))
                        pvt.log(_fmt(rows[-1]))
                finally:
                    server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines = [(f"Run: {started}, {platform.node()}, {os.cpu_count()} cores (shared with other jobs), "
             f"loop={args.loop}; perf_analyzer over HTTP, {' '.join(PA_FLAGS)}."), "",
             ("| server | model | instances | mode | taskset | concurrency | infer/s | p50 ms | "
             "server CPU µs/request |"),
             "| --- | --- | ---: | --- | --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        name = r["model"]
        count = name.rsplit("_", 1)[1] if name.startswith("cpu") else "1"
        mode = "stub process (Triton)" if r["server"].startswith("triton") else \
            ("process" if "process" in name else "thread")
        if not r["ok"]:
            lines.append(f"| {r['server']} | {name} | {count} | {mode} | -c {r['cpus']} | "
                         f"{r['concurrency']} | failed: {r['error'][:60]} | | |")
            continue
        cpu = f"{r['cpu_us_per_req']:.0f}" if r["cpu_us_per_req"] else "?"
        lines.append(f"| {r['server'].split('[')[0]} | {'cpu' if name.startswith('cpu') else name} | "
                     f"{count} | {mode} | -c {r['cpus']} | {r['concurrency']} | {r['infer_s']:.1f} | "
                     f"{r['p50_ms']:.2f} | {cpu} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


def _fmt(r: dict) -> str:
    if not r["ok"]:
        return f"{r['server']} {r['model']}: FAILED {r['error']}"
    return (f"{r['server']} {r['model']} c={r['concurrency']}: {r['infer_s']:.1f} infer/s "
            f"p50={r['p50_ms']:.2f} ms cpu={r['cpu_s']:.2f}s")


if __name__ == "__main__":
    sys.exit(main())
