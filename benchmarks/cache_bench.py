#!/usr/bin/env python3
"""Response cache benchmark: hits and misses of modelhost's `local` and `redis` caches against the
uncached model and against the real NVIDIA Triton with its local cache, in one run.

One model repository holds the anchor's python identity model twice (FP32, 1024 elements = 4 KiB
per request): `identity_cached` with `response_cache { enable: true }` and `identity_py` without.
perf_analyzer 2.41 drives each server over HTTP:

- hit:  `identity_cached` with perf_analyzer's default input data, one buffer sent with every
        request, so every request after the first is a cache hit;
- miss: `identity_cached` with 256 distinct inputs cycled (`--input-data`), on a cache too small to
        hold them (local: 64 KiB; Redis: maxmemory 256 KiB with LRU eviction), so every request
        misses, runs the model and inserts its response;
- uncached: `identity_py` with the same inputs (identical, and the 256 distinct ones).

Then a single-connection Python client (http.client, keep-alive) measures the latency of
`GET /v2/health/ready` and of a cache hit on each server, the same client for both, for the target
"a local hit answers at least as fast as a health request plus 20%".

    python benchmarks/cache_bench.py [--passes 2] [--concurrency 1 4] [--skip-triton] [--skip-redis]
                                     [--out docs/cache.md] [--no-write]

The servers run one after the other (modelhost-local, modelhost-redis, Triton), `--passes` times,
so that the noise of a shared machine falls on all of them; figures are medians over the passes.
About 3 minutes per pass.

Uses the helpers of benchmarks/perf_vs_triton.py (anchor set-up, server processes). Requirements:
the anchor in $ROOT (default /tmp/triton-anchor), redis-server on PATH for the redis rows, the
modelhost-redis-cache plugin installed in the interpreter that runs modelhost.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import http.client
import json
import os
import random
import shlex
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import perf_vs_triton as pvt  # noqa: E402

CACHED, UNCACHED = "identity_cached", "identity_py"
ELEMENTS = 1024                      # FP32: 4 KiB per request
DISTINCT = 256                       # inputs cycled for the miss path
LOCAL_SIZE = 65536                   # holds ~15 entries of ~4.2 KB: the 256 inputs always miss
REDIS_HEADROOM = 256 * 1024         # Redis maxmemory: its own baseline plus this, LRU eviction
PA_FLAGS = ["--measurement-interval", "2000", "--max-trials", "10", "--stability-percentage", "40"]
CLIENT_REQUESTS = 1000               # per latency series of the Python client


def build_repository(workdir: str) -> str:
    repo = os.path.join(workdir, "models")
    with open(os.path.join(pvt.ANCHOR_DIR, "config.pbtxt.in")) as f:
        template = f.read()
    for name, extra in ((CACHED, "response_cache { enable: true }\n"), (UNCACHED, "")):
        os.makedirs(os.path.join(repo, name, "1"))
        shutil.copyfile(os.path.join(pvt.ANCHOR_DIR, "model.py"), os.path.join(repo, name, "1", "model.py"))
        with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
            f.write(template.replace("@NAME@", name) + extra)
    return repo


def distinct_inputs(workdir: str) -> str:
    rnd = random.Random(5)
    data = [{"INPUT0": {"content": [round(rnd.random(), 6) for _ in range(ELEMENTS)], "shape": [ELEMENTS]}}
            for _ in range(DISTINCT)]
    path = os.path.join(workdir, "distinct.json")
    with open(path, "w") as f:
        json.dump({"data": data}, f)
    return path


# ----------------------------------------------------------------------------------------- servers
def modelhost(repo: str, logdir: str, python: str, name: str, cache_args: list[str]) -> pvt.Server:
    server = pvt.modelhost_server(repo, logdir, python)
    server.name = name
    server.argv += cache_args
    return server


def triton(repo: str, logdir: str) -> pvt.Server:
    server = pvt.triton_server(repo, logdir)
    server.argv = [a if not a.startswith("--cache-config=") else f"--cache-config=local,size={LOCAL_SIZE}"
                   for a in server.argv]
    return server


class Redis:
    def __init__(self, workdir: str) -> None:
        self.port = pvt.free_ports(1)[0]
        self.dir = workdir
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "Redis":
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed")
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.dir, "--maxmemory-policy", "allkeys-lru"],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while self.cli("ping") != "PONG":
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.1)
        # A maxmemory below Redis's own baseline would refuse every write: room for ~60 entries.
        used = int(next(ln.split(":")[1] for ln in self.cli("info", "memory").splitlines()
                        if ln.startswith("used_memory:")))
        self.cli("config", "set", "maxmemory", str(used + REDIS_HEADROOM))
        return self

    def cli(self, *args: str) -> str:
        out = subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True,
                             timeout=10, stdin=subprocess.DEVNULL)
        return out.stdout.strip()

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)


# ----------------------------------------------------------------------------------------- measuring
def run_pa(server: pvt.Server, model: str, conc: int, inputs: str | None, resdir: str, tag: str) -> dict:
    """One perf_analyzer run; tried once more when it found no stable window (a shared machine)."""
    row = _run_pa(server, model, conc, inputs, resdir, tag)
    if not row["ok"]:
        pvt.log(f"{tag} c={conc}: {row['error'][:120]}; trying once more")
        row = _run_pa(server, model, conc, inputs, resdir, tag)
    return row


def _run_pa(server: pvt.Server, model: str, conc: int, inputs: str | None, resdir: str, tag: str) -> dict:
    data = ["--input-data", inputs] if inputs else ["--shape", f"INPUT0:{ELEMENTS}"]
    row = {"tag": tag, "concurrency": conc}
    row.update(pvt.perf_analyzer(
        model, f"127.0.0.1:{server.http_port}", "http",
        ["--concurrency-range", f"{conc}:{conc}", *data, *PA_FLAGS],
        os.path.join(resdir, f"{tag}.c{conc}.csv"), os.path.join(resdir, f"{tag}.c{conc}.log")))
    return row


def cache_counts(server: pvt.Server, model: str) -> tuple[int, int, int, int]:
    """(cache hits, cache misses, executions, successful requests) from the server's statistics."""
    code, body = pvt.http_get(f"http://127.0.0.1:{server.http_port}/v2/models/{model}/stats")
    s = json.loads(body)["model_stats"][0] if code == 200 else {}
    st = s.get("inference_stats", {})
    return (st.get("cache_hit", {}).get("count", 0), st.get("cache_miss", {}).get("count", 0),
            s.get("execution_count", 0), st.get("success", {}).get("count", 0))


_TICK = os.sysconf("SC_CLK_TCK")


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU time of every process in the server's process group (gunicorn worker,
    Triton's python-backend stubs): a cost per request that other jobs on the machine disturb much
    less than they disturb throughput."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after the name: state, ppid, pgrp, ... utime(11), stime(12)
            total += int(fields[11]) + int(fields[12])
    return total / _TICK


def client_latency(server: pvt.Server, model: str) -> dict:
    """Median and p99 (ms) of health and of a cache hit, one keep-alive connection, same client;
    with the server's CPU time per request of each."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [ELEMENTS],
                                     "parameters": {"binary_data_size": 4 * ELEMENTS}}],
                         "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    body = header + struct.pack(f"<{ELEMENTS}f", *([0.5] * ELEMENTS))
    headers = {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"}

    def series(method: str, path: str, payload: bytes | None, hdrs: dict) -> list[float]:
        out = []
        for i in range(CLIENT_REQUESTS + 100):
            t0 = time.perf_counter()
            conn.request(method, path, body=payload, headers=hdrs)
            resp = conn.getresponse()
            resp.read()
            if resp.status != 200:
                raise RuntimeError(f"{method} {path}: HTTP {resp.status}")
            if i >= 100:  # warm-up (and the first request of the hit series, which is a miss)
                out.append((time.perf_counter() - t0) * 1000)
        return out

    result: dict[str, list[float]] = {}
    cpu: dict[str, float] = {}
    try:
        for _ in range(2):  # alternate, so that noise falls on both alike
            for label, args in (("health", ("GET", "/v2/health/ready", None, {})),
                                ("hit", ("POST", f"/v2/models/{model}/infer", body, headers))):
                before = group_cpu_seconds(server.proc.pid)
                result.setdefault(label, []).extend(series(*args))
                cpu[label] = cpu.get(label, 0.0) + group_cpu_seconds(server.proc.pid) - before
    finally:
        conn.close()
    return {label: {"p50_ms": statistics.median(v), "p99_ms": sorted(v)[int(len(v) * 0.99)],
                    "cpu_us": cpu[label] / (2 * (CLIENT_REQUESTS + 100)) * 1e6}
            for label, v in result.items()}


def fmt(r: dict) -> str:
    if not r["ok"]:
        return f"{r['tag']:28s} c={r['concurrency']:<2d} FAILED {r['error']}"
    cpu = f"  cpu={r['cpu_us']:5.0f} us/req" if r.get("cpu_us") else ""
    return (f"{r['tag']:28s} c={r['concurrency']:<2d} {r['infer_s']:9.1f} infer/s  "
            f"p50={r['p50_ms']:6.3f} ms  p99={r['p99_ms']:6.3f} ms{cpu}")


# ----------------------------------------------------------------------------------------- the run
def measure(server: pvt.Server, plan: list[tuple[str, str, str | None]], conc: list[int], resdir: str,
            rows: list[dict], checks: list[str], latency: dict) -> None:
    server.start()
    try:
        warm_up(server)
        for tag, model, inputs in plan:
            for c in conc:
                before, cpu = cache_counts(server, model), group_cpu_seconds(server.proc.pid)
                row = run_pa(server, model, c, inputs, resdir, f"{server.name} {tag}")
                cpu = group_cpu_seconds(server.proc.pid) - cpu
                after = cache_counts(server, model)
                hits, misses, execs, done = (a - b for a, b in zip(after, before))
                # perf_analyzer's warm-up and windows all count: CPU over every request served.
                row["cpu_us"] = cpu / done * 1e6 if done else None
                rows.append(row)
                pvt.log(fmt(row))
                checks.append(f"{server.name} {tag} c={c}: {hits} cache hits, {misses} misses, "
                              f"{execs} executions")
                pvt.log(checks[-1])
        lat = client_latency(server, CACHED)
        pvt.log(f"{server.name} client latency: {lat}")
        for label, figures in lat.items():
            for k, v in figures.items():
                latency.setdefault(server.name, {}).setdefault(label, {}).setdefault(k, []).append(v)
    finally:
        server.stop()


def warm_up(server: pvt.Server) -> None:
    """A few seconds of requests to both models before anything is measured."""
    deadline = time.monotonic() + 3
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [ELEMENTS],
                                   "data": [0.25] * ELEMENTS}]}).encode()
    try:
        while time.monotonic() < deadline:
            for model in (CACHED, UNCACHED):
                conn.request("POST", f"/v2/models/{model}/infer", body=body)
                conn.getresponse().read()
    finally:
        conn.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--skip-triton", action="store_true")
    ap.add_argument("--skip-redis", action="store_true")
    ap.add_argument("--passes", type=int, default=2,
                    help="the servers run one after the other, this many times (figures: medians)")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--out", default=os.path.join(pvt.REPO_ROOT, "docs", "cache.md"))
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    pvt.ensure_anchor(need_triton=not args.skip_triton)
    work = tempfile.mkdtemp(prefix="cache_bench_")
    repo, inputs = build_repository(work), distinct_inputs(work)
    started, t0 = _dt.datetime.now(_dt.timezone.utc), time.monotonic()
    rows: list[dict] = []
    checks: list[str] = []
    latency: dict = {}
    hit, miss = ("hit", CACHED, None), ("miss", CACHED, inputs)
    plain = [("uncached identical", UNCACHED, None), ("uncached distinct", UNCACHED, inputs)]
    for _ in range(args.passes):  # alternate the servers, so that noise falls on all alike
        measure(modelhost(repo, work, args.python, "modelhost-local", ["--cache-config", f"local,size={LOCAL_SIZE}"]),
                [hit, miss, plain[1], plain[0]], args.concurrency, work, rows, checks, latency)
        if not args.skip_redis:
            with Redis(work) as redis:
                measure(modelhost(repo, work, args.python, "modelhost-redis",
                                  ["--cache-config", "redis,host=127.0.0.1", "--cache-config",
                                   f"redis,port={redis.port}"]),
                        [hit, miss], args.concurrency, work, rows, checks, latency)
        if not args.skip_triton:
            measure(triton(repo, work), [hit, miss, plain[0], plain[1]], args.concurrency, work, rows, checks,
                    latency)
    latency = {name: {label: {k: statistics.median(v) for k, v in figures.items()}
                      for label, figures in per.items()} for name, per in latency.items()}
    wall = time.monotonic() - t0
    print("\n".join(fmt(r) for r in rows))
    targets = target_lines(rows, latency, args.concurrency)
    print("\n".join(targets))
    if not args.no_write:
        write_markdown(args.out, rows, checks, latency, targets, started, wall)
        pvt.log(f"wrote {args.out}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


def find(rows: list[dict], tag: str, conc: int) -> dict | None:
    """The run of `tag` at `conc`; with several passes, medians of each figure."""
    found = [r for r in rows if r["tag"] == tag and r["concurrency"] == conc and r["ok"]]
    if not found:
        return None
    return {k: statistics.median([r[k] for r in found if r.get(k) is not None] or [0])
            for k in ("infer_s", "p50_ms", "p99_ms", "cpu_us")} | {"runs": len(found)}


def target_lines(rows: list[dict], latency: dict, concurrency: list[int]) -> list[str]:
    out = []
    lat = latency.get("modelhost-local")
    if lat:
        ratio = lat["hit"]["p50_ms"] / lat["health"]["p50_ms"]
        out.append(f"local hit vs health (same Python client, p50): {lat['hit']['p50_ms']:.3f} ms vs "
                   f"{lat['health']['p50_ms']:.3f} ms = x{ratio:.2f} (target <= x1.20: "
                   f"{'met' if ratio <= 1.2 else 'NOT met'}); server CPU {lat['hit']['cpu_us']:.0f} vs "
                   f"{lat['health']['cpu_us']:.0f} us per request = x{lat['hit']['cpu_us'] / lat['health']['cpu_us']:.2f}")
        t = latency.get("triton")
        if t:
            out.append(f"the same on Triton: hit {t['hit']['p50_ms']:.3f} ms vs health {t['health']['p50_ms']:.3f} ms "
                       f"= x{t['hit']['p50_ms'] / t['health']['p50_ms']:.2f}")
    for c in concurrency:
        mine, theirs = find(rows, "modelhost-local hit", c), find(rows, "triton hit", c)
        if mine and theirs:
            r = mine["infer_s"] / theirs["infer_s"]
            out.append(f"local hit throughput vs Triton's local hit (medians of {mine['runs']} passes), c={c}: "
                       f"{mine['infer_s']:.0f} vs "
                       f"{theirs['infer_s']:.0f} infer/s = x{r:.2f} (target >= x1.00: "
                       f"{'met' if r >= 1 else 'NOT met'})")
        m, u = find(rows, "modelhost-local miss", c), find(rows, "modelhost-local uncached distinct", c)
        if m and u:
            cost = u["infer_s"] / m["infer_s"] - 1
            p50 = m["p50_ms"] / u["p50_ms"] - 1
            cpu = m["cpu_us"] / u["cpu_us"] - 1
            out.append(f"local miss path vs uncached model (4 KiB distinct inputs, medians of {m['runs']} "
                       f"passes), c={c}: server CPU {m['cpu_us']:.0f} vs {u['cpu_us']:.0f} us per "
                       f"request = {cpu * 100:+.1f}% (target <= +5%: {'met' if cpu <= 0.05 else 'NOT met'}); "
                       f"throughput {m['infer_s']:.0f} vs {u['infer_s']:.0f} infer/s = {cost * 100:+.1f}% time "
                       f"per request, p50 {p50 * 100:+.1f}%")
    return out


def write_markdown(path: str, rows, checks, latency, targets, started, wall) -> None:
    machine = pvt.machine_info()
    md = ["## Benchmark (generated)", "",
          f"Run {started:%Y-%m-%d %H:%M} UTC, {wall:.0f} s, on {machine['cpu']} ({machine['cores']} cores, "
          f"{machine['memory']}), {machine['os']}, Python {machine['python']}. **The machine was shared** with "
          "other jobs (2 cores, several agents building and testing at the same time) and perf_analyzer runs on "
          "the same cores as the servers: figures are noisy, compare only within one run.", "",
          f"Command: `{shlex.join([os.path.basename(sys.executable)] + sys.argv)}`. Model: the anchor's python "
          f"identity model, FP32[{ELEMENTS}] (4 KiB) per request, HTTP, perf_analyzer "
          f"`{' '.join(PA_FLAGS)}`. hit: the same input every request; miss: {DISTINCT} distinct inputs cycled "
          f"on a cache too small to keep them (local size={LOCAL_SIZE}, Redis maxmemory its baseline + "
          f"{REDIS_HEADROOM // 1024} KiB, allkeys-lru); at concurrency > 1 perf_analyzer's workers step through "
          "the same inputs, so some requests of the miss case hit (counted below); "
          "Triton 2.51 runs with `--cache-config local,size=65536`.", "",
          "Server CPU is the user + system time of the server's processes over the run divided by the "
          "requests it served: the least noisy figure here.", "",
          "Medians over the passes; the range is the lowest and highest throughput of the passes.", "",
          "| server, case | concurrency | infer/s | infer/s range | p50 ms | p99 ms | server CPU us/request | runs |",
          "|---|---:|---:|---:|---:|---:|---:|---:|"]
    seen: list[tuple[str, int]] = []
    for r in rows:
        if (r["tag"], r["concurrency"]) not in seen:
            seen.append((r["tag"], r["concurrency"]))
    for tag, conc in seen:
        m = find(rows, tag, conc)
        if m is None:
            md.append(f"| {tag} | {conc} | failed | | | | | 0 |")
            continue
        ok = [r["infer_s"] for r in rows if r["tag"] == tag and r["concurrency"] == conc and r["ok"]]
        cpu = f"{m['cpu_us']:.0f}" if m.get("cpu_us") else "-"
        md.append(f"| {tag} | {conc} | {m['infer_s']:.1f} | {min(ok):.0f}-{max(ok):.0f} | {m['p50_ms']:.3f} | "
                  f"{m['p99_ms']:.3f} | {cpu} | {m['runs']} |")
    md += ["", "What the servers counted over each case (from their statistics), to show hits were hits:", ""]
    md += [f"- {c}" for c in checks]
    md += ["", f"Single-connection Python client, {CLIENT_REQUESTS} x 2 requests per series, medians over the "
           "passes (ms):", "",
           "| server | health p50 | health p99 | cache hit p50 | cache hit p99 | server CPU us/request: "
           "health, hit |", "|---|---:|---:|---:|---:|---:|"]
    for name, lat in latency.items():
        md.append(f"| {name} | {lat['health']['p50_ms']:.3f} | {lat['health']['p99_ms']:.3f} | "
                  f"{lat['hit']['p50_ms']:.3f} | {lat['hit']['p99_ms']:.3f} | "
                  f"{lat['health']['cpu_us']:.0f}, {lat['hit']['cpu_us']:.0f} |")
    md += ["", "Targets:", ""] + [f"- {t}" for t in targets] + [""]
    text = open(path).read() if os.path.exists(path) else "# Response cache\n"
    marker = "## Benchmark (generated)"
    head = text.split(marker)[0].rstrip("\n")
    with open(path, "w") as f:
        f.write(head + "\n\n" + "\n".join(md))


if __name__ == "__main__":
    sys.exit(main())
