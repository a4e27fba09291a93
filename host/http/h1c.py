"""The one module that touches gunicorn_h1c, gunicorn[fast]'s C HTTP/1.1 parser.

`parse_head` turns the bytes of a request head into a WSGI environ in one C call
(`parse_to_wsgi_environ`). That call also says where the head ends, but only in a private key of
the environ (`_consumed`). Reading it keeps the request path at one parser call; a gunicorn_h1c
that stops writing the key still works: the public `parse_request` then says where the head ends
(a second parse, slower, never wrong). tests/test_h1c_contract.py checks both paths against the
installed version, and `tox -e deps` runs it over every supported version (docs/performance.md).
"""

from __future__ import annotations

from typing import Callable

from gunicorn_h1c import IncompleteError, ParseError, parse_request, parse_to_wsgi_environ

from host.headers import RAW_HEADERS

__all__ = ["IncompleteError", "ParseError", "Limits", "RAW_HEADERS", "head_parser"]

_PRIVATE_CONSUMED = "_consumed"


class Limits:
    """gunicorn's limit_request_line / limit_request_fields / limit_request_field_size (0: no limit
    for the line and field size, as in gunicorn). None: the parser's own defaults."""

    __slots__ = ("line", "fields", "field_size")

    def __init__(self, line: int | None = None, fields: int | None = None, field_size: int | None = None):
        self.line, self.fields, self.field_size = line, fields, field_size

    def kwargs(self) -> dict[str, int]:
        big = 2**31 - 1
        out = {}
        if self.line is not None:
            out["limit_request_line"] = self.line or big
        if self.fields is not None:
            out["limit_request_fields"] = self.fields or big
        if self.field_size is not None:
            out["limit_request_field_size"] = self.field_size or big
        return out


def head_parser(limits: Limits | None = None,
                raw_headers: bool = False) -> Callable[[bytes, tuple, tuple], tuple[dict, int]]:
    """`parse(data, server_addr, client_addr) -> (environ, head_length)`; raises IncompleteError
    while the head is not all there, ParseError (its subclasses name the limit) when it is bad.

    With `raw_headers` the environ also holds every header as sent (RAW_HEADERS): the WSGI
    environ leaves out names with underscores (`my_header`), which header forwarding must see
    as Triton does. It costs a second parse, so only a server that forwards headers asks."""
    kwargs = limits.kwargs() if limits is not None else {}
    if raw_headers:
        plain = head_parser(limits)

        def parse_raw(data: bytes, server: tuple, client: tuple) -> tuple[dict, int]:
            env, consumed = plain(data, server, client)
            env[RAW_HEADERS] = _header_lines(data[:consumed])
            return env, consumed
        return parse_raw

    if kwargs:
        def parse(data: bytes, server: tuple, client: tuple) -> tuple[dict, int]:
            env = parse_to_wsgi_environ(data, server, client, **kwargs)
            consumed = env.pop(_PRIVATE_CONSUMED, None)
            if consumed is None:
                consumed = parse_request(data, **kwargs)["consumed"]
            return env, consumed
    else:
        def parse(data: bytes, server: tuple, client: tuple) -> tuple[dict, int]:
            env = parse_to_wsgi_environ(data, server, client)
            consumed = env.pop(_PRIVATE_CONSUMED, None)
            if consumed is None:
                consumed = parse_request(data)["consumed"]
            return env, consumed
    return parse


def _header_lines(head: bytes) -> list[tuple[bytes, bytes]]:
    """(name, value) of each header line of a head the parser accepted. The value keeps its
    trailing blanks, which the parser trims but Triton forwards (its L0_parameters test)."""
    out = []
    for line in head.split(b"\n")[1:]:
        line = line.removesuffix(b"\r")
        if line:
            name, _, value = line.partition(b":")
            out.append((name, value.lstrip(b" \t")))
    return out
