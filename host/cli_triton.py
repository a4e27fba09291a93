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
    """`<backend>,<setting>=<value>`, or `<setting>=<value>` for every backend (Triton's forms)."""
    head, eq, value = text.partition("=")
    if not eq:
        raise argparse.ArgumentTypeError(
            f"expected <backend>,<setting>=<value> or <setting>=<value>, got '{text}'")
    backend, comma, setting = head.partition(",")
    if not comma:
        backend, setting = "", head
    if not setting.strip() or (comma and not backend.strip()):
        raise argparse.ArgumentTypeError(
            f"expected <backend>,<setting>=<value> or <setting>=<value>, got '{text}'")
    return backend.strip(), setting.strip(), value


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
    p.add_argument("--rate-limit", choices=RATE_LIMIT_MODES, default="off",
                   help="only 'off' (requests run as soon as an instance is free); "
                        "'execution_count' is refused: there is no rate limiter here")
    p.add_argument("--rate-limit-resource", action="append", type=_rate_limit_resource,
                   default=[], metavar="NAME:COUNT[:DEVICE]",
                   help=f"{NO_EFFECT} resources only matter to the rate limiter, which is off")
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
    p.add_argument("--grpc-max-response-pool-size", type=int, default=None, metavar="N",
                   help=f"{NO_EFFECT} responses are not pooled (Triton's cap on the response "
                        "objects a gRPC stream keeps allocated); must be greater than 0")
    p.add_argument("--min-supported-compute-capability", type=float, default=6.0, metavar="CC",
                   help="the lowest CUDA compute capability of a GPU that KIND_GPU instances may "
                        "use (Triton's default 6.0)")


def options(args: argparse.Namespace) -> dict[str, Any]:
    """The ServerOptions fields of these flags; refuses what cannot be honoured."""
    if args.rate_limit != "off":
        raise SystemExit(
            f"modelhost: --rate-limit={args.rate_limit} is not supported: modelhost has no rate "
            "limiter, requests run as soon as a model instance is free (Triton's "
            "--rate-limit=off). Leave the flag out or pass --rate-limit=off.")
    if args.grpc_max_response_pool_size is not None and args.grpc_max_response_pool_size <= 0:
        raise SystemExit("modelhost: Error: --grpc-max-response-pool-size must be greater than 0.")
    if args.model_config_name == "":
        raise SystemExit("modelhost: empty argument for --model-config-name")
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
    }
