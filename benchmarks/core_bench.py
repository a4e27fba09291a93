"""The core's per-request cost: `Host.infer` on the python identity model, in process (no front end).

    python benchmarks/core_bench.py [--requests N]

Prints microseconds per request (wall and process CPU), best of three runs. One short run: a
figure to compare before and after a change to the request path (host/core.py, host/stages.py; docs/core.md).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from host.core import Host
from host.inference import InferenceRequest, Tensor
from host.options import ServerOptions

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=20000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(ROOT / "model_repository" / "identity_fp32", Path(tmp) / "identity_fp32")
        host = Host(ServerOptions(model_repositories=[Path(tmp)]))
        host.start()
        data = np.arange(1024, dtype=np.float32)
        try:
            best_wall = best_cpu = float("inf")
            for _ in range(3):
                wall0, cpu0 = time.perf_counter(), time.process_time()
                for _ in range(args.requests):
                    request = InferenceRequest(model_name="identity_fp32", inputs={
                        "INPUT0": Tensor("INPUT0", "FP32", [1024], data)})
                    host.infer(request)
                wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
                best_wall, best_cpu = min(best_wall, wall), min(best_cpu, cpu)
            n = args.requests
            print(f"Host.infer, python identity FP32[1024], {n} requests x 3: best "
                  f"{best_wall / n * 1e6:.1f} us/request wall, {best_cpu / n * 1e6:.1f} us/request CPU")
        finally:
            host.stop()


if __name__ == "__main__":
    main()
