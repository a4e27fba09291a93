"""The `modelhost` command: `serve` with Triton-style flags, and `plugins`."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Sequence

from host import __version__
from host.options import CONTROL_MODES, ServerOptions


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")


def _flag(parser: argparse.ArgumentParser, name: str, help: str, default: bool = False) -> None:
    """A Triton-style boolean: `--name`, `--name=true` or `--name=false`."""
    parser.add_argument(name, type=_bool, nargs="?", const=True, default=default, help=help)


def _cache_setting(text: str) -> tuple[str, str, str]:
    """`NAME,KEY=VALUE` (Triton's --cache-config): the value is a string and may hold commas."""
    name, sep, rest = text.partition(",")
    key, eq, value = rest.partition("=")
    if not name.strip() or not sep or not key.strip() or not eq:
        raise argparse.ArgumentTypeError(f"expected <cache name>,<key>=<value>, got '{text}'")
    return name.strip(), key.strip(), value


def cache_config(settings: list[tuple[str, str, str]], byte_size: int | None) -> dict[str, dict[str, str]]:
    """Settings by cache name; the deprecated --response-cache-byte-size N is `local,size=N`."""
    config: dict[str, dict[str, str]] = {}
    for name, key, value in settings:
        config.setdefault(name, {})[key] = value
    if byte_size is not None:
        if config:
            raise SystemExit("modelhost: --response-cache-byte-size cannot be combined with "
                             "--cache-config; use --cache-config local,size=N alone")
        logging.getLogger(__name__).warning(
            "--response-cache-byte-size is deprecated: use --cache-config local,size=%d", byte_size)
        if byte_size > 0:  # 0 meant "no cache" before --cache-config existed
            config["local"] = {"size": str(byte_size)}
    return config


def _serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve a model repository over HTTP and gRPC",
                       description="Serve Triton model repositories (KServe V2 / Triton protocol).")
    p.add_argument("--model-repository", "--model-store", action="append", type=Path, dest="repos",
                   metavar="DIR", help="model repository root (repeatable; default ./model_repository)")
    p.add_argument("--model-control-mode", choices=CONTROL_MODES, default="none")
    p.add_argument("--load-model", action="append", default=[], metavar="NAME",
                   help="model to load at start in explicit mode (repeatable; '*' loads all)")
    p.add_argument("--repository-poll-secs", type=float, default=15.0, metavar="SECS")
    p.add_argument("--backend-directory", type=Path, default=None, metavar="DIR",
                   help="where native backends libtriton_<name>.so are searched (<dir>/<name>/)")
    _flag(p, "--exit-on-error", "exit if any model fails to load at start")
    _flag(p, "--strict-model-config", "accepted for compatibility: configs are always auto-completed")
    _flag(p, "--strict-readiness", "accepted for compatibility", default=True)
    p.add_argument("--block-plugin", action="append", default=[], metavar="NAME",
                   help="do not load the plugin NAME (repeatable; also MODELHOST_BLOCK_PLUGINS=a,b)")
    p.add_argument("--http-address", default="0.0.0.0")
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--http-thread-count", type=int, default=16,
                   help="accepted for compatibility: each HTTP connection is served by its own thread")
    p.add_argument("--http-max-input-size", type=int, default=64 * 1024 * 1024, metavar="BYTES")
    p.add_argument("--grpc-address", default="0.0.0.0")
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--grpc-infer-response-compression-level", default="none",
                   choices=("none", "low", "medium", "high"),
                   help="compress gRPC responses (requests are accepted gzip/deflate-compressed)")
    p.add_argument("--metrics-address", default="0.0.0.0")
    p.add_argument("--metrics-port", type=int, default=8002)
    _flag(p, "--allow-http", "accepted for compatibility: HTTP is always served", default=True)
    _flag(p, "--allow-grpc", "serve gRPC (GRPCInferenceService)", default=True)
    _flag(p, "--allow-metrics", "serve Prometheus metrics at /metrics", default=True)
    _flag(p, "--allow-client-shm", "let clients register system and CUDA shared-memory regions "
          "for tensors", default=False)
    p.add_argument("--log-verbose", type=int, default=0, metavar="LEVEL")
    _flag(p, "--log-info", "log informational messages", default=True)
    p.add_argument("--exit-timeout-secs", type=float, default=30.0)
    p.add_argument("--model-load-thread-count", type=int, default=4)
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
    p.add_argument("--grpc-server-cert", type=Path, default=None, metavar="PEM")
    p.add_argument("--grpc-server-key", type=Path, default=None, metavar="PEM")
    p.add_argument("--grpc-root-cert", type=Path, default=None, metavar="PEM")
    p.add_argument("--http-ssl-cert", type=Path, default=None, metavar="PEM",
                   help="serve HTTPS with this certificate (chain) and --http-ssl-key")
    p.add_argument("--http-ssl-key", type=Path, default=None, metavar="PEM")
    p.add_argument("--http-ssl-root-cert", type=Path, default=None, metavar="PEM",
                   help="CA certificates that client certificates are checked against")
    _flag(p, "--http-ssl-mutual", "HTTPS clients must present a certificate signed by "
          "--http-ssl-root-cert")
    p.add_argument("--response-cache-byte-size", type=int, default=None, metavar="BYTES",
                   help="deprecated: the same as --cache-config local,size=BYTES")


def options_from_args(args: argparse.Namespace) -> ServerOptions:
    return ServerOptions(
        model_repositories=args.repos or [Path("model_repository")],
        model_control_mode=args.model_control_mode,
        load_models=args.load_model,
        repository_poll_secs=args.repository_poll_secs,
        backend_directory=args.backend_directory,
        exit_on_error=args.exit_on_error,
        strict_model_config=args.strict_model_config,
        blocked_plugins=args.block_plugin,
        http_address=args.http_address,
        http_port=args.http_port,
        http_thread_count=args.http_thread_count,
        http_max_input_size=args.http_max_input_size,
        grpc_address=args.grpc_address,
        grpc_port=args.grpc_port,
        grpc_compression_level=args.grpc_infer_response_compression_level,
        metrics_address=args.metrics_address,
        metrics_port=args.metrics_port,
        allow_http=args.allow_http,
        allow_grpc=args.allow_grpc,
        allow_metrics=args.allow_metrics,
        allow_client_shm=args.allow_client_shm,
        log_verbose=args.log_verbose,
        exit_timeout_secs=args.exit_timeout_secs,
        model_load_thread_count=args.model_load_thread_count,
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
    )


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
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="modelhost", description=__doc__)
    parser.add_argument("--version", action="version", version=f"modelhost {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    pp = sub.add_parser("plugins", help="list the plugins found, with versions and what they provide")
    pp.add_argument("--block-plugin", action="append", default=[], metavar="NAME")
    args = parser.parse_args(argv)
    if args.command == "plugins":
        return _plugins_command(args)
    logging.basicConfig(
        level=logging.DEBUG if args.log_verbose else (logging.INFO if args.log_info else logging.WARNING),
        format="%(asctime)s %(levelname).1s %(name)s] %(message)s", stream=sys.stderr)
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
