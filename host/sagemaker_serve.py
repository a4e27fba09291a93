"""`modelhost-sagemaker-serve`: what a SageMaker container runs as its `serve` command.

SageMaker starts an inference container with `docker run IMAGE serve` and configures it through
environment variables. Triton's image ships a `serve` script for that contract; this is the same
contract for modelhost (`deploy/sagemaker/serve` is the one-line `serve` to put on the image's
PATH). It starts `tritonserver` (modelhost with Triton's defaults) with the SageMaker front end on
and the V2 HTTP port off:

- one model (the default): the models of `/opt/ml/model` (`MODELHOST_SAGEMAKER_MODEL_DIR` moves
  it), serving `SAGEMAKER_TRITON_DEFAULT_MODEL_NAME`, or the only model folder there;
- `SAGEMAKER_MULTI_MODEL=true`: no model at start, models loaded through `/models`, `/ping`
  answers liveness.

The `SAGEMAKER_TRITON_*` settings map to flags as in Triton's script (ports, gRPC, metrics,
logging, python-backend shared memory, `SAGEMAKER_TRITON_ADDITIONAL_ARGS`); their checks stop
the container with the same `ERROR:` lines.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Mapping, Sequence

from host.http.cloud import INFERENCE_TYPES

SINGLE_MODEL_DIR = "/opt/ml/model/"
MULTI_MODEL_DIR = "/tmp/sagemaker"

# environment variable -> flag, when set
_PASSED = (
    ("SAGEMAKER_BIND_TO_PORT", "--sagemaker-port"),
    ("SAGEMAKER_SAFE_PORT_RANGE", "--sagemaker-safe-port-range"),
    ("SAGEMAKER_TRITON_METRICS_PORT", "--metrics-port"),
    ("SAGEMAKER_TRITON_GRPC_PORT", "--grpc-port"),
    ("SAGEMAKER_TRITON_BUFFER_MANAGER_THREAD_COUNT", "--buffer-manager-thread-count"),
    ("SAGEMAKER_TRITON_THREAD_COUNT", "--sagemaker-thread-count"),
    ("SAGEMAKER_TRITON_LOG_INFO", "--log-info"),
    ("SAGEMAKER_TRITON_LOG_WARNING", "--log-warning"),
    ("SAGEMAKER_TRITON_LOG_ERROR", "--log-error"),
)
# environment variable -> (flag, value when unset)
_DEFAULTED = (
    ("SAGEMAKER_TRITON_DISABLE_MODEL_NAMESPACING", "--model-namespacing", "true"),
    ("SAGEMAKER_TRITON_ALLOW_GRPC", "--allow-grpc", "false"),
    ("SAGEMAKER_TRITON_ALLOW_METRICS", "--allow-metrics", "false"),
    ("SAGEMAKER_TRITON_LOG_VERBOSE", "--log-verbose", "true"),
)


class SetupError(Exception):
    """The container's settings are wrong: the lines to print, then exit status 1."""


def command(env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """The `tritonserver` arguments for these settings, and the variables to add to the
    environment (the ping mode, a default model found on disk)."""
    extra: dict[str, str] = {}
    multi = env.get("SAGEMAKER_MULTI_MODEL") == "true"
    repo = env.get("MODELHOST_SAGEMAKER_MULTI_MODEL_DIR", MULTI_MODEL_DIR) if multi else \
        env.get("MODELHOST_SAGEMAKER_MODEL_DIR", SINGLE_MODEL_DIR)
    extra["SAGEMAKER_TRITON_PING_MODE"] = env.get("SAGEMAKER_TRITON_OVERRIDE_PING_MODE") or (
        "live" if multi else "ready")
    if multi:
        os.makedirs(repo, exist_ok=True)
        print("Triton is running in SageMaker MME mode. Using Triton ping mode: "
              f"\"{extra['SAGEMAKER_TRITON_PING_MODE']}\"", flush=True)
    args = [f"--model-repository={repo}"]
    for name, flag, default in _DEFAULTED:
        args.append(f"{flag}={env.get(name) or default}")
    for name, flag in _PASSED:
        if env.get(name):
            args.append(f"{flag}={env[name]}")
    args.append("--backend-config=python,shm-default-byte-size="
                + (env.get("SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE") or "16777216"))
    args.append("--backend-config=python,shm-growth-byte-size="
                + (env.get("SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE") or "1048576"))
    if env.get("SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT"):
        from host.devices import supported_gpus

        for device in sorted(supported_gpus()):
            args += ["--model-load-gpu-limit", f"{device}:{env['SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT']}"]
    if env.get("SAGEMAKER_TRITON_ADDITIONAL_ARGS"):
        args += shlex.split(env["SAGEMAKER_TRITON_ADDITIONAL_ARGS"])
    if not multi and Path(repo, "config.pbtxt").is_file():
        raise SetupError("ERROR: Incorrect directory structure.\n"
                         "       Model directory needs to contain the top level folder")
    kind = env.get("SAGEMAKER_TRITON_INFERENCE_TYPE")
    if kind and kind not in INFERENCE_TYPES:
        raise SetupError(f"ERROR: Invalid SAGEMAKER_TRITON_INFERENCE_TYPE '{kind}'\n"
                         "       Must be one of: infer, generate, generate_stream")
    if not multi:
        model = env.get("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME")
        if model:
            if not Path(repo, model).is_dir():
                raise SetupError("ERROR: Directory with provided SAGEMAKER_TRITON_DEFAULT_MODEL_NAME "
                                 f"{model} does not exist")
        else:
            try:
                folders = sorted(e.name for e in os.scandir(repo) if e.is_dir())
            except OSError:
                folders = []
            if not folders:
                raise SetupError("ERROR: No model found in model repository")
            if len(folders) > 1:
                raise SetupError(
                    "ERROR: More than 1 model directory found in model repository.\n"
                    "       Either provide a single directory or set "
                    "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME to run the ensemble backend.\n"
                    f"       Directories found in model repository: {' '.join(folders)}")
            model = folders[0]
            print("WARNING: No SAGEMAKER_TRITON_DEFAULT_MODEL_NAME provided.\n"
                  f"         Starting with the only existing model directory {model}", flush=True)
            extra["SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"] = model
        args.append(f"--load-model={model}")
    return ["--allow-sagemaker=true", "--allow-http=false", "--model-control-mode=explicit", *args], extra


def main(argv: Sequence[str] | None = None) -> int:
    from host.tritonserver import main as tritonserver_main

    try:
        args, extra = command(os.environ)
    except SetupError as exc:
        print(exc, flush=True)
        return 1
    os.environ.update(extra)  # read by the SageMaker front end (host.http.cloud)
    return tritonserver_main([*args, *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
