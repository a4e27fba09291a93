#!/usr/bin/env python3
"""perf_analyzer side by side: the real NVIDIA Triton server vs modelhost, same model, same machine, one run.

Both servers serve the same python identity model (``identity_py``: OUTPUT0 = INPUT0, FP32[-1]) from one
temporary model repository; perf_analyzer 2.41 drives each over HTTP (or gRPC) with the flags of the shared
anchor's ``run_pa.sh``. With ``--passes N`` the servers alternate (Triton, modelhost, Triton, modelhost, ...)
so that the noise of this shared machine falls on both alike. Prints a table and writes docs/benchmarks.md.

    python benchmarks/perf_vs_triton.py [--passes 3] [--concurrency 1 8] [--skip-triton] [--skip-modelhost]
                                        [--protocol http grpc grpc-stream] [--out docs/benchmarks.md] [--no-write]

Environment: ROOT (anchor install dir, default ${TMPDIR:-/tmp}/triton-anchor), ANCHOR_DIR (the anchor scripts,
default /work/shared/anchors/triton). Standard library only.
"""
from __future__ import annotations

import argparse
import csv
import datetime as _dt
import glob
import json
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ANCHOR_DIR = os.environ.get("ANCHOR_DIR", "/work/shared/anchors/triton")
ROOT = os.environ.get("ROOT") or os.path.join(os.environ.get("TMPDIR", "/tmp"), "triton-anchor")
MODEL = "identity_py"

SETUP_TIMEOUT = 1800      # setup.sh: apt + pip, minutes on a cold machine
START_TIMEOUT = 90        # server start until /v2/health/ready and the model is ready
STOP_TIMEOUT = 20         # SIGTERM grace before SIGKILL
PA_TIMEOUT = 120          # one perf_analyzer run (one concurrency level), as run_pa.sh
PA_FLAGS = ["--shape", "INPUT0:1024", "--measurement-interval", "2000", "--max-trials", "10",
            "--stability-percentage", "40"]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ----------------------------------------------------------------------------------------- anchor setup
def site_packages() -> str:
    found = sorted(glob.glob(os.path.join(ROOT, "venv", "lib", "python3.*", "site-packages")))
    if not found:
        raise RuntimeError(f"no venv site-packages under {ROOT}/venv")
    return found[0]


def ensure_anchor(need_triton: bool) -> None:
    """Run the anchor's setup.sh when the server or perf_analyzer is missing."""
    tritonserver = os.path.join(ROOT, "server", "bin", "tritonserver")
    pa = os.path.join(ROOT, "pa", "perf_analyzer")
    missing = [p for p in ([tritonserver] if need_triton else []) + [pa] if not os.access(p, os.X_OK)]
    if not missing:
        return
    setup = os.path.join(ANCHOR_DIR, "setup.sh")
    logpath = os.path.join(tempfile.gettempdir(), "triton-anchor-setup.log")
    log(f"anchor missing ({', '.join(missing)}): running {setup} (ROOT={ROOT}, log {logpath}; takes minutes)")
    env = dict(os.environ, ROOT=ROOT)
    with open(logpath, "w") as out:
        # own session, so that a timeout or Ctrl-C also ends its apt / pip children
        proc = subprocess.Popen(["bash", setup], env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=tempfile.gettempdir(), start_new_session=True)
        try:
            rc = proc.wait(SETUP_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"setup.sh did not finish in {SETUP_TIMEOUT} s; see {logpath}") from None
        finally:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(10)
    if rc != 0 or any(not os.access(p, os.X_OK) for p in missing):
        raise RuntimeError(f"setup.sh failed (rc={rc}); see {logpath}")
    log("anchor setup done")


def build_repository() -> str:
    repo = tempfile.mkdtemp(prefix="perf_vs_triton_repo_")
    mdir = os.path.join(repo, MODEL, "1")
    os.makedirs(mdir)
    shutil.copyfile(os.path.join(ANCHOR_DIR, "model.py"), os.path.join(mdir, "model.py"))
    with open(os.path.join(ANCHOR_DIR, "config.pbtxt.in")) as f:
        cfg = f.read().replace("@NAME@", MODEL)
    with open(os.path.join(repo, MODEL, "config.pbtxt"), "w") as f:
        f.write(cfg)
    return repo


# ----------------------------------------------------------------------------------------- servers
def free_ports(n: int) -> list[int]:
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""
    except (urllib.error.URLError, OSError, ValueError):
        return 0, b""


class Server:
    """One server process in its own session (so its children, e.g. python-backend stubs, go with it)."""

    def __init__(self, name: str, argv: list[str], env: dict, cwd: str, http_port: int, grpc_port: int,
                 logdir: str):
        self.name, self.argv, self.env, self.cwd = name, argv, env, cwd
        self.http_port, self.grpc_port = http_port, grpc_port
        self.logpath = os.path.join(logdir, f"{name}.{int(time.time() * 1000)}.log")
        self.proc: subprocess.Popen | None = None
        self.metadata: dict = {}

    def start(self) -> None:
        log(f"starting {self.name}: {shlex.join(self.argv)}")
        self._log = open(self.logpath, "w")
        self.proc = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd, stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        base = f"http://127.0.0.1:{self.http_port}"
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with rc={self.proc.returncode} while starting:\n"
                                   + self.log_tail())
            if (http_get(base + "/v2/health/ready")[0] == 200
                    and http_get(base + f"/v2/models/{MODEL}/ready")[0] == 200):
                code, body = http_get(base + "/v2")
                try:
                    self.metadata = json.loads(body) if code == 200 else {}
                except ValueError:
                    self.metadata = {}
                log(f"{self.name} ready (pid {self.proc.pid}, http {self.http_port}, grpc {self.grpc_port})")
                return
            time.sleep(0.25)
        raise RuntimeError(f"{self.name} not ready after {START_TIMEOUT} s:\n" + self.log_tail())

    def stop(self) -> None:
        if self.proc is None:
            return
        # a second Ctrl-C / SIGTERM must not cut the shutdown short and orphan the server
        old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._stop()
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    def _stop(self) -> None:
        p = self.proc
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                log(f"{self.name} ignored SIGTERM for {STOP_TIMEOUT} s: SIGKILL")
        # the leader may be gone while stubs/workers linger in its process group: make sure of them too
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            pass
        log(f"{self.name} stopped (rc={p.returncode})")
        self.proc = None
        self._log.close()

    def log_tail(self, n: int = 30) -> str:
        try:
            with open(self.logpath, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""


def triton_server(repo: str, logdir: str) -> Server:
    """Same invocation as the anchor's start_server.sh, on free ports (or TRITON_PORTS=http,grpc,metrics)
    and with our repository."""
    fixed = os.environ.get("TRITON_PORTS")
    http, grpc, metrics = [int(p) for p in fixed.split(",")] if fixed else free_ports(3)
    sp = site_packages()
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.path.join(sp, "nvidia_pytriton.libs") + (
        ":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    env["PATH"] = os.path.join(ROOT, "venv", "bin") + ":" + env.get("PATH", "")
    srv = os.path.join(ROOT, "server")
    argv = [os.path.join(srv, "bin", "tritonserver"),
            f"--model-repository={repo}",
            f"--backend-directory={srv}/backends",
            f"--cache-directory={srv}/caches",
            "--cache-config=local,size=1048576",
            "--http-address=127.0.0.1", f"--http-port={http}",
            "--grpc-address=127.0.0.1", f"--grpc-port={grpc}",
            "--metrics-address=127.0.0.1", f"--metrics-port={metrics}",
            "--allow-gpu-metrics=false"]
    return Server("triton", argv, env, ROOT, http, grpc, logdir)


def modelhost_server(repo: str, logdir: str, python: str) -> Server:
    http, grpc, metrics = free_ports(3)
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    argv = [python, "-m", "host", "serve", "--model-repository", repo,
            "--http-address", "127.0.0.1", "--http-port", str(http),
            "--grpc-address", "127.0.0.1", "--grpc-port", str(grpc),
            "--metrics-address", "127.0.0.1", "--metrics-port", str(metrics)]
    return Server("modelhost", argv, env, REPO_ROOT, http, grpc, logdir)


# ----------------------------------------------------------------------------------------- perf_analyzer
# A measured mode: the perf_analyzer protocol plus its extra flags. `grpc-stream` sends every
# request over one bidirectional ModelStreamInfer stream per client (perf_analyzer --streaming).
MODES = {"http": ("http", []), "grpc": ("grpc", []), "grpc-stream": ("grpc", ["--streaming"])}


def perf_analyzer(model: str, url: str, protocol: str, flags: list[str], csvpath: str, logpath: str,
                  timeout: float = PA_TIMEOUT) -> dict:
    """One perf_analyzer run: {ok, infer_s, p50_ms, p99_ms, error, seconds} from its CSV, or the
    reason from its log when it wrote none. The benchmarks in this folder all measure through it."""
    argv = [os.path.join(ROOT, "pa", "perf_analyzer"), "-m", model, "-u", url, "-i", protocol, *flags,
            "-f", csvpath]
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(site_packages(), "nvidia", "cuda_runtime", "lib"))
    row = {"ok": False, "error": "", "infer_s": None, "p50_ms": None, "p99_ms": None}
    t0 = time.monotonic()
    with open(logpath, "w") as out:
        try:
            rc = subprocess.run(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    row["seconds"] = round(time.monotonic() - t0, 1)
    try:
        with open(csvpath) as f:
            r = next(csv.DictReader(f))
        row.update(ok=True, infer_s=float(r["Inferences/Second"]), p50_ms=int(r["p50 latency"]) / 1000,
                   p99_ms=int(r["p99 latency"]) / 1000)
    except Exception as e:  # no CSV: perf_analyzer failed; keep the reason from its log
        with open(logpath, errors="replace") as f:
            tail = [ln.strip() for ln in f.read().splitlines() if ln.strip()][-3:]
        row["error"] = f"rc={rc}: " + (" | ".join(tail) or repr(e))
    return row


def run_pa(server: Server, protocol: str, conc: int, resdir: str, tag: str) -> dict:
    pa_protocol, extra = MODES[protocol]
    url = f"127.0.0.1:{server.http_port if pa_protocol == 'http' else server.grpc_port}"
    row = {"server": server.name, "protocol": protocol, "concurrency": conc}
    row.update(perf_analyzer(MODEL, url, pa_protocol,
                             [*extra, "--concurrency-range", f"{conc}:{conc}", *PA_FLAGS],
                             os.path.join(resdir, f"{tag}.c{conc}.csv"),
                             os.path.join(resdir, f"{tag}.c{conc}.log")))
    return row


def failure_summary(text: str) -> str:
    """First line of a start failure plus the last exception line of the server log, if any."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return "failed"
    exc = [ln for ln in lines[1:] if re.match(r"^([\w.]+(Error|Exception|Exit)\b|Error:)", ln)]
    tail = exc[-1:] if exc else lines[-1:] if len(lines) > 1 else []
    return " ".join([lines[0]] + tail)[:300]


def fmt_row(r: dict) -> str:
    if not r["ok"]:
        return f"{r['server']:10s} {r['protocol']:11s} c={r['concurrency']:<3d} FAILED {r['error']}"
    return (f"{r['server']:10s} {r['protocol']:11s} c={r['concurrency']:<3d} {r['infer_s']:9.1f} infer/s  "
            f"p50={r['p50_ms']:6.2f} ms  p99={r['p99_ms']:6.2f} ms")


# ----------------------------------------------------------------------------------------- reporting
def machine_info() -> dict:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for ln in f:
                if ln.startswith("model name"):
                    cpu = ln.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = "unknown"
    try:
        with open("/proc/meminfo") as f:
            for ln in f:
                if ln.startswith("MemTotal:"):
                    mem = f"{int(ln.split()[1]) / 1024 / 1024:.1f} GiB"
                    break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu, "cores": cores, "memory": mem, "os": f"{platform.system()} {platform.release()}",
            "python": platform.python_version()}


def versions(python: str, triton_meta: dict, modelhost_meta: dict) -> dict:
    v = {"triton": triton_meta.get("version", "2.51.0 (not queried)"), "pytriton": "?", "perf_analyzer": "?",
         "modelhost": "?"}
    try:
        for d in glob.glob(os.path.join(site_packages(), "nvidia_pytriton-*.dist-info")):
            v["pytriton"] = os.path.basename(d)[len("nvidia_pytriton-"):-len(".dist-info")]
    except RuntimeError:
        pass
    try:
        out = subprocess.run([os.path.join(ROOT, "pa", "perf_analyzer"), "--version"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=30, stdin=subprocess.DEVNULL,
                             env=dict(os.environ, LD_LIBRARY_PATH=os.path.join(
                                 site_packages(), "nvidia", "cuda_runtime", "lib"))).stdout
        m = re.search(r"Perf Analyzer Version (\S+)", out)
        v["perf_analyzer"] = m.group(1) if m else "?"
    except Exception:
        pass
    try:
        out = subprocess.run([python, "-c", "import host; print(host.__version__)"], capture_output=True,
                             text=True, timeout=60, cwd=REPO_ROOT, stdin=subprocess.DEVNULL)
        if out.returncode == 0 and out.stdout.strip():
            v["modelhost"] = out.stdout.strip()
    except Exception:
        pass
    if v["modelhost"] == "?" and modelhost_meta.get("version"):
        v["modelhost"] = str(modelhost_meta["version"])
    return v


def summarize(rows: list[dict]) -> list[dict]:
    """Median over passes per (server, protocol, concurrency), with the infer/s range."""
    out = []
    keys = []
    for r in rows:
        k = (r["server"], r["protocol"], r["concurrency"])
        if k not in keys:
            keys.append(k)
    for k in keys:
        rs = [r for r in rows if (r["server"], r["protocol"], r["concurrency"]) == k]
        good = [r for r in rs if r["ok"]]
        s = {"server": k[0], "protocol": k[1], "concurrency": k[2], "passes": len(rs), "ok": len(good)}
        if good:
            s.update(infer_s=statistics.median(r["infer_s"] for r in good),
                     infer_min=min(r["infer_s"] for r in good), infer_max=max(r["infer_s"] for r in good),
                     p50_ms=statistics.median(r["p50_ms"] for r in good),
                     p99_ms=statistics.median(r["p99_ms"] for r in good))
        out.append(s)
    return out


def summary_lines(summary: list[dict], markdown: bool) -> list[str]:
    if markdown:
        lines = ["| server | protocol | concurrency | infer/s (median) | infer/s range | p50 ms | p99 ms | "
                 "passes ok |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    else:
        lines = [f"{'server':10s} {'proto':11s} {'conc':>4s} {'infer/s':>9s} {'range':>17s} {'p50 ms':>7s} "
                 f"{'p99 ms':>7s} {'ok':>5s}"]
    for s in summary:
        ok = f"{s['ok']}/{s['passes']}"
        if "infer_s" in s:
            rng = f"{s['infer_min']:.0f}-{s['infer_max']:.0f}"
            vals = (f"{s['infer_s']:.1f}", rng, f"{s['p50_ms']:.2f}", f"{s['p99_ms']:.2f}")
        else:
            vals = ("failed", "-", "-", "-")
        if markdown:
            lines.append(f"| {s['server']} | {s['protocol']} | {s['concurrency']} | " + " | ".join(vals)
                         + f" | {ok} |")
        else:
            lines.append(f"{s['server']:10s} {s['protocol']:11s} {s['concurrency']:4d} {vals[0]:>9s} "
                         f"{vals[1]:>17s} {vals[2]:>7s} {vals[3]:>7s} {ok:>5s}")
    # ratio modelhost / triton where both are present
    for s in summary:
        if s["server"] != "modelhost" or "infer_s" not in s:
            continue
        t = next((x for x in summary if x["server"] == "triton" and x["protocol"] == s["protocol"]
                  and x["concurrency"] == s["concurrency"] and "infer_s" in x), None)
        if t:
            txt = (f"modelhost/triton {s['protocol']} c={s['concurrency']}: throughput x"
                   f"{s['infer_s'] / t['infer_s']:.2f}, p50 x{s['p50_ms'] / t['p50_ms']:.2f}")
            lines.append(("- " + txt) if markdown else txt)
    if markdown and lines[-1].startswith("- "):
        # a blank line between the table and the ratio list
        first = next(i for i, ln in enumerate(lines) if ln.startswith("- "))
        lines.insert(first, "")
    return lines


def write_markdown(path: str, args, command: str, started: str, wall: float, machine: dict, vers: dict,
                   rows: list[dict], summary: list[dict], load: tuple, notes: list[str]) -> None:
    notes = list(notes)
    md = ["# Benchmarks: modelhost vs NVIDIA Triton (perf_analyzer)", "",
          "Written by `benchmarks/perf_vs_triton.py` (see `benchmarks/README.md`); regenerate rather than edit.",
          "",
          "Both servers serve the same model repository: `identity_py`, the Triton python-backend identity "
          "model (`OUTPUT0 = INPUT0`, FP32, request shape [1024]) from `/work/shared/anchors/triton/`. "
          "perf_analyzer drives each with closed-loop synchronous requests at fixed concurrency "
          f"(`{' '.join(PA_FLAGS)}`), "
          "the same flags as the anchor's `run_pa.sh`. The servers run one at a time and alternate per pass; "
          "the table gives the median over passes (and the throughput range). "
          "Client and server share the same cores, so figures are only comparable within one run.", "",
          "## Results", "", *summary_lines(summary, markdown=True), "",
          "### Per pass", "", "| pass | server | protocol | concurrency | infer/s | p50 ms | p99 ms |",
          "|---:|---|---|---:|---:|---:|---:|"]
    for r in rows:
        if r["ok"]:
            md.append(f"| {r['pass']} | {r['server']} | {r['protocol']} | {r['concurrency']} | "
                      f"{r['infer_s']:.1f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} |")
        else:
            err = r["error"].replace("|", "/")[:200]
            md.append(f"| {r['pass']} | {r['server']} | {r['protocol']} | {r['concurrency']} | failed | - | - |")
            if not any(err in n for n in notes):
                notes.append(f"pass {r['pass']}: {r['server']} c={r['concurrency']} failed: {err}")
    md += ["", "## Setup", "",
           f"- Date: {started} (run took {wall:.0f} s)",
           f"- Command: `{command}`",
           f"- Machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory']} memory, {machine['os']}"
           f" (shared; load average at start {load[0]:.2f}, at end {load[1]:.2f})",
           *([] if args.skip_triton else [
               f"- Triton Inference Server {vers['triton']} (CPU build from nvidia-pytriton {vers['pytriton']}, "
               "python backend, stub for Python 3.11), launched as the anchor's `start_server.sh` does"]),
           f"- perf_analyzer {vers['perf_analyzer']} (from the tritonclient 2.41.0 wheel)",
           *([] if args.skip_modelhost else [
               f"- modelhost {vers['modelhost']} (`python -m host serve`, Python {machine['python']})"]),
           f"- Passes: {args.passes}; concurrency: {' '.join(map(str, args.concurrency))}; protocol: "
           f"{' '.join(args.protocol)}"]
    if notes:
        md += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(md) + "\n")


# ----------------------------------------------------------------------------------------- main
def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passes", type=int, default=1, help="alternating passes over the servers (default 1)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8], help="levels (default: 1 8)")
    ap.add_argument("--skip-triton", action="store_true", help="do not measure Triton")
    ap.add_argument("--skip-modelhost", action="store_true", help="do not measure modelhost")
    ap.add_argument("--protocol", choices=list(MODES), nargs="+", default=["http"],
                    help="one or more of http, grpc, grpc-stream (default: http)")
    ap.add_argument("--out", default=os.path.join(REPO_ROOT, "docs", "benchmarks.md"),
                    help="markdown report (default docs/benchmarks.md)")
    ap.add_argument("--no-write", action="store_true", help="print only; do not write the report")
    ap.add_argument("--python", default=sys.executable, help="interpreter for `-m host serve` (default: this)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary repository, logs and CSVs")
    args = ap.parse_args(argv)
    if args.skip_triton and args.skip_modelhost:
        ap.error("nothing to measure")
    if args.passes < 1:
        ap.error("--passes must be >= 1")

    command = "python benchmarks/perf_vs_triton.py" + ("" if not sys.argv[1:] else " " + shlex.join(sys.argv[1:]))
    started = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    t0 = time.monotonic()
    load0 = os.getloadavg()[0]
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored (`cmd &`)

    rows: list[dict] = []
    meta: dict[str, dict] = {}
    notes: list[str] = []
    interrupted = False
    server = None
    repo = work = None
    try:
        ensure_anchor(need_triton=not args.skip_triton)
        repo = build_repository()
        work = tempfile.mkdtemp(prefix="perf_vs_triton_run_")
        log(f"model repository {repo}; logs and CSVs in {work}")
        makers = []
        if not args.skip_triton:
            makers.append(lambda: triton_server(repo, work))
        if not args.skip_modelhost:
            makers.append(lambda: modelhost_server(repo, work, args.python))
        for p in range(1, args.passes + 1):
            for make in makers:
                server = make()
                try:
                    server.start()
                    meta.setdefault(server.name, server.metadata)
                    for proto in args.protocol:
                        for c in args.concurrency:
                            r = run_pa(server, proto, c, work, f"p{p}.{server.name}.{proto}")
                            r["pass"] = p
                            rows.append(r)
                            log(f"pass {p}: " + fmt_row(r) + f"  ({r['seconds']} s)")
                except RuntimeError as e:
                    log(f"pass {p}: {server.name} FAILED: {e}")
                    msg = failure_summary(str(e))
                    notes.append(f"pass {p}: {server.name} failed: {msg}")
                    for proto in args.protocol:
                        for c in args.concurrency:
                            rows.append({"pass": p, "server": server.name, "protocol": proto,
                                         "concurrency": c, "ok": False, "error": msg, "infer_s": None,
                                         "p50_ms": None, "p99_ms": None})
                finally:
                    server.stop()
                    server = None
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: stopping")
    except RuntimeError as e:  # anchor setup failed
        log(f"error: {e}")
        return 2
    finally:
        if server is not None:
            server.stop()
        if repo and not args.keep:
            shutil.rmtree(repo, ignore_errors=True)
        if work:
            if not args.keep and not interrupted and all(r["ok"] for r in rows):
                shutil.rmtree(work, ignore_errors=True)
            else:
                log(f"kept perf_analyzer logs and server logs in {work}")
    if interrupted:
        return 130

    wall = time.monotonic() - t0
    summary = summarize(rows)
    print()
    print("\n".join(summary_lines(summary, markdown=False)))
    if not args.no_write:
        vers = versions(args.python, meta.get("triton", {}), meta.get("modelhost", {}))
        write_markdown(args.out, args, command, started, wall, machine_info(), vers, rows, summary,
                       (load0, os.getloadavg()[0]), notes)
        log(f"wrote {args.out}")
    return 0 if rows and all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
