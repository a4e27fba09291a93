"""`tritonserver` flags that `modelhost serve` takes with Triton's meaning.

Kept apart from `host.cli` so the flag table, its parsing and its checks sit together. What
each flag does here, and where modelhost differs, is in docs/triton_compat.md.
"""

from __future__ import annotations

import argparse
from typing import Any

RATE_LIMIT_MODES = ("off", "execution_count")
NO_EFFECT = "accepted for compatibility, no effect here:"


def _backend_setting(text: str) -> tuple[str, str, str]:
    """`<backend>,<setting>=<value>`, or `<setting>=<value>` for every backend: Triton's parse
    (the first comma ends the backend name, the first `=` after it the setting) and texts."""
    comma = text.find(",")
    if comma == 0:
        raise argparse.ArgumentTypeError(
            "No backend specified. --backend-config option format is <backend name>,<setting>="
            f"<value> or <setting>=<value>. Got {text}")
    eq = text.find("=", comma + 1)
    setting, value = text[comma + 1:eq], text[eq + 1:]
    if eq < 0 or not setting or not value:
        raise argparse.ArgumentTypeError(
            f"--backend-config option format is '<backend name>,<setting>=<value>'. Got {text}")
    return (text[:comma] if comma > 0 else ""), setting, value


def _device_size(text: str) -> tuple[int, int]:
    """`<device id>:<byte size>`."""
    device, colon, size = text.partition(":")
    try:
        if not colon:
            raise ValueError
        pair = int(device), int(size)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected <device id>:<byte size>, got '{text}'") from None
    if pair[0] < 0 or pair[1] < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got '{text}'")
    return pair


def _rate_limit_resource(text: str) -> str:
    """`<name>:<count>[:<device>]`, checked as Triton checks it."""
    parts = text.split(":")
    try:
        if len(parts) not in (2, 3) or not parts[0]:
            raise ValueError
        for number in parts[1:]:
            int(number)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected <resource name>:<count>[:<device>], got '{text}'") from None
    return text


def _gpu_limit(text: str) -> tuple[int, float]:
    """`<device id>:<fraction>` (--model-load-gpu-limit); range checks in options(), with
    Triton's texts."""
    device, colon, fraction = text.partition(":")
    try:
        if not colon:
            raise ValueError
        return int(device), float(fraction)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected <device id>:<fraction>, got '{text}'") from None


# Flags whose value may start with '-' (`--model-load-gpu-limit -1:0.6`, as Triton's QA passes
# it): argparse would take such a value for an option, so it is joined to its flag first.
NEGATIVE_VALUE_FLAGS = ("--model-load-gpu-limit",)


def join_negative_values(argv: list[str]) -> list[str]:
    out: list[str] = []
    tokens = iter(argv)
    for token in tokens:
        if token in NEGATIVE_VALUE_FLAGS:
            value = next(tokens, None)
            if value is not None and value.startswith("-") and not value.startswith("--"):
                out.append(f"{token}={value}")
                continue
            out.append(token)
            if value is not None:
                out.append(value)
            continue
        out.append(token)
    return out


def add_flags(p: argparse.ArgumentParser, flag: Any) -> None:
    """Add the flags to the `serve` parser; `flag` adds a Triton-style boolean."""
    p.add_argument("--id", dest="server_id", default="modelhost", metavar="NAME",
                   help="identifier of this server: the name the server metadata reports")
    p.add_argument("--backend-config", action="append", type=_backend_setting, default=[],
                   metavar="[BACKEND,]SETTING=VALUE",
                   help="a backend configuration setting (repeatable); without BACKEND it goes to "
                        "every backend. Native backends read them from their backend config "
                        "JSON ({\"cmdline\": {...}}); python backend settings about its stub "
                        "processes and their shared memory have no effect (models run in process)")
    p.add_argument("--disable-auto-complete-config", action="store_true",
                   help="backends do not complete model configurations: every config.pbtxt "
                        "must give its inputs, outputs and batch size")
    p.add_argument("--model-config-name", default=None, metavar="NAME",
                   help="load <model>/configs/NAME.pbtxt where it exists, else config.pbtxt")
    p.add_argument("--rate-limit", choices=RATE_LIMIT_MODES, default="off", type=str.lower,
                   help="'off': requests run as soon as an instance is free, instance_group "
                        "rate_limiter sections are ignored; 'execution_count': instances run "
                        "only with the resources their rate_limiter names, by priority")
    p.add_argument("--rate-limit-resource", action="append", type=_rate_limit_resource,
                   default=[], metavar="NAME:COUNT[:DEVICE]",
                   help="the units of a rate-limiter resource (on DEVICE, else on every device); "
                        "by default the most any one instance needs")
    p.add_argument("--pinned-memory-pool-byte-size", type=int, default=256 * 1024 * 1024,
                   metavar="BYTES",
                   help=f"{NO_EFFECT} tensors live in numpy (and cupy) memory, not in a pool")
    p.add_argument("--cuda-memory-pool-byte-size", action="append", type=_device_size, default=[],
                   metavar="DEVICE:BYTES",
                   help=f"{NO_EFFECT} device tensors are allocated by their framework (cupy, "
                        "torch), not from a pool")
    p.add_argument("--cuda-virtual-address-size", action="append", type=_device_size, default=[],
                   metavar="DEVICE:BYTES",
                   help=f"{NO_EFFECT} there are no growable implicit-state buffers")
    flag(p, "--model-namespacing", "Triton's model namespacing (models of the same name in "
         "different repositories): only 'false', Triton's default, is supported; 'true' is refused")
    p.add_argument("--grpc-infer-thread-count", type=int, default=2, metavar="N",
                   help=f"{NO_EFFECT} gRPC requests are handled by the front end's own threads; "
                        "checked as Triton checks it (2 to 128)")
    p.add_argument("--grpc-infer-allocation-pool-size", type=int, default=8, metavar="N",
                   help=f"{NO_EFFECT} request and response objects are not pooled")
    p.add_argument("--model-load-gpu-limit", action="append", type=_gpu_limit, default=[],
                   metavar="DEVICE:FRACTION",
                   help=f"{NO_EFFECT} model loads are not held back by GPU memory use here "
                        "(checked as Triton checks it)")
    p.add_argument("--grpc-max-response-pool-size", type=int, default=None, metavar="N",
                   help=f"{NO_EFFECT} responses are not pooled (Triton's cap on the response "
                        "objects a gRPC stream keeps allocated); must be greater than 0")
    p.add_argument("--min-supported-compute-capability", type=float, default=6.0, metavar="CC",
                   help="the lowest CUDA compute capability of a GPU that KIND_GPU instances may "
                        "use (Triton's default 6.0)")
    # Triton's cloud front ends. modelhost has neither; `false` (Triton's default) is accepted so
    # that scripts which spell it out run, `true` is refused with the reason (see `options`).
    for cloud, name in (("sagemaker", "SageMaker"), ("vertex-ai", "Vertex AI")):
        flag(p, f"--allow-{cloud}", f"must stay false: modelhost has no {name} front end")
        p.add_argument(f"--{cloud}-port", type=int, default=None, metavar="PORT",
                       help=f"{NO_EFFECT} there is no {name} front end")
        p.add_argument(f"--{cloud}-thread-count", type=int, default=None, metavar="N",
                       help=f"{NO_EFFECT} there is no {name} front end")
    p.add_argument("--sagemaker-safe-port-range", default=None, metavar="MIN-MAX",
                   help=f"{NO_EFFECT} there is no SageMaker front end")
    p.add_argument("--vertex-ai-default-model", default=None, metavar="MODEL",
                   help=f"{NO_EFFECT} there is no Vertex AI front end")


def options(args: argparse.Namespace) -> dict[str, Any]:
    """The ServerOptions fields of these flags; refuses what cannot be honoured."""
    for allowed, name in ((args.allow_sagemaker, "SageMaker"), (args.allow_vertex_ai, "Vertex AI")):
        if allowed:
            raise SystemExit(
                f"modelhost: there is no {name} front end (Triton's --allow-"
                f"{'sagemaker' if name == 'SageMaker' else 'vertex-ai'}); serve the KServe V2 "
                "HTTP and gRPC endpoints behind the platform's own adapter, or leave the flag out.")
    if args.model_namespacing:
        raise SystemExit(
            "modelhost: --model-namespacing=true is not supported: a model name is unique across "
            "all --model-repository folders here (Triton's --model-namespacing=false). Leave the "
            "flag out or pass --model-namespacing=false.")
    if not 2 <= args.grpc_infer_thread_count <= 128:
        raise SystemExit("modelhost: invalid argument for --grpc_infer_thread_count. Must be in "
                         "the range 2 to 128.")
    if args.grpc_max_response_pool_size is not None and args.grpc_max_response_pool_size <= 0:
        raise SystemExit("modelhost: Error: --grpc-max-response-pool-size must be greater than 0.")
    if args.model_config_name == "":
        raise SystemExit("modelhost: Error: empty argument for --model-config-name")
    for device, fraction in args.model_load_gpu_limit:  # Triton's checks and texts
        if device < 0:
            raise SystemExit("error: setting model load GPU limit: Invalid argument - expects "
                             f"device ID >= 0, got {device}")
        if not 0.0 <= fraction <= 1.0:
            raise SystemExit("error: setting model load GPU limit: Invalid argument - expects "
                             f"limit fraction to be in range [0.0, 1.0], got {fraction:f}")
    backend_config: dict[str, dict[str, str]] = {}
    for backend, setting, value in args.backend_config:
        backend_config.setdefault(backend, {})[setting] = value
    return {
        "server_id": args.server_id,
        "backend_config": backend_config,
        "disable_auto_complete_config": args.disable_auto_complete_config,
        "model_config_name": args.model_config_name or "",
        "rate_limit": args.rate_limit,
        "rate_limit_resources": args.rate_limit_resource,
        "pinned_memory_pool_byte_size": args.pinned_memory_pool_byte_size,
        "cuda_memory_pool_byte_size": dict(args.cuda_memory_pool_byte_size),
        "cuda_virtual_address_size": dict(args.cuda_virtual_address_size),
        "min_supported_compute_capability": args.min_supported_compute_capability,
        "grpc_infer_thread_count": args.grpc_infer_thread_count,
        "grpc_infer_allocation_pool_size": args.grpc_infer_allocation_pool_size,
    }
