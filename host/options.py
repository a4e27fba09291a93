"""Server options: one record, filled by the CLI or by an embedder."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from host.trace import TraceConfig

CONTROL_MODES = ("none", "explicit", "poll")


@dataclass
class ServerOptions:
    # local folders, and cloud repositories as the path text (host.storage: s3://...)
    model_repositories: list[Path | str] = field(default_factory=lambda: [Path("model_repository")])
    model_control_mode: str = "none"
    load_models: list[str] = field(default_factory=list)  # explicit mode; "*" loads all
    repository_poll_secs: float = 15.0
    backend_directory: Path | None = None
    exit_on_error: bool = False
    # `--exit-on-error=false` given: as Triton then, a repository that cannot be read does not stop
    # the server; it serves, not live and not ready, with no model (Host.start).
    serve_without_repository: bool = False
    strict_model_config: bool = False
    blocked_plugins: list[str] = field(default_factory=list)
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    http_thread_count: int = 16
    http_max_input_size: int = 64 * 1024 * 1024
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    grpc_compression_level: str = "none"  # none | low | medium | high (responses)
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 8002
    allow_http: bool = True  # false: no KServe V2 HTTP port (a cloud front end may still serve)
    allow_grpc: bool = True
    # SO_REUSEPORT on the HTTP / gRPC listening socket (Triton's --reuse-http-port,
    # --reuse-grpc-port): several servers share the port, the kernel spreads the connections.
    reuse_http_port: bool = False
    reuse_grpc_port: bool = False
    allow_metrics: bool = True
    allow_client_shm: bool = False  # register/unregister client shared memory (off: refused)
    log_verbose: int = 0
    exit_timeout_secs: float = 30.0
    # on SIGTERM/SIGINT, idle HTTP keep-alive connections are served until they close (Triton)
    exit_wait_idle_connections: bool = True
    model_load_thread_count: int = 4
    model_load_retry_count: int = 0  # a version that fails to load is tried this many times more
    # host.affinity: the CPU of the threads that run Python on the request path ('auto', 'off', N)
    python_cpu: str = "auto"
    # host.frontend: N > 1 runs N front-end processes (HTTP, gRPC) before one engine process
    frontend_processes: int = 1
    # Response cache: --cache-config NAME,KEY=VALUE settings by cache name, and where native
    # caches (<dir>/<name>/libtritoncache_<name>.so) are searched.
    cache_config: dict[str, dict[str, str]] = field(default_factory=dict)
    cache_directory: Path | None = None
    # Who may do what (host.restricted): Triton's `<category>[,...]:<key>=<value>` values.
    http_restricted_api: list[str] = field(default_factory=list)
    grpc_restricted_protocol: list[str] = field(default_factory=list)
    # TLS: gRPC as Triton's --grpc-use-ssl flags; HTTPS with --http-ssl-* (host.tls).
    grpc_use_ssl: bool = False
    grpc_use_ssl_mutual: bool = False
    grpc_server_cert: Path | None = None
    grpc_server_key: Path | None = None
    grpc_root_cert: Path | None = None
    http_ssl_cert: Path | None = None
    http_ssl_key: Path | None = None
    http_ssl_root_cert: Path | None = None
    http_ssl_mutual: bool = False
    # Observability (docs/observability.md): tracing from --trace-config; request headers that
    # match these patterns become request parameters; metrics from --metrics-config.
    trace: TraceConfig | None = None
    http_header_forward_pattern: str = ""
    grpc_header_forward_pattern: str = ""
    metrics_config: dict[str, str] = field(default_factory=dict)
    metrics_interval_ms: float = 2000.0
    allow_cpu_metrics: bool = True
    # Triton flags with Triton's meaning (docs/triton_compat.md).
    server_id: str = "modelhost"  # --id: the server name in the metadata
    # --backend-config: settings by backend name; "" holds the ones for every backend.
    backend_config: dict[str, dict[str, str]] = field(default_factory=dict)
    disable_auto_complete_config: bool = False
    model_config_name: str = ""  # --model-config-name: <model>/configs/<name>.pbtxt first
    strict_readiness: bool = False  # ready only while every model that was loaded is READY
    rate_limit: str = "off"  # "execution_count": Triton's rate limiter (host.rate_limiter)
    rate_limit_resources: list[str] = field(default_factory=list)  # NAME:COUNT[:DEVICE]
    # --model-namespacing: models keyed by (repository, name) (host.namespacing)
    model_namespacing: bool = False
    # Memory pools: accepted for compatibility; tensors here live in numpy/cupy memory.
    pinned_memory_pool_byte_size: int = 256 * 1024 * 1024
    cuda_memory_pool_byte_size: dict[int, int] = field(default_factory=dict)
    cuda_virtual_address_size: dict[int, int] = field(default_factory=dict)
    # --min-supported-compute-capability: GPUs below it are not used (host.devices)
    min_supported_compute_capability: float = 6.0
    # gRPC keepalive settings by Triton's flag name (host.cli_triton.GRPC_KEEPALIVE); empty: the
    # gRPC server's own defaults (an embedder that sets none)
    grpc_keepalive: dict[str, int] = field(default_factory=dict)
    # repository agents (host.native.repoagent): <dir>/<name>/libtritonrepoagent_<name>.so
    repoagent_directory: Path = Path("/opt/tritonserver/repoagents")
    # Triton's cloud front ends (host.http.cloud), each on a port of its own; their address is
    # Triton's fixed 0.0.0.0.
    allow_sagemaker: bool = False
    sagemaker_address: str = "0.0.0.0"
    sagemaker_port: int = 8080
    sagemaker_safe_port_range: tuple[int, int] | None = None  # other endpoints' ports must be in it
    allow_vertex_ai: bool = False
    vertex_ai_address: str = "0.0.0.0"
    vertex_ai_port: int = 8080
    vertex_ai_default_model: str = ""  # "" : the repository's only model
    # gRPC front-end sizes: accepted for compatibility (the range is checked as Triton checks it)
    grpc_infer_thread_count: int = 2
    grpc_infer_allocation_pool_size: int = 8
