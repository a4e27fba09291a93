"""HTTP/REST front end (Triton's KServe v2 HTTP API): `create_app(host)` -> falcon WSGI app."""

from host.http.app import create_app

__all__ = ["create_app"]
