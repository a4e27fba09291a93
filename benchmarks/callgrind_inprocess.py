#!/usr/bin/env python3
"""Instructions per in-process request, counted by valgrind's callgrind: the host's own path.

`callgrind_bench.py` counts a whole server (front end included) and takes minutes per protocol
under valgrind. This one counts only `Host.infer` called from one thread, for the python identity
and the ensembles of `ensemble_bench.py` (FP32[1024]): the stages, schedulers, python backend and
ensemble scheduler every front end shares. It takes about a minute, and its counts are steady to
well under 1 %, so an A/B of two trees (`--source`) shows changes of a percent.

    python benchmarks/callgrind_inprocess.py [--requests 200]
        [--model identity_py ensemble_1 ensemble_3 sequence_direct sequence_oldest] [--source DIR]

`sequence_direct` and `sequence_oldest` are the example accumulator (model_repository/
sequence_accumulator) under each strategy, sent four sequences in turn (INT32[1,1] requests with
their correlation ids): under the direct strategy every other request then gets a padding row
below it (a lower slot without a request), as batches of concurrent sequences do.

Needs valgrind (apt install valgrind). It runs itself under valgrind with instrumentation off, and
switches it on (`callgrind_control -i on`) around the measured requests of each model.
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = ["identity_py", "ensemble_1", "ensemble_3", "sequence_direct", "sequence_oldest"]
SEQUENCES = 4  # sequences sent in turn to a sequence model


def _control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(os.getpid())], capture_output=True, check=True,
                   timeout=300)


def measure_here(repo: str, requests: int, models: list[str]) -> None:
    """Runs under valgrind: warm each model up, then count `requests` calls of it (one dump each)."""
    import numpy as np

    from host.core import Host
    from host.inference import InferenceRequest, Tensor
    from host.options import ServerOptions

    host = Host(ServerOptions(model_repositories=[repo]))
    host.start()
    x = np.ones(1024, np.float32)
    one = np.ones((1, 1), np.int32)
    try:
        for model in models:
            if model.startswith("sequence_"):
                # ids 1..SEQUENCES, each started in the warm-up and never ended (no END flag)
                for n in range(50 + SEQUENCES):
                    host.infer(InferenceRequest(model, inputs={"INPUT": Tensor("INPUT", "INT32", [1, 1], one)},
                                                sequence_id=n % SEQUENCES + 1, sequence_start=n < SEQUENCES))
                _control("-z")
                _control("-i", "on")
                for n in range(requests):
                    host.infer(InferenceRequest(model, inputs={"INPUT": Tensor("INPUT", "INT32", [1, 1], one)},
                                                sequence_id=n % SEQUENCES + 1))
                _control("-i", "off")
                _control("-d", model)
                continue
            for _ in range(50):
                host.infer(InferenceRequest(model, inputs={"INPUT0": Tensor("INPUT0", "FP32", [1024], x)}))
            _control("-z")
            _control("-i", "on")
            for _ in range(requests):  # inline, as the warm-up: no call of the harness's own counted
                host.infer(InferenceRequest(model, inputs={"INPUT0": Tensor("INPUT0", "FP32", [1024], x)}))
            _control("-i", "off")
            _control("-d", model)
    finally:
        host.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--model", nargs="+", default=MODELS, choices=MODELS)
    ap.add_argument("--source", help="measure the modelhost tree here (e.g. an older commit)")
    ap.add_argument("--in-valgrind", nargs=2, metavar=("REPO", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.in_valgrind:
        measure_here(args.in_valgrind[0], args.requests, args.model)
        return 0

    sys.path.insert(0, HERE)
    import ensemble_bench

    work = tempfile.mkdtemp(prefix="callgrind_inprocess_")
    repo = ensemble_bench.build_repository(work)
    import sequence_bench
    with open(os.path.join(sequence_bench.EXAMPLE, "config.pbtxt")) as f:
        config = f.read()
    for name in ("sequence_direct", "sequence_oldest"):
        os.makedirs(os.path.join(repo, name, "1"))
        shutil.copyfile(os.path.join(sequence_bench.EXAMPLE, "1", "model.py"),
                        os.path.join(repo, name, "1", "model.py"))
        text = config.replace('name: "sequence_accumulator"', f'name: "{name}"')
        if name == "sequence_oldest":
            text = text.replace("direct { }", "oldest { max_candidate_sequences: 8 }")
        with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
            f.write(text)
    env = dict(os.environ)
    source = os.path.abspath(args.source) if args.source else os.path.dirname(HERE)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (source, env.get("PYTHONPATH")) if p)
    out = os.path.join(work, "callgrind.out")
    subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
                    sys.executable, os.path.abspath(__file__), "--requests", str(args.requests),
                    "--model", *args.model, "--in-valgrind", repo, out],
                   cwd=work, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dumps = sorted(glob.glob(out + ".*"), key=lambda p: int(p.rsplit(".", 1)[1]))
    print(f"instructions per request, in process ({args.requests} requests each; tree {source}):")
    for model, dump in zip(args.model, dumps):
        with open(dump) as f:
            total = next(int(line.split()[1]) for line in f if line.startswith("totals:"))
        print(f"- {model}: {total // args.requests:,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
