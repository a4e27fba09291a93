#!/usr/bin/env python3
"""The transport tests over every supported version of the two dependencies whose private parts the
front ends use, each behind one module:

- grpcio (`grpc._cython.cygrpc`, only in host/grpc/server.py): every minor release the pin in
  pyproject.toml admits, at its latest patch;
- gunicorn_h1c (a private key of its environ, only in host/http/h1c.py, with a public fallback):
  the oldest release gunicorn[fast] admits and the newest.

For each version: `pip install --no-deps --target DIR pkg==version`, then the tests below with DIR
first on PYTHONPATH (the servers the tests start inherit it). Run by CI after the suite
(`tox -e deps`); about 20-40 s a version.

    python scripts/dependency_matrix.py [--only grpcio|gunicorn_h1c] [--versions 1.85.1 ...]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")

# Keep in step with pyproject.toml: grpcio>=1.81.1,<1.86; gunicorn[fast] needs gunicorn_h1c>=0.6.9.
MATRIX = {
    "grpcio": {
        "versions": ["1.81.2", "1.82.3", "1.83.2", "1.84.2", "1.85.1"],
        "check": "import grpc, sys; assert grpc.__version__ == sys.argv[1], grpc.__version__",
        "tests": ["test_grpc.py", "-k", "infer_raw or unknown_model or stream_repeat or stream_cancellation "
                  "or unary_deadline or compression_on_the_wire or bind_failure or slow_calls "
                  "or concurrent_unary_clients or invalid_request"],
    },
    "gunicorn_h1c": {
        "versions": ["0.6.9", "0.6.10"],
        "check": "import importlib.metadata as m, sys; v = m.version('gunicorn_h1c'); assert v == sys.argv[1], v",
        "tests": ["test_gunicorn_settings.py", "test_e2e_http.py", "-k", "not slow"],
    },
}


def run_one(package: str, version: str, spec: dict, workdir: str) -> tuple[bool, str]:
    target = os.path.join(workdir, f"{package}-{version}")
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target, f"{package}=={version}"]
    if subprocess.run(pip).returncode != 0:
        return False, "pip install failed"
    env = dict(os.environ, PYTHONPATH=target + (os.pathsep + os.environ["PYTHONPATH"]
                                                if os.environ.get("PYTHONPATH") else ""))
    if subprocess.run([sys.executable, "-c", spec["check"], version], env=env).returncode != 0:
        return False, "the installed version is not the one imported"
    rc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *spec["tests"]],
                        env=env, cwd=TESTS).returncode
    return rc == 0, f"pytest rc={rc}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=sorted(MATRIX))
    ap.add_argument("--versions", nargs="+", help="these versions only (with --only)")
    args = ap.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="dependency_matrix_") as workdir:
        for package, spec in MATRIX.items():
            if args.only and package != args.only:
                continue
            for version in args.versions or spec["versions"]:
                t0 = time.monotonic()
                ok, why = run_one(package, version, spec, workdir)
                results.append((package, version, ok, why, time.monotonic() - t0))
                print(f"== {package} {version}: {'ok' if ok else 'FAILED (' + why + ')'} "
                      f"({time.monotonic() - t0:.0f} s)", flush=True)
    failed = [r for r in results if not r[2]]
    print(f"{len(results) - len(failed)}/{len(results)} dependency versions pass")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
