"""TLS for both front ends, from the server options.

gRPC takes Triton's flags (`--grpc-use-ssl`, `--grpc-server-cert`, `--grpc-server-key`,
`--grpc-root-cert`, `--grpc-use-ssl-mutual`). Triton has no HTTPS of its own; modelhost's HTTP
port speaks HTTPS when given `--http-ssl-cert` and `--http-ssl-key` (optionally
`--http-ssl-root-cert` with `--http-ssl-mutual` for client certificates). Certificates and keys
are PEM files, read once at start.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

from host.options import ServerOptions

HANDSHAKE_SECONDS = 10.0  # a client that starts a connection and never finishes the handshake


def _read(path: Path | None, what: str) -> bytes:
    if path is None:
        raise ValueError(f"{what} is required")
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read {what} '{path}': {exc.strerror}") from None


def check(options: ServerOptions) -> None:
    """Refuse incomplete or unreadable TLS settings (ValueError), before the server starts."""
    if options.grpc_use_ssl:
        _read(options.grpc_server_cert, "--grpc-server-cert")
        _read(options.grpc_server_key, "--grpc-server-key")
        if options.grpc_use_ssl_mutual:
            _read(options.grpc_root_cert, "--grpc-root-cert (needed by --grpc-use-ssl-mutual)")
    if options.http_ssl_cert or options.http_ssl_key or options.http_ssl_mutual:
        http_context(options)


def grpc_credentials(options: ServerOptions) -> Any:
    """`grpc.ServerCredentials` for --grpc-use-ssl, or None for plain text."""
    if not options.grpc_use_ssl:
        return None
    import grpc

    key = _read(options.grpc_server_key, "--grpc-server-key")
    cert = _read(options.grpc_server_cert, "--grpc-server-cert")
    root = _read(options.grpc_root_cert, "--grpc-root-cert") if options.grpc_root_cert else None
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=root,
                                       require_client_auth=options.grpc_use_ssl_mutual)


def http_context(options: ServerOptions) -> ssl.SSLContext | None:
    """The server-side SSL context for HTTPS, or None for plain HTTP."""
    if not (options.http_ssl_cert or options.http_ssl_key or options.http_ssl_mutual):
        return None
    cert = options.http_ssl_cert
    _read(cert, "--http-ssl-cert")
    _read(options.http_ssl_key, "--http-ssl-key")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(str(cert), str(options.http_ssl_key))
    except ssl.SSLError as exc:
        raise ValueError(f"cannot use --http-ssl-cert/--http-ssl-key: {exc}") from None
    if options.http_ssl_root_cert:
        _read(options.http_ssl_root_cert, "--http-ssl-root-cert")
        context.load_verify_locations(str(options.http_ssl_root_cert))
    if options.http_ssl_mutual:
        if not options.http_ssl_root_cert:
            raise ValueError("--http-ssl-mutual needs --http-ssl-root-cert")
        context.verify_mode = ssl.CERT_REQUIRED
    return context
