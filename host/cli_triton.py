"""`tritonserver` flags that `modelhost serve` takes with Triton's meaning.

Kept apart from `host.cli` so the flag table, its parsing and its checks sit together. What
each flag does here, and where modelhost differs, is in docs/triton_compat.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path
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
    flag(p, "--model-namespacing", "Triton's model namespacing: models of the same name may be "
         "in several repositories; a request naming one of those is refused as ambiguous, an "
         "ensemble uses the one in its own repository first (host.namespacing)")
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
    # gRPC keepalive: passed to the gRPC server as Triton passes them (same defaults).
    for name, default, help in GRPC_KEEPALIVE:
        p.add_argument(f"--{name}", type=int, default=default, metavar="N", help=help)
    flag(p, "--grpc-keepalive-permit-without-calls", "let clients send keepalive pings with no "
         "call in flight (Triton's default false)", default=False)
    flag(p, "--allow-gpu-metrics", f"{NO_EFFECT} GPU metrics are reported when a GPU is in use",
         default=True)
    flag(p, "--enable-peer-access", f"{NO_EFFECT} tensors do not move between GPUs here",
         default=True)
    p.add_argument("--host-policy", action="append", type=_host_policy, default=[],
                   metavar="<policy name>,<setting>=<value>",
                   help=f"{NO_EFFECT} instances are not bound to NUMA nodes or CPU sets by policy "
                        "(checked as Triton checks it)")
    p.add_argument("--repoagent-directory", default="/opt/tritonserver/repoagents", metavar="DIR",
                   help="where repository agents are found: <DIR>/<name>/libtritonrepoagent_<name>.so")
    p.add_argument("--buffer-manager-thread-count", type=int, default=0, metavar="N",
                   help=f"{NO_EFFECT} tensors are not copied by a pool of threads here")
    # Triton's cloud front ends (host.http.cloud, docs/deploy.md).
    flag(p, "--allow-sagemaker", "serve SageMaker's inference container API (/ping, "
         "/invocations, /models) on --sagemaker-port", default=False)
    p.add_argument("--sagemaker-port", type=int, default=8080, metavar="PORT",
                   help="port of the SageMaker front end")
    p.add_argument("--sagemaker-safe-port-range", type=_port_range, default=None, metavar="MIN-MAX",
                   help="with --allow-sagemaker: every other endpoint's port must lie in this range")
    p.add_argument("--sagemaker-thread-count", type=int, default=8, metavar="N",
                   help=f"{NO_EFFECT} each connection is served by its own thread")
    flag(p, "--allow-vertex-ai", "serve Vertex AI's prediction container API on --vertex-ai-port "
         "(default: true when AIP_MODE=PREDICTION, which also turns HTTP and gRPC off unless "
         "they are asked for)", default=None)
    p.add_argument("--vertex-ai-port", type=int, default=None, metavar="PORT",
                   help="port of the Vertex AI front end (default: AIP_HTTP_PORT, else 8080)")
    p.add_argument("--vertex-ai-thread-count", type=int, default=8, metavar="N",
                   help=f"{NO_EFFECT} each connection is served by its own thread")
    p.add_argument("--vertex-ai-default-model", default="", metavar="MODEL",
                   help="the model the Vertex AI predict route serves (default: the "
                        "repository's only model)")


# (flag, Triton's default, help): the gRPC server's keepalive channel arguments (host.grpc.server).
GRPC_KEEPALIVE = (
    ("grpc-keepalive-time", 7200000, "ms between keepalive pings the server sends"),
    ("grpc-keepalive-timeout", 20000, "ms the server waits for a ping's answer"),
    ("grpc-http2-max-pings-without-data", 2, "pings a client may send with no data sent"),
    ("grpc-http2-min-recv-ping-interval-without-data", 300000,
     "least ms between a client's pings when no data is sent"),
    ("grpc-http2-max-ping-strikes", 2, "bad pings before the connection is closed"),
    ("grpc-max-connection-age", 0, "ms a connection may live (0: for ever)"),
    ("grpc-max-connection-age-grace", 0, "ms calls may finish after that (0: for ever)"),
)


def _host_policy(text: str) -> tuple[str, str, str]:
    """`<policy name>,<setting>=<value>` (Triton's ParseGenericConfigOption and its text)."""
    name, comma, rest = text.partition(",")
    setting, eq, value = rest.partition("=")
    if not comma or not eq:
        raise argparse.ArgumentTypeError(
            f"--host-policy option format is '<policy name>,<setting>=<value>'. Got {text}")
    return name, setting, value


def _port_range(text: str) -> tuple[int, int]:
    low, dash, high = text.partition("-")
    try:
        if not dash:
            raise ValueError
        return int(low), int(high)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected <min>-<max>, got '{text}'") from None


def vertex_prediction_mode() -> bool:
    """AIP_MODE=PREDICTION: Vertex AI runs the container (Triton then serves Vertex AI, and HTTP
    and gRPC only when asked)."""
    import os

    return os.environ.get("AIP_MODE", "") == "PREDICTION"


def options(args: argparse.Namespace) -> dict[str, Any]:
    """The ServerOptions fields of these flags; refuses what cannot be honoured."""
    import os

    vertex_port = args.vertex_ai_port
    if vertex_port is None:
        try:
            vertex_port = int(os.environ.get("AIP_HTTP_PORT", "8080"))
        except ValueError:
            raise SystemExit("modelhost: AIP_HTTP_PORT must be a port number, got "
                             f"'{os.environ.get('AIP_HTTP_PORT')}'") from None
    allow_vertex = args.allow_vertex_ai if args.allow_vertex_ai is not None else vertex_prediction_mode()
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
        "model_namespacing": args.model_namespacing,
        "pinned_memory_pool_byte_size": args.pinned_memory_pool_byte_size,
        "cuda_memory_pool_byte_size": dict(args.cuda_memory_pool_byte_size),
        "cuda_virtual_address_size": dict(args.cuda_virtual_address_size),
        "min_supported_compute_capability": args.min_supported_compute_capability,
        "grpc_infer_thread_count": args.grpc_infer_thread_count,
        "grpc_infer_allocation_pool_size": args.grpc_infer_allocation_pool_size,
        "grpc_keepalive": {name: getattr(args, name.replace("-", "_")) for name, _, _ in GRPC_KEEPALIVE}
        | {"grpc-keepalive-permit-without-calls": int(bool(args.grpc_keepalive_permit_without_calls))},
        "repoagent_directory": Path(args.repoagent_directory),
        "allow_sagemaker": bool(args.allow_sagemaker),
        "sagemaker_port": args.sagemaker_port,
        "sagemaker_safe_port_range": args.sagemaker_safe_port_range,
        "allow_vertex_ai": bool(allow_vertex),
        "vertex_ai_port": vertex_port,
        "vertex_ai_default_model": args.vertex_ai_default_model or "",
    }
