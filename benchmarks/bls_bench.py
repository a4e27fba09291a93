#!/usr/bin/env python3
"""BLS side by side: a python model making the three identity calls a 3-step ensemble of python
identity models would make, served by the real NVIDIA Triton and by modelhost, same repository,
same machine, one run. Writes docs/bls_benchmarks.md.

The repository: `step1`, `step2`, `step3` (the anchor's python identity model, FP32[-1], one
instance each), `bls3` (a BLS model that sends its input through step1 -> step2 -> step3 with
`pb_utils.InferenceRequest(...).exec()` and answers the last output) and `bls0` (the same model
making no call: the BLS model's own cost). perf_analyzer (`--shape INPUT0:1024`) drives each
model over HTTP at each concurrency; the servers alternate pass by pass (Triton, modelhost,
Triton, ...), so that the noise of this shared machine falls on both alike.

Figures: infer/s, p50/p99 latency, server CPU per request (user + system time of the server's
processes, stubs included, over the requests the BLS model served), and a BLS call's added
latency: (p50 of bls3 - p50 of bls0) / 3, what each call adds to a request, the callee's own run
included. Target: modelhost's at most a third of Triton's at concurrency 8.

    python benchmarks/bls_bench.py [--passes 2] [--concurrency 1 8] [--out docs/bls_benchmarks.md]
                                   [--no-write]
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import perf_vs_triton as pvt  # noqa: E402  (the runner: servers, perf_analyzer, machine info)
from cache_bench import group_cpu_seconds  # noqa: E402

MODELS = ("bls0", "bls3")
STEPS = ("step1", "step2", "step3")

BLS_MODEL = '''import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Send INPUT0 through the models named by the config parameter "steps", one BLS call each."""

    def initialize(self, args):
        steps = json.loads(args["model_config"]).get("parameters", {}).get("steps", {})
        self.steps = [s for s in steps.get("string_value", "").split(",") if s]

    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            for step in self.steps:
                answer = pb_utils.InferenceRequest(
                    model_name=step, inputs=[pb_utils.Tensor("INPUT0", tensor.as_numpy())],
                    requested_output_names=["OUTPUT0"]).exec()
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
                tensor = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0")
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUTPUT0", tensor.as_numpy())]))
        return responses
'''

BLS_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
parameters {{ key: "steps" value {{ string_value: "{steps}" }} }}
"""


def build_repository() -> str:
    repo = pvt.build_repository()  # identity_py: the server runner waits for it to be ready
    for step in STEPS:
        shutil.copytree(os.path.join(repo, pvt.MODEL), os.path.join(repo, step))
        path = os.path.join(repo, step, "config.pbtxt")
        with open(path) as f:
            text = f.read().replace(f'"{pvt.MODEL}"', f'"{step}"')
        with open(path, "w") as f:
            f.write(text)
    for name, steps in (("bls0", ""), ("bls3", ",".join(STEPS))):
        os.makedirs(os.path.join(repo, name, "1"))
        with open(os.path.join(repo, name, "1", "model.py"), "w") as f:
            f.write(BLS_MODEL)
        with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
            f.write(BLS_CONFIG.format(name=name, steps=steps))
    return repo


def success_count(server: pvt.Server, model: str) -> int:
    url = f"http://127.0.0.1:{server.http_port}/v2/models/{model}/stats"
    with urllib.request.urlopen(url, timeout=5) as r:
        stats = json.load(r)["model_stats"]
    return sum(int(s["inference_stats"]["success"]["count"]) for s in stats)


def measure(server: pvt.Server, conc: list[int], resdir: str, rows: list[dict], tag: str) -> None:
    server.start()
    try:
        for model in MODELS:
            for c in conc:
                before, cpu = success_count(server, model), group_cpu_seconds(server.proc.pid)
                row = {"server": server.name, "model": model, "concurrency": c}
                row.update(pvt.perf_analyzer(
                    model, f"127.0.0.1:{server.http_port}", "http",
                    ["--concurrency-range", f"{c}:{c}", *pvt.PA_FLAGS],
                    os.path.join(resdir, f"{tag}.{model}.c{c}.csv"),
                    os.path.join(resdir, f"{tag}.{model}.c{c}.log")))
                cpu = group_cpu_seconds(server.proc.pid) - cpu
                done = success_count(server, model) - before
                row["cpu_us"] = cpu / done * 1e6 if done else None  # warm-up and windows all count
                rows.append(row)
                cpu_text = f"  cpu={row['cpu_us']:.0f} us/req" if row.get("cpu_us") else ""
                pvt.log(f"{server.name} {model} c={c}: " + (
                    f"{row['infer_s']:.1f} infer/s p50={row['p50_ms']:.2f} ms{cpu_text}"
                    if row["ok"] else f"FAILED {row['error']}"))
    finally:
        server.stop()


def summarize(rows: list[dict]) -> dict:
    out: dict = {}
    for r in rows:
        if r["ok"]:
            out.setdefault((r["server"], r["model"], r["concurrency"]), []).append(r)
    return {k: {"infer_s": statistics.median(x["infer_s"] for x in v),
                "p50_ms": statistics.median(x["p50_ms"] for x in v),
                "p99_ms": statistics.median(x["p99_ms"] for x in v),
                "cpu_us": statistics.median(x["cpu_us"] for x in v if x.get("cpu_us") is not None)
                if any(x.get("cpu_us") for x in v) else None,
                "passes": len(v)} for k, v in out.items()}


def report(summary: dict, conc: list[int]) -> list[str]:
    lines = ["| server | model | concurrency | infer/s | p50 ms | p99 ms | server CPU us/request | passes |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for (server, model, c), s in sorted(summary.items(), key=lambda kv: (kv[0][2], kv[0][1], kv[0][0])):
        cpu = f"{s['cpu_us']:.0f}" if s["cpu_us"] else "-"
        lines.append(f"| {server} | {model} | {c} | {s['infer_s']:.1f} | {s['p50_ms']:.2f} | "
                     f"{s['p99_ms']:.2f} | {cpu} | {s['passes']} |")
    lines.append("")
    for c in conc:
        added = {}
        for server in ("triton", "modelhost"):
            b0, b3 = summary.get((server, "bls0", c)), summary.get((server, "bls3", c))
            if b0 and b3:
                added[server] = (b3["p50_ms"] - b0["p50_ms"]) / 3
                cpu = (f"; server CPU per call {(b3['cpu_us'] - b0['cpu_us']) / 3:.0f} us"
                       if b0["cpu_us"] and b3["cpu_us"] else "")
                lines.append(f"- {server}, c={c}: a BLS call adds {added[server] * 1000:.0f} us of "
                             f"latency (p50){cpu}")
        if len(added) == 2 and added["triton"] > 0:
            ratio = added["modelhost"] / added["triton"]
            verdict = "met" if ratio <= 1 / 3 else "NOT met"
            target = " (target at c=8: at most x0.33: " + verdict + ")" if c == 8 else ""
            lines.append(f"- c={c}: modelhost / Triton added latency per BLS call = x{ratio:.2f}{target}")
            t3, m3 = summary.get(("triton", "bls3", c)), summary.get(("modelhost", "bls3", c))
            if t3 and m3:
                lines.append(f"- c={c}: bls3 throughput modelhost / Triton = x{m3['infer_s'] / t3['infer_s']:.2f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--out", default=os.path.join(pvt.REPO_ROOT, "docs", "bls_benchmarks.md"))
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--python", default=sys.executable, help="the python that runs modelhost")
    args = ap.parse_args(argv)
    pvt.ensure_anchor(need_triton=True)
    started, t0 = _dt.datetime.now(_dt.timezone.utc), time.monotonic()
    load0 = os.getloadavg()[0]
    repo = build_repository()
    resdir = tempfile.mkdtemp(prefix="bls_bench_")
    rows: list[dict] = []
    try:
        for p in range(args.passes):
            for make in (lambda: pvt.triton_server(repo, resdir),
                         lambda: pvt.modelhost_server(repo, resdir, args.python)):
                server = make()
                measure(server, args.concurrency, resdir, rows, f"{server.name}.p{p}")
    finally:
        shutil.rmtree(repo, ignore_errors=True)
    summary = summarize(rows)
    lines = report(summary, args.concurrency)
    print("\n".join(lines))
    machine = pvt.machine_info()
    wall = time.monotonic() - t0
    if not args.no_write:
        md = ["# BLS: modelhost vs NVIDIA Triton", "",
              "Written by `benchmarks/bls_bench.py`; regenerate rather than edit. What it measures is in "
              "the script's docstring: `bls3` sends each request through three python identity models "
              "(`step1` -> `step2` -> `step3`) with BLS calls, `bls0` is the same model making no call; "
              "a BLS call's added latency is (p50 of bls3 - p50 of bls0) / 3. HTTP, perf_analyzer "
              f"`{' '.join(pvt.PA_FLAGS)}`, medians over {args.passes} alternating passes.", "",
              *lines, "",
              f"- Date: {started:%Y-%m-%d %H:%M} UTC; run took {wall:.0f} s",
              f"- Machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory']}; shared with "
              f"other jobs (load average {load0:.2f} at start, {os.getloadavg()[0]:.2f} at end), and "
              "perf_analyzer runs on the same cores: compare within one run only.",
              f"- Command: `python benchmarks/bls_bench.py --passes {args.passes} --concurrency "
              f"{' '.join(map(str, args.concurrency))}`", ""]
        with open(args.out, "w") as f:
            f.write("\n".join(md))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
