"""Start-up of `modelhost serve`: checks before the fork, one-line failures, the ready summary.

A server that cannot start says why in one line, with the fix where there is one, and exits
non-zero: no traceback (unless --log-verbose), no worker restarts. What can be checked cheaply
before gunicorn forks its worker is checked in the master (`preflight`); what only the worker
learns (a cache that cannot be built, a model failing with --exit-on-error, a port taken since)
is turned into the same kind of line there (`explain`), and the worker exits with gunicorn's
boot-error status, which stops the master instead of restarting the worker (host.serve).
"""

from __future__ import annotations

import errno
import importlib.util
import logging
import resource
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from host import storage
from host.errors import HostError

if TYPE_CHECKING:
    from host.core import Host
    from host.options import ServerOptions

log = logging.getLogger("modelhost")


class StartupError(Exception):
    """The server cannot start; the message is the one line the user reads."""


# (name in messages, address field, port field, flag, enabled field or None)
# Each endpoint's name in Triton's "failed to start <name> service" line.
TRITON_SERVICE_NAMES = {"HTTP": "HTTP", "gRPC": "GRPC", "metrics": "Metrics",
                        "SageMaker": "Sagemaker", "Vertex AI": "Vertex AI"}
# ... and in its "cannot listen to ... requests" lines
_COLLISION_NAMES = {"gRPC": "GRPC"}

ENDPOINTS = (
    ("HTTP", "http_address", "http_port", "--http-port", "allow_http"),
    ("gRPC", "grpc_address", "grpc_port", "--grpc-port", "allow_grpc"),
    ("metrics", "metrics_address", "metrics_port", "--metrics-port", "allow_metrics"),
    ("SageMaker", "sagemaker_address", "sagemaker_port", "--sagemaker-port", "allow_sagemaker"),
    ("Vertex AI", "vertex_ai_address", "vertex_ai_port", "--vertex-ai-port", "allow_vertex_ai"),
)


def endpoints(options: ServerOptions) -> list[tuple[str, str, int, str]]:
    """(name, address, port, flag) of every server this configuration starts."""
    return [(name, getattr(options, addr), getattr(options, port), flag)
            for name, addr, port, flag, enabled in ENDPOINTS
            if getattr(options, enabled, True)]


def preflight(options: ServerOptions) -> None:
    """What the master can check before the fork; raises StartupError."""
    for root in [] if options.serve_without_repository else options.model_repositories:
        if storage.is_remote(root):  # reachable, its bucket and path there
            try:
                storage.check(str(root))
            except HostError as exc:
                raise StartupError(exc.message) from None
            continue
        path = Path(root)
        if not path.exists():
            raise StartupError(
                f"model repository '{root}' does not exist: pass --model-repository DIR "
                f"(or MODELHOST_MODEL_REPOSITORY) naming a folder of models")
        if not path.is_dir():
            raise StartupError(f"model repository '{root}' is not a folder: pass --model-repository DIR")
    if options.frontend_processes > 1 and options.allow_grpc and options.grpc_port == 0:
        raise StartupError("--grpc-port 0 (any free port) cannot be shared by several front-end "
                           "processes: give a port with --grpc-port, or use --frontend-processes 1")
    if options.frontend_processes > 1 and (options.allow_sagemaker or options.allow_vertex_ai):
        raise StartupError("--allow-sagemaker and --allow-vertex-ai need one process: leave "
                           "--frontend-processes out")
    safe = options.sagemaker_safe_port_range if options.allow_sagemaker else None
    if safe is not None:  # Triton's CheckPortCollision text
        for name, address, port, _ in endpoints(options):
            if name != "SageMaker" and address == options.sagemaker_address and \
                    not safe[0] <= port <= safe[1]:
                raise StartupError(f"The server cannot listen to {_COLLISION_NAMES.get(name, name)} "
                                   f"requests at port {port}, allowed port range is "
                                   f"[{safe[0]}, {safe[1]}]")
    check_port_collision(options)
    reuse = {"HTTP": options.reuse_http_port, "gRPC": options.reuse_grpc_port}
    for name, address, port, flag in endpoints(options):
        check_port_free(name, address, port, flag, reuse.get(name, False))


def check_port_collision(options: ServerOptions) -> None:
    """Triton's check (CheckPortCollision) and its text: two enabled services given the same
    address (as written) and port; the same port on different addresses is allowed."""
    given = endpoints(options)
    for i, (name, address, port, _) in enumerate(given):
        for other, other_address, other_port, _ in given[i + 1:]:
            if address == other_address and port == other_port:
                raise StartupError(
                    f"The server cannot listen to {_COLLISION_NAMES.get(name, name)} requests "
                    f"and {_COLLISION_NAMES.get(other, other)} requests at the same address "
                    f"and port {address}:{port}")


# Where the hard limit is unlimited: the kernel's default ceiling for one process (fs.nr_open).
_MAX_OPEN_FILES = 1 << 20


def raise_file_limit() -> None:
    """Raise the soft limit on open files to the hard one (in the master, before the fork).

    Every connection holds a descriptor, and HTTP and gRPC share the process's. With the usual
    soft limit of 1024, 1,100 idle gRPC connections (not even an HTTP/2 preface) leave none to
    accept an HTTP client, and the whole server stops answering (Triton is taken down the same
    way). The hard limit is the administrator's ceiling; the soft one only a default, which a
    server may raise (Go's runtime does so for every program)."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = _MAX_OPEN_FILES if hard == resource.RLIM_INFINITY else hard
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            log.debug("open-file limit raised from %d to %d", soft, target)
    except (ValueError, OSError) as exc:  # a container may forbid it: serve with what there is
        log.warning("could not raise the open-file limit: %s", exc)


# How long a port in use may take to come free: a server killed just before (SIGKILL to its
# master) lets go of its ports once its worker sees it is orphaned, a second or so later.
# gunicorn waits the same way (5 tries, 1 s apart) before giving up on a port.
PORT_WAIT_SECONDS = 5.0


def check_port_free(name: str, address: str, port: int, flag: str, reuse_port: bool = False) -> None:
    """Bind the address and port the way the server will, and let go; StartupError when it
    stays taken for PORT_WAIT_SECONDS. `reuse_port`: the server binds with SO_REUSEPORT (a port
    that other servers hold the same way is free for it)."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    deadline = time.monotonic() + PORT_WAIT_SECONDS
    while True:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if reuse_port:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                sock.bind((address.strip("[]"), port))
            return
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or time.monotonic() >= deadline:
                raise StartupError(port_error(name, address, port, flag, exc)) from None
        time.sleep(0.25)


def port_error(name: str, address: str, port: int, flag: str, exc: BaseException) -> str:
    if getattr(exc, "errno", None) == errno.EADDRINUSE or "in use" in str(exc):
        # Triton's words first (L0_lifecycle greps the log for them), then what to do.
        return (f"failed to start {TRITON_SERVICE_NAMES.get(name, name)} service: Unavailable - "
                f"Socket '{address}:{port}' already in use (the {name} port {port} on {address} "
                f"is taken: another server listens there); stop it or pick another port with {flag}")
    if getattr(exc, "errno", None) == errno.EACCES:
        return (f"the {name} port {port} on {address} needs privileges (ports below 1024): "
                f"pick a port above 1023 with {flag}")
    if getattr(exc, "errno", None) == errno.EADDRNOTAVAIL:
        return (f"the {name} address {address} is not an address of this machine: fix "
                f"{flag.replace('port', 'address')}")
    return f"cannot listen for {name} on {address}:{port}: {exc}"


def explain(exc: BaseException, options: ServerOptions) -> str:
    """The one line for an exception raised while the worker starts."""
    if isinstance(exc, StartupError):
        return str(exc)
    if isinstance(exc, HostError):
        text = str(exc)
        if "failed to load all models" in text:
            return f"{text} (--exit-on-error is set: fix the model, or start without --exit-on-error)"
        if "cache" in text.lower():
            return f"bad response cache configuration: {text} (fix --cache-config)"
        return text
    return (f"unexpected {type(exc).__name__} during start-up: {exc} "
            f"(run with --log-verbose 1 for the traceback)")


# --- the summary once ready --------------------------------------------------------------------

def table(headers: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    """A text table as Triton prints them (+---+ borders)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def row(cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    return "\n".join([line, row(headers), line, *map(row, rows), line])


def model_rows(host: Host) -> list[tuple[str, str, str, str]]:
    return [(r.get("name", ""), r.get("version", "-"), r.get("state", "-"), r.get("reason", ""))
            for r in host.manager.index()]


def log_summary(host: Host, listening: list[tuple[str, str]]) -> None:
    """Log every model (version, state, reason) and every endpoint with its address."""
    try:
        rows = model_rows(host)
    except HostError:  # a repository that cannot be read (--exit-on-error=false): logged already
        rows = None
    if rows == []:
        roots = ", ".join(str(r) for r in host.options.model_repositories)
        log.warning("the model repository %s holds no models: a model is a folder with a "
                    "config.pbtxt and version folders (1/, 2/, ...)%s", roots,
                    " (explicit mode: load models with --load-model or the repository API)"
                    if host.options.model_control_mode == "explicit" else "")
    if importlib.util.find_spec("host.native.libtritonserver") is None:
        log.warning("this modelhost was installed without its native bridge (no C compiler at "
                    "install): native Triton backends and caches (libtriton_*.so) cannot load. "
                    "Install gcc and Python's headers, then reinstall modelhost to have them")
    # tables are logged as Triton logs them: an empty first line, then the table as it is, not
    # escaped (host.logsettings); no models is a table without rows (L0_logging log_format_test)
    log.info("\n%s", table(("Model", "Version", "Status", "Reason"), rows or []), extra={"raw": True})
    log.info("\n%s", table(("Endpoint", "Address"), listening), extra={"raw": True})


def listening_rows(options: ServerOptions, grpc: Any, metrics: Any,
                   cloud: Sequence[tuple[str, Any]] = ()) -> list[tuple[str, str]]:
    rows = []
    if options.allow_http:
        rows.append(("HTTP (KServe V2 / Triton REST)", f"{options.http_address}:{options.http_port}"))
    if grpc is not None:
        rows.append(("gRPC (inference.GRPCInferenceService)", f"{options.grpc_address}:{grpc.port}"))
    if metrics is not None:
        rows.append(("metrics (Prometheus, /metrics)", f"{options.metrics_address}:{metrics.port}"))
    for name, server in cloud:
        rows.append((name, f"{server.address[0]}:{server.port}"))
    return rows


def start_metrics(host: Any, options: ServerOptions) -> Any:
    """The metrics endpoint of `host` (None when --allow-metrics is off); StartupError when its
    port cannot be had."""
    if not options.allow_metrics:
        return None
    from host.metrics import start_metrics_server

    try:
        server = start_metrics_server(host, options.metrics_address, options.metrics_port)
    except OSError as exc:
        raise StartupError(port_error("metrics", options.metrics_address, options.metrics_port,
                                      "--metrics-port", exc)) from None
    log.info("Started Metrics Service at %s:%d", options.metrics_address, server.port)  # Triton's line
    return server


def start_cloud_front_ends(app: Any, options: ServerOptions, metrics: Any) -> list[tuple[str, Any]]:
    """The SageMaker and Vertex AI front ends asked for (host.http.cloud), each an HTTP server
    on its own port over the main app `app`; StartupError with Triton's line when one cannot
    start."""
    import os

    from host.http import cloud
    from host.http.server import serve as serve_http

    servers: list[Any] = []
    wanted = []
    if options.allow_sagemaker:
        try:
            cloud.check_inference_type(os.environ.get("SAGEMAKER_TRITON_INFERENCE_TYPE", "infer"))
        except HostError as exc:
            raise StartupError(f"failed to start Sagemaker service: {_triton_error(exc)}") from None
        wanted.append(("SageMaker", "Sagemaker HTTPService", options.sagemaker_address,
                       options.sagemaker_port, "--sagemaker-port",
                       cloud.SageMakerApp(app, options.http_max_input_size)))
    if options.allow_vertex_ai:
        try:
            vertex = _vertex_app(app, options, metrics)
        except HostError as exc:
            raise StartupError(f"failed to start Vertex AI service: {_triton_error(exc)}") from None
        wanted.append(("Vertex AI", "Vertex AI HTTPService", options.vertex_ai_address,
                       options.vertex_ai_port, "--vertex-ai-port", vertex))
    try:
        for name, service, address, port, flag, wsgi in wanted:
            try:
                server = serve_http(wsgi, address, port)
            except OSError as exc:
                raise StartupError(port_error(name, address, port, flag, exc)) from None
            servers.append((f"{name} (cloud front end)", server))
            log.info("Started %s at %s:%d", service, address, server.port)  # Triton's line
    except BaseException:
        for _, server in servers:
            server.shutdown(0)
        raise
    return servers


def _triton_error(exc: HostError) -> str:
    """As Triton's LOG_TRITONSERVER_ERROR words an error: "<code name> - <message>"."""
    from host.errors import TRITON_CODE_NAMES

    return f"{TRITON_CODE_NAMES.get(exc.code, 'Unknown')} - {exc.message}"


def _vertex_app(app: Any, options: ServerOptions, metrics: Any) -> Any:
    """The Vertex AI app: its routes from the environment, its default model checked against
    the models that are ready (Triton's VertexAiAPIServer::Create and texts)."""
    import os

    from host.errors import InvalidArgumentError
    from host.http import cloud

    predict, health = os.environ.get("AIP_PREDICT_ROUTE", ""), os.environ.get("AIP_HEALTH_ROUTE", "")
    if not predict:
        raise InvalidArgumentError("API_PREDICT_ROUTE is not defined for Vertex AI endpoint")
    if not health:
        raise InvalidArgumentError("AIP_HEALTH_ROUTE is not defined for Vertex AI endpoint")
    host = app.infer.host
    ready = [row["name"] for row in host.repository_index(ready_only=True)]
    model = options.vertex_ai_default_model
    if not model:
        if len(ready) != 1:
            raise InvalidArgumentError("Expect the model repository contains only a single model "
                                       "if default model is not specified")
        model = ready[0]
    elif model not in ready:
        raise InvalidArgumentError(f"Expect the default model '{model}' is loaded")
    metrics_app = None
    if metrics is not None:
        from host.metrics import make_wsgi_app

        metrics_app = make_wsgi_app(metrics.registry)
    return cloud.VertexAIApp(app, options.http_max_input_size, predict, health, model, metrics_app)


def settle() -> None:
    """Once serving: what exists now (models, plugins) lives as long as the server, so keep it
    out of the collector's way, and let the young generation grow before collecting it, since a
    request's own objects are freed by reference counting anyway."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 50, 50)
