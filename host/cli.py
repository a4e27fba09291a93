"""The `modelhost` command: `serve` with Triton-style flags, and `plugins`."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Sequence

from host import __version__, affinity, cli_triton, logsettings, settings, storage
from host.options import CONTROL_MODES, ServerOptions


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")


def _int_bool(text: str) -> int:
    """A level that may be spelled true or false (Triton's ParseIntBoolOption: --log-verbose)."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return int(lowered == "true")
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: '{text}'") from None


def _strict_model_config(value: bool | None) -> bool:
    if value is not None:  # Triton's warning, on stderr
        print("Warning: '--strict-model-config' has been deprecated! Please use "
              "'--disable-auto-complete-config' instead.", file=sys.stderr, flush=True)
    return bool(value)


def _metrics_address(args: argparse.Namespace) -> str:
    """--metrics-address, by default the HTTP address (as in Triton, HTTP served or not). With
    HTTP off, an HTTP address that is no address (Triton's QA passes `-47`) leaves Triton's
    metrics listening on INADDR_NONE (inet_addr's answer), the server starting: the same here."""
    if args.metrics_address is not None:
        return str(args.metrics_address)
    if not args.allow_http:
        try:
            socket.getaddrinfo(args.http_address.strip("[]"), None)
        except (socket.gaierror, UnicodeError):
            return "255.255.255.255"
    return str(args.http_address)


def _flag(parser: argparse.ArgumentParser, name: str, help: str, default: bool | None = False) -> None:
    """A Triton-style boolean: `--name`, `--name=true` or `--name=false`."""
    parser.add_argument(name, type=_bool, nargs="?", const=True, default=default, help=help,
                        metavar="true|false")


def _cache_setting(text: str) -> tuple[str, str, str]:
    """`NAME,KEY=VALUE` (Triton's --cache-config): the value is a string and may hold commas."""
    name, sep, rest = text.partition(",")
    key, eq, value = rest.partition("=")
    if not name.strip() or not sep or not key.strip() or not eq:
        raise argparse.ArgumentTypeError(f"expected <cache name>,<key>=<value>, got '{text}'")
    return name.strip(), key.strip(), value


def _frontend_processes(text: str) -> int:
    """--frontend-processes: a count from 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number of processes, 1 or more, got '{text}'")
    return value


def _python_cpu(text: str) -> str:
    """--python-cpu: host.affinity's rule (whether the CPU is ours is checked at start-up)."""
    try:
        return affinity.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def cache_config(settings: list[tuple[str, str, str]], byte_size: int | None) -> dict[str, dict[str, str]]:
    """Settings by cache name; the deprecated --response-cache-byte-size N is `local,size=N`."""
    config: dict[str, dict[str, str]] = {}
    for name, key, value in settings:
        config.setdefault(name, {})[key] = value
    if byte_size is not None:
        if config:
            raise SystemExit("Error: Incompatible flags --response-cache-byte-size and "
                             "--cache-config both provided. Please provide one or the other.")
        logging.getLogger(__name__).warning(
            "--response-cache-byte-size is deprecated: use --cache-config local,size=%d", byte_size)
        if byte_size > 0:  # 0 meant "no cache" before --cache-config existed
            config["local"] = {"size": str(byte_size)}
    return config


SETTINGS_EPILOG = """\
Every flag can also come from the environment or from a config file:
  --http-port 8000  is  MODELHOST_HTTP_PORT=8000,  or  http-port = 8000  in a TOML file
  (http-port: 8000 in YAML) named by --config-file or MODELHOST_CONFIG_FILE.
A flag wins over the environment, which wins over the file, which wins over the default.
A repeatable flag takes its values from one source: in a variable, separate them with ';'
  MODELHOST_CACHE_CONFIG="redis,host=r;redis,port=6379"
in a file, use a list. More: docs/serve.md.
"""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every flag's help ends with its default (argparse's own formatter skips flags without help)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        # a help that states its default itself ("... default ./x)"), not one naming a choice
        # called "default" ("default: Triton's text lines")
        says_default = "default " in text or "(default" in text
        if not action.option_strings or says_default or action.default is argparse.SUPPRESS \
                or isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            return text
        default = action.default
        if default is None or default == [] or default == "":
            shown = "none"
        elif isinstance(default, bool):
            shown = "true" if default else "false"
        else:
            shown = str(default).replace("%", "%%")
        return f"{text} (default: {shown})"


def _trace_setting(text: str) -> tuple[str, str, str]:
    from host.trace import split_setting

    try:
        return split_setting(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _metrics_setting(text: str) -> tuple[str, str]:
    """`<setting>=<value>` (Triton's --metrics-config)."""
    key, eq, value = text.partition("=")
    if not key or not eq or not value:
        raise argparse.ArgumentTypeError(
            f"--metrics-config option format is '<setting>=<value>'. Got {text}")
    return key, value


# Triton's texts (its command-line parser) for the trace flags --trace-config replaces.
_TRACE_DEPRECATED = {
    "file": "Warning: '--trace-file' has been deprecated and will be removed in future releases. "
            "Please use '--trace-config triton,file=<filepath> instead.",
    "level": "Warning: '--trace-level' has been deprecated and will be removed in future "
             "releases. Please use '--trace-config level=<OFF|TIMESTAMPS|TENSORS> instead.",
    "rate": "Warning: '--trace-rate' has been deprecated and will be removed in future releases. "
            "Please use '--trace-config rate=<rate value> instead.",
    "count": "Warning: '--trace-count' has been deprecated and will be removed in future "
             "releases. Please use '--trace-config count=<count value> instead.",
    "log_frequency": "Warning: '--trace-log-frequency' has been deprecated and will be removed "
                     "in future releases. Please use '--trace-config triton,log-frequency=<log "
                     "frequency value> instead.",
}


def trace_config(args: argparse.Namespace):
    from host.trace import parse_config

    deprecated = {"file": args.trace_file, "level": args.trace_level, "rate": args.trace_rate,
                  "count": args.trace_count, "log_frequency": args.trace_log_frequency}
    for flag, value in deprecated.items():
        # Triton's warning on stderr, once per occurrence of the flag
        for _ in value if isinstance(value, list) else [] if value is None else [value]:
            print(_TRACE_DEPRECATED[flag], file=sys.stderr, flush=True)
    try:
        return parse_config(args.trace_config, deprecated)
    except ValueError as exc:
        raise SystemExit(f"modelhost: {exc}") from None


def _observability_flags(p: argparse.ArgumentParser) -> None:
    """Tracing, logging, header forwarding and metrics flags (docs/observability.md)."""
    p.add_argument("--trace-config", action="append", type=_trace_setting, default=[],
                   metavar="[MODE,]SETTING=VALUE",
                   help="tracing: level=TIMESTAMPS|TENSORS|OFF, rate=N, count=N, "
                        "mode=triton|opentelemetry, triton,file=PATH, triton,log-frequency=N, "
                        "opentelemetry,url=URL, opentelemetry,resource=KEY=VALUE, "
                        "opentelemetry,bsp_*=N (repeatable)")
    p.add_argument("--trace-file", default=None, help="deprecated: --trace-config triton,file=PATH")
    p.add_argument("--trace-level", action="append", default=[],
                   help="deprecated: --trace-config level=LEVEL")
    p.add_argument("--trace-rate", type=int, default=None, help="deprecated: --trace-config rate=N")
    p.add_argument("--trace-count", type=int, default=None, help="deprecated: --trace-config count=N")
    p.add_argument("--trace-log-frequency", type=int, default=None,
                   help="deprecated: --trace-config triton,log-frequency=N")
    p.add_argument("--log-file", default="", metavar="PATH",
                   help="write the log to PATH instead of stdout/stderr")
    p.add_argument("--log-format", default="default", choices=logsettings.FORMATS,
                   help="default: Triton's text lines; ISO8601: with ISO 8601 times; json: one JSON "
                        "object per line (host.logs), with request ids at --log-verbose 1")
    _flag(p, "--log-warning", "log warnings", default=True)
    _flag(p, "--log-error", "log errors", default=True)
    p.add_argument("--http-header-forward-pattern", default="", metavar="REGEX",
                   help="HTTP request headers whose name matches REGEX become request parameters")
    p.add_argument("--grpc-header-forward-pattern", default="", metavar="REGEX",
                   help="gRPC request metadata whose key matches REGEX become request parameters")
    p.add_argument("--metrics-config", action="append", type=_metrics_setting, default=[],
                   metavar="SETTING=VALUE",
                   help="summary_latencies=true, summary_quantiles=Q:E,..., "
                        "histogram_latencies=true, counter_latencies=false (repeatable)")
    p.add_argument("--metrics-interval-ms", type=float, default=2000.0, metavar="MS",
                   help="how often CPU utilization and memory are sampled")
    _flag(p, "--allow-cpu-metrics", "report nv_cpu_utilization and nv_cpu_memory_*", default=True)


def _serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve a model repository over HTTP and gRPC",
                       description="Serve Triton model repositories (KServe V2 / Triton protocol).",
                       formatter_class=_HelpFormatter, epilog=SETTINGS_EPILOG)
    # Where settings come from (host.settings): every flag below also has a config-file key and
    # a MODELHOST_* variable, derived from its name.
    p.add_argument(settings.CONFIG_FLAG, metavar="FILE", default=None,
                   help="read settings from a TOML or YAML file (also MODELHOST_CONFIG_FILE)")
    p.add_argument("--model-repository", "--model-store", action="append", type=storage.repository_arg,
                   dest="repos", metavar="DIR", help="model repository root: a folder, s3://[host:port/]"
                   "bucket[/path], gs://bucket[/path] or as://account/container[/path] (repeatable; "
                   "default ./model_repository)")
    p.add_argument("--model-control-mode", choices=CONTROL_MODES, default="none", type=str.lower,
                   help="none: load every model at start; explicit: load what --load-model and the "
                        "repository API ask for; poll: also follow changes of the repository "
                        "(any case, as in Triton)")
    p.add_argument("--load-model", action="append", default=[], metavar="NAME",
                   help="model to load at start in explicit mode (repeatable; '*' loads all)")
    p.add_argument("--repository-poll-secs", type=float, default=15.0, metavar="SECS",
                   help="how often poll mode rescans the repository")
    p.add_argument("--backend-directory", type=Path, default=None, metavar="DIR",
                   help="where native backends libtriton_<name>.so are searched (<dir>/<name>/)")
    _flag(p, "--exit-on-error", "exit if any model fails to load at start", default=None)
    _flag(p, "--strict-model-config", "deprecated (Triton's meaning): true is the same as "
          "--disable-auto-complete-config", default=None)
    _flag(p, "--strict-readiness", "report ready only while every model that was loaded is "
          "READY (default false here; Triton's default is true)", default=False)
    p.add_argument("--block-plugin", action="append", default=[], metavar="NAME",
                   help="do not load the plugin NAME (repeatable; also MODELHOST_BLOCK_PLUGINS=a,b)")
    p.add_argument("--http-address", default="0.0.0.0", help="address the HTTP server listens on")
    p.add_argument("--http-port", type=int, default=8000, help="port of the HTTP/REST server")
    p.add_argument("--http-thread-count", type=int, default=16,
                   help="accepted for compatibility: each HTTP connection is served by its own thread")
    p.add_argument("--http-max-input-size", type=int, default=64 * 1024 * 1024, metavar="BYTES",
                   help="largest HTTP request body accepted")
    p.add_argument("--grpc-address", default="0.0.0.0", help="address the gRPC server listens on")
    p.add_argument("--grpc-port", type=int, default=8001, help="port of the gRPC server")
    p.add_argument("--grpc-infer-response-compression-level", default="none",
                   choices=("none", "low", "medium", "high"),
                   help="compress gRPC responses (requests are accepted gzip/deflate-compressed)")
    p.add_argument("--metrics-address", default=None,
                   help="address the Prometheus metrics server listens on (default: the HTTP "
                   "address, as in Triton)")
    p.add_argument("--metrics-port", type=int, default=8002, help="port of the metrics server")
    # Triton: a container that Vertex AI runs (AIP_MODE=PREDICTION) serves Vertex AI only,
    # unless these say otherwise.
    vertex_only = cli_triton.vertex_prediction_mode()
    _flag(p, "--allow-http", "serve HTTP/REST (off: no TCP port is opened for it; default true, "
          "false under AIP_MODE=PREDICTION, see --allow-vertex-ai)", default=not vertex_only)
    _flag(p, "--allow-grpc", "serve gRPC (GRPCInferenceService) (default true; false under "
          "AIP_MODE=PREDICTION)", default=not vertex_only)
    _flag(p, "--allow-metrics", "serve Prometheus metrics at /metrics", default=True)
    _flag(p, "--reuse-http-port", "let several servers listen on the same HTTP port "
          "(SO_REUSEPORT)", default=False)
    _flag(p, "--reuse-grpc-port", "let several servers listen on the same gRPC port "
          "(SO_REUSEPORT)", default=False)
    _flag(p, "--allow-client-shm", "let clients register system and CUDA shared-memory regions "
          "for tensors", default=False)
    p.add_argument("--log-verbose", type=_int_bool, default=0, metavar="LEVEL",
                   help="1 or more: debug logs, with a line per HTTP request and gRPC call")
    _flag(p, "--log-info", "log informational messages", default=True)
    p.add_argument("--exit-timeout-secs", type=float, default=30.0, metavar="SECS",
                   help="on SIGTERM/SIGINT, how long open connections and in-flight requests "
                        "may take to finish")
    _flag(p, "--exit-wait-idle-connections", "on SIGTERM/SIGINT, serve the open HTTP connections, "
          "idle keep-alive ones included, until their clients close them or --exit-timeout-secs "
          "runs out, as Triton does; false: close the idle ones at once", default=True)
    p.add_argument("--model-load-thread-count", type=int, default=4, metavar="N",
                   help="how many models load in parallel at start-up")
    p.add_argument("--model-load-retry-count", type=int, default=0, metavar="N",
                   help="how many times more a model version that fails to load is tried "
                        "(Triton's flag; default 0)")
    p.add_argument("--python-cpu", type=_python_cpu, default="auto", metavar="auto|off|N",
                   help="the CPU shared by the threads that run Python on the request path (front end, "
                        "python models): 'auto' picks one when the process may use several; 'off' leaves "
                        "them to the system (docs/performance.md)")
    p.add_argument("--frontend-processes", type=_frontend_processes, default=1, metavar="N",
                   help="N front-end processes (HTTP, gRPC) in front of one engine process that holds "
                        "the models: the request path uses N+1 cores, models are loaded once "
                        "(docs/process_model.md); 1, the default, is one process")
    cli_triton.add_flags(p, _flag)
    p.add_argument("--cache-config", action="append", type=_cache_setting, default=[],
                   metavar="NAME,KEY=VALUE",
                   help="enable the response cache NAME with a setting (repeatable), e.g. "
                        "local,size=1048576 or redis,host=127.0.0.1")
    p.add_argument("--cache-directory", "--cache-dir", type=Path, default=None, metavar="DIR",
                   help="where native caches libtritoncache_<name>.so are searched (<dir>/<name>/)")
    p.add_argument("--http-restricted-api", action="append", default=[],
                   metavar="<category>[,<category>...]:<key>=<value>",
                   help="answer the endpoints of these categories (health, metadata, inference, "
                        "shared-memory, model-config, model-repository, statistics, trace, logging) "
                        "only when the request has header <key>: <value> (repeatable)")
    p.add_argument("--grpc-restricted-protocol", action="append", default=[],
                   metavar="<category>[,<category>...]:<key>=<value>",
                   help="the same for gRPC; the metadata key is triton-grpc-protocol-<key>")
    _flag(p, "--grpc-use-ssl", "serve gRPC over TLS (needs --grpc-server-cert and --grpc-server-key)")
    _flag(p, "--grpc-use-ssl-mutual", "gRPC over mutual TLS: clients must present a certificate "
          "signed by --grpc-root-cert")
    p.add_argument("--grpc-server-cert", type=Path, default=None, metavar="PEM",
                   help="the gRPC server's certificate (chain), for --grpc-use-ssl")
    p.add_argument("--grpc-server-key", type=Path, default=None, metavar="PEM",
                   help="the private key of --grpc-server-cert")
    p.add_argument("--grpc-root-cert", type=Path, default=None, metavar="PEM",
                   help="CA certificates that gRPC client certificates are checked against "
                        "(--grpc-use-ssl-mutual)")
    p.add_argument("--http-ssl-cert", type=Path, default=None, metavar="PEM",
                   help="serve HTTPS with this certificate (chain) and --http-ssl-key")
    p.add_argument("--http-ssl-key", type=Path, default=None, metavar="PEM",
                   help="the private key of --http-ssl-cert")
    p.add_argument("--http-ssl-root-cert", type=Path, default=None, metavar="PEM",
                   help="CA certificates that client certificates are checked against")
    _flag(p, "--http-ssl-mutual", "HTTPS clients must present a certificate signed by "
          "--http-ssl-root-cert")
    p.add_argument("--response-cache-byte-size", type=int, default=None, metavar="BYTES",
                   help="deprecated: the same as --cache-config local,size=BYTES")
    _observability_flags(p)


def options_from_args(args: argparse.Namespace) -> ServerOptions:
    if args.http_max_input_size <= 0:  # Triton's text (its L0_http test greps the log for it)
        raise SystemExit("modelhost: Error: --http-max-input-size must be greater than 0.")
    return ServerOptions(
        model_repositories=args.repos or [Path("model_repository")],
        model_control_mode=args.model_control_mode,
        load_models=args.load_model,
        repository_poll_secs=args.repository_poll_secs,
        backend_directory=args.backend_directory,
        exit_on_error=bool(args.exit_on_error),
        serve_without_repository=args.exit_on_error is False,
        strict_model_config=_strict_model_config(args.strict_model_config),
        blocked_plugins=args.block_plugin,
        http_address=args.http_address,
        http_port=args.http_port,
        http_thread_count=args.http_thread_count,
        http_max_input_size=args.http_max_input_size,
        grpc_address=args.grpc_address,
        grpc_port=args.grpc_port,
        grpc_compression_level=args.grpc_infer_response_compression_level,
        metrics_address=_metrics_address(args),
        metrics_port=args.metrics_port,
        allow_http=args.allow_http,
        allow_grpc=args.allow_grpc,
        allow_metrics=args.allow_metrics,
        reuse_http_port=bool(args.reuse_http_port),
        reuse_grpc_port=bool(args.reuse_grpc_port),
        allow_client_shm=args.allow_client_shm,
        log_verbose=args.log_verbose,
        exit_timeout_secs=args.exit_timeout_secs,
        exit_wait_idle_connections=args.exit_wait_idle_connections,
        model_load_thread_count=args.model_load_thread_count,
        model_load_retry_count=args.model_load_retry_count,
        python_cpu=args.python_cpu,
        frontend_processes=args.frontend_processes,
        cache_config=cache_config(args.cache_config, args.response_cache_byte_size),
        cache_directory=args.cache_directory,
        http_restricted_api=args.http_restricted_api,
        grpc_restricted_protocol=args.grpc_restricted_protocol,
        grpc_use_ssl=args.grpc_use_ssl or args.grpc_use_ssl_mutual,
        grpc_use_ssl_mutual=args.grpc_use_ssl_mutual,
        grpc_server_cert=args.grpc_server_cert,
        grpc_server_key=args.grpc_server_key,
        grpc_root_cert=args.grpc_root_cert,
        http_ssl_cert=args.http_ssl_cert,
        http_ssl_key=args.http_ssl_key,
        http_ssl_root_cert=args.http_ssl_root_cert,
        http_ssl_mutual=args.http_ssl_mutual,
        trace=trace_config(args),
        http_header_forward_pattern=_pattern(args.http_header_forward_pattern),
        grpc_header_forward_pattern=_pattern(args.grpc_header_forward_pattern),
        metrics_config=dict(args.metrics_config),
        metrics_interval_ms=args.metrics_interval_ms,
        allow_cpu_metrics=args.allow_cpu_metrics,
        strict_readiness=args.strict_readiness,
        **cli_triton.options(args),
    )


def _pattern(text: str) -> str:
    import re

    from host.headers import compile_pattern

    try:
        compile_pattern(text)
    except re.error as exc:
        raise SystemExit(f"modelhost: invalid header forward pattern '{text}': {exc}") from None
    return text


def _plugins_command(args: argparse.Namespace) -> int:
    from host.plugins import get_plugin_manager

    plugins = get_plugin_manager(args.block_plugin)
    by_plugin: dict[str, list[str]] = {}
    for kind, table in (("backend", plugins.registry.backends), ("cache", plugins.registry.caches)):
        for record in table.values():
            by_plugin.setdefault(record.plugin, []).append(f"{kind}:{record.name}")
    print(f"{'plugin':16} {'status':9} {'distribution':24} provides")
    for info in plugins.found:
        dist = f"{info.distribution} {info.version}".strip() or "-"
        provides = ", ".join(by_plugin.get(info.name, [])) or "-"
        print(f"{info.name:16} {info.status:9} {dist:24} {provides}")
        if info.error:
            print(f"{'':16} error: {info.error}")
    import importlib.util

    bridge = importlib.util.find_spec("host.native.libtritonserver") is not None
    print("native Triton backends and caches (libtriton_*.so): " + (
        "supported" if bridge else "not supported: modelhost was installed without a C compiler "
        "(install gcc and Python's headers, then reinstall modelhost)"))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="modelhost", description=__doc__)
    parser.add_argument("--version", action="version", version=f"modelhost {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    pp = sub.add_parser("plugins", help="list the plugins found, with versions and what they provide")
    pp.add_argument("--block-plugin", action="append", default=[], metavar="NAME")
    return parser


def parse_serve_args(parser: argparse.ArgumentParser, argv: Sequence[str],
                     environ: dict[str, str] | os._Environ[str] = os.environ) -> argparse.Namespace:
    """`serve`'s settings from its flags, MODELHOST_* variables and the config file (host.settings).

    Parsed by `serve`'s own parser, so a typo shows `serve`'s usage, not the top level's.
    """
    serve = parser._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr,index]
    argv = cli_triton.join_negative_values(list(argv))
    known, _ = serve.parse_known_args(list(argv))
    config_file = known.config_file or environ.get("MODELHOST_CONFIG_FILE") or None
    try:
        tokens = settings.resolve(serve, argv, environ, config_file)
    except settings.SettingsError as exc:
        print(f"modelhost serve: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    args = serve.parse_args(tokens)
    args.command = "serve"
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if argv and argv[0] == "serve":
        args = parse_serve_args(parser, argv[1:])
    else:
        args = parser.parse_args(argv)
    if args.command == "plugins":
        return _plugins_command(args)
    logsettings.install(logsettings.LogSettings(
        file=args.log_file, info=args.log_info, warning=args.log_warning, error=args.log_error,
        verbose_level=args.log_verbose, format=args.log_format))
    from host.serve import serve

    options = options_from_args(args)
    from host import restricted, tls

    try:  # refuse bad values before anything starts, with Triton's messages
        restricted.http(options.http_restricted_api)
        restricted.grpc(options.grpc_restricted_protocol)
        tls.check(options)
    except ValueError as exc:
        print(f"modelhost: {exc}", file=sys.stderr)
        return 2
    return serve(options)
