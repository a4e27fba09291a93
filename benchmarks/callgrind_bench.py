#!/usr/bin/env python3
"""Instructions per request in the modelhost server, counted by valgrind's callgrind.

Wall-clock and CPU-time figures swing by tens of percent on a shared machine; the number of
instructions the server executes per request does not (a few percent). This starts `modelhost serve`
under `valgrind --tool=callgrind --instr-atstart=no` with the identity models of
benchmarks/native_bench.py (native `identity_native`, python `identity_py`, FP32[1024]), warms each
path up, then for each (model, protocol) switches counting on, sends N requests one after another
from this process (tritonclient; the client is not counted), switches it off and reads the total.

    python benchmarks/callgrind_bench.py [--requests 300] [--protocol http grpc grpc-stream]

Needs valgrind (apt install valgrind). Counts every thread of the server process, the front end's
included; the python model runs in process, so its instructions are in the figure too.
"""
from __future__ import annotations

import argparse
import glob
import itertools
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import native_bench as nb  # noqa: E402
import perf_vs_triton as pvt  # noqa: E402
import sequence_bench as sb  # noqa: E402

SEQUENCES = 4  # sequence models: requests go to this many sequences in turn, one at a time
_first_ids = itertools.count(1, SEQUENCES)  # each row's sequences get ids of their own


def callgrind_control(pid: int, *args: str) -> str:
    return subprocess.run(["callgrind_control", *args, str(pid)], capture_output=True, text=True,
                          check=True, timeout=300).stdout


def h1c_for_valgrind(outdir: str) -> str:
    """gunicorn_h1c rebuilt without SSE4.2: valgrind stops at its parser's PCMPESTRI ("illegal
    opcode"). Its sources ship in the wheel; returns a folder to put first on PYTHONPATH."""
    import gunicorn_h1c
    import sysconfig
    src = os.path.dirname(gunicorn_h1c.__file__)
    dst = os.path.join(outdir, "h1c", "gunicorn_h1c")
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    for module, source in (("_parser", "pico_parser_module.c"), ("_parser_fast", "pico_parser_fast.c"),
                           ("_protocol", "pico_protocol.c")):
        subprocess.run(["gcc", "-O2", "-fPIC", "-shared", "-mno-sse4.2", "-I", sysconfig.get_paths()["include"],
                        "-I", "picohttpparser", source, "picohttpparser/picohttpparser.c",
                        "-o", module + suffix], cwd=dst, check=True)
    return os.path.dirname(dst)


# `modelhost serve` without gunicorn's fork (callgrind_control cannot reach a forked child): the
# worker's own start-up (host.serve.ServerApplication.load) and its HTTP server, in one process.
LAUNCHER = """
import sys, threading
from pathlib import Path
from host.options import ServerOptions
from host.serve import ServerApplication
from host.http.server import HTTPServer
repo, http_port, grpc_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
options = ServerOptions(model_repositories=[Path(repo)], http_address="127.0.0.1", http_port=http_port,
                        grpc_address="127.0.0.1", grpc_port=grpc_port, allow_metrics=False)
wsgi = ServerApplication(options).load()
HTTPServer.bind(wsgi, "127.0.0.1", http_port, keepalive_timeout=120.0).serve_forever()
"""


def total_ir(outdir: str, before: set[str]) -> tuple[int, str]:
    """The Ir total of the dump file written since `before` (callgrind_control --dump)."""
    for _ in range(600):
        new = sorted(set(glob.glob(os.path.join(outdir, "callgrind.out*"))) - before)
        for path in new:
            with open(path, errors="replace") as f:
                text = f.read()
            m = re.search(r"^totals:\s*(\d+)", text, re.M)
            if m:
                return int(m.group(1)), path
        time.sleep(0.1)
    raise RuntimeError("no callgrind dump appeared")


def make_sender(protocol: str, port_http: int, port_grpc: int, model: str):
    if model in sb.STRATEGIES.values():
        return sequence_sender(protocol, port_http, port_grpc, model)
    data = np.arange(1024, dtype=np.float32)
    if protocol == "http":
        import tritonclient.http as http
        client = http.InferenceServerClient(f"127.0.0.1:{port_http}")
        inp = http.InferInput("INPUT0", [1024], "FP32")
        inp.set_data_from_numpy(data, binary_data=True)
        out = [http.InferRequestedOutput("OUTPUT0", binary_data=True)]
        return lambda: client.infer(model, [inp], outputs=out), client.close
    import tritonclient.grpc as grpc
    client = grpc.InferenceServerClient(f"127.0.0.1:{port_grpc}")
    inp = grpc.InferInput("INPUT0", [1024], "FP32")
    inp.set_data_from_numpy(data)
    if protocol == "grpc":
        return lambda: client.infer(model, [inp]), client.close
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put(error))

    def send():
        client.async_stream_infer(model, [inp])
        error = results.get(timeout=120)
        if error is not None:
            raise RuntimeError(error)

    def close():
        client.stop_stream()
        client.close()
    return send, close


def sequence_sender(protocol: str, port_http: int, port_grpc: int, model: str):
    """Requests of the example accumulator (benchmarks/sequence_bench.py), one at a time, to
    SEQUENCES sequences in turn (so the direct strategy pads as it does when they interleave);
    each sequence starts with its first request and never ends (warm-up and counting are alike),
    and each sender starts sequences of its own, so that no row continues or restarts another's."""
    import tritonclient.grpc as grpc
    import tritonclient.http as http
    module = http if protocol == "http" else grpc
    client = module.InferenceServerClient(f"127.0.0.1:{port_http if protocol == 'http' else port_grpc}")
    inp = module.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.ones((1, 1), np.int32), **({"binary_data": True} if protocol == "http" else {}))
    sent = [0]
    first = next(_first_ids)
    results: queue.Queue = queue.Queue()
    if protocol == "grpc-stream":
        client.start_stream(callback=lambda result, error: results.put(error))

    def send():
        n = sent[0]
        sent[0] += 1
        kwargs = {"sequence_id": first + n % SEQUENCES, "sequence_start": n < SEQUENCES}
        if protocol != "grpc-stream":
            client.infer(model, [inp], **kwargs)
            return
        client.async_stream_infer(model, [inp], **kwargs)
        error = results.get(timeout=120)
        if error is not None:
            raise RuntimeError(error)

    def close():
        if protocol == "grpc-stream":
            client.stop_stream()
        client.close()
    return send, close


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--protocol", nargs="+", default=["http", "grpc", "grpc-stream"], choices=sorted(pvt.MODES))
    ap.add_argument("--model", nargs="+", default=[nb.NATIVE, nb.PYTHON],
                    help=f"identity models, or the accumulator: {', '.join(sb.STRATEGIES.values())}")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--source", help="measure the modelhost source tree here instead (e.g. an older commit, "
                    "from `git archive`, with the compiled host/native modules copied in)")
    ap.add_argument("--keep", action="store_true", help="keep the callgrind dumps (for callgrind_annotate)")
    args = ap.parse_args(argv)
    if not shutil.which("valgrind"):
        print("valgrind is not installed", file=sys.stderr)
        return 2
    repo = nb.build_repository(args.python)
    sb.add_models(repo)
    outdir = tempfile.mkdtemp(prefix="callgrind_bench_")
    server = pvt.modelhost_server(repo, outdir, args.python)
    server.env["PYTHONPATH"] = ":".join(
        [h1c_for_valgrind(outdir), *([args.source] if args.source else []), server.env["PYTHONPATH"]])
    if args.source:
        server.cwd = args.source
    server.argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--trace-children=no",
                   f"--callgrind-out-file={outdir}/callgrind.out.%p", args.python, "-c", LAUNCHER, repo,
                   str(server.http_port), str(server.grpc_port)]
    pvt.MODEL = nb.NATIVE
    old_timeout, pvt.START_TIMEOUT = pvt.START_TIMEOUT, 600
    rows = []
    try:
        server.start()
        nb.wait_ready(server, nb.PYTHON, timeout=300)
        pid = server.proc.pid
        for model in args.model:
            for protocol in args.protocol:
                send, close = make_sender(protocol, server.http_port, server.grpc_port, model)
                try:
                    for _ in range(args.warmup):
                        send()
                    before = set(glob.glob(os.path.join(outdir, "callgrind.out*")))
                    callgrind_control(pid, "--zero")
                    callgrind_control(pid, "--instr=on")
                    for _ in range(args.requests):
                        send()
                    callgrind_control(pid, "--instr=off")
                    callgrind_control(pid, f"--dump={model}.{protocol}")
                    ir, path = total_ir(outdir, before)
                finally:
                    close()
                rows.append((model, protocol, ir / args.requests, path))
                pvt.log(f"{model:15s} {protocol:11s} {ir / args.requests:12,.0f} instructions/request")
    finally:
        pvt.START_TIMEOUT = old_timeout
        server.stop()
        shutil.rmtree(repo, ignore_errors=True)
    print("| model | protocol | instructions per request |\n|---|---|---:|")
    for model, protocol, per, _ in rows:
        print(f"| {model} | {protocol} | {per:,.0f} |")
    if args.keep:
        print(f"dumps in {outdir}")
    else:
        shutil.rmtree(outdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
