"""Request bodies (size limit, Content-Encoding) and response compression (Accept-Encoding).

Triton accepts `gzip` and `deflate` (zlib-wrapped) request bodies on infer, answers an unknown
Content-Encoding with UNSUPPORTED "Unsupported compression type", and compresses infer responses
with the best of identity/deflate/gzip named in Accept-Encoding (q-values honoured).
"""

from __future__ import annotations

import io
import zlib
from typing import BinaryIO

from host.errors import InvalidArgumentError, UnsupportedError

LIMIT_HINT = "Use --http-max-input-size to increase the limit."
UNSUPPORTED_ENCODING = "Unsupported compression type"
NOTHING_TO_DECOMPRESS = "nothing to be decompressed"  # Triton's text for an empty gzip/deflate body


def too_large(size: int, limit: int, kind: str = "body") -> InvalidArgumentError:
    """`kind`: "JSON" for a body that is all JSON (Triton's text then says "request JSON size"),
    "raw" for a raw binary body (Inference-Header-Content-Length: 0, Triton's "Raw input")."""
    if kind == "raw":
        return InvalidArgumentError(
            f"Raw input has a byte_size ({size} bytes) that exceeds the maximum allowed value of "
            f"{limit} bytes. {LIMIT_HINT}")
    return InvalidArgumentError(
        f"request {kind} size of {size} bytes exceeds the maximum allowed input size of {limit} "
        f"bytes. {LIMIT_HINT}")


def read(stream: BinaryIO, content_length: int | None, chunked: bool, limit: int,
         kind: str = "body") -> bytes:
    """The raw request body, refused when it is larger than `limit` bytes.

    Without Content-Length the body is only read when it is chunked (a WSGI server gives EOF
    at its end); otherwise there is none.
    """
    if content_length is not None:
        if content_length > limit:
            raise too_large(content_length, limit, kind)
        if content_length == 0:
            return b""
        data = stream.read(content_length)
        if len(data) != content_length:
            raise InvalidArgumentError(
                f"request body ended after {len(data)} of the {content_length} bytes "
                "its Content-Length announced")
        return data
    if not chunked:
        return b""
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise InvalidArgumentError(
            f"request body exceeds the maximum allowed input size of {limit} bytes. {LIMIT_HINT}")
    return data


_CHUNK = 1 << 16


def read_decoded(stream: BinaryIO, content_length: int | None, chunked: bool, limit: int,
                 content_encoding: str | None, kind: str = "body", infer: bool = False) -> bytes:
    """The request body with its Content-Encoding undone, decompressed as it is read.

    `infer`: an infer request, where Triton also refuses an empty Content-Encoding value
    (UNSUPPORTED) and an empty compressed body ("nothing to be decompressed"); elsewhere those
    are read as no encoding and no body.

    Neither the compressed body nor its decompressed size may pass `limit`; the decompressed
    bound holds while decompressing (zlib is never asked for more than the bytes still allowed),
    so a small body that inflates hugely is refused without being inflated.
    """
    encoding = _encoding(content_encoding if infer or content_encoding else None)
    if encoding is None:
        return read(stream, content_length, chunked, limit, kind)
    if content_length is not None and content_length > limit:
        raise too_large(content_length, limit, kind)
    if content_length == 0 or (content_length is None and not chunked):
        if infer:
            raise InvalidArgumentError(NOTHING_TO_DECOMPRESS)
        return b""
    return _inflate(stream, content_length, limit, encoding, compressed_limit=limit)


def _inflate(stream: BinaryIO, content_length: int | None, limit: int, encoding: str,
             compressed_limit: int | None = None) -> bytes:
    inflater = zlib.decompressobj(zlib.MAX_WBITS | 32)  # gzip or zlib header, detected
    out = bytearray()
    remaining = content_length
    received = 0
    while remaining is None or remaining > 0:
        chunk = stream.read(_CHUNK if remaining is None else min(_CHUNK, remaining))
        if not chunk:
            if remaining:
                raise InvalidArgumentError(
                    f"request body ended after {received} of the {content_length} bytes "
                    "its Content-Length announced")
            break
        received += len(chunk)
        if remaining is not None:
            remaining -= len(chunk)
        elif compressed_limit is not None and received > compressed_limit:
            raise InvalidArgumentError(
                f"request body exceeds the maximum allowed input size of {compressed_limit} bytes. "
                f"{LIMIT_HINT}")
        if inflater.eof:
            continue  # bytes after the end of the compressed stream: read, then ignored
        try:
            out += inflater.decompress(chunk, limit + 1 - len(out))
        except zlib.error as exc:
            raise InvalidArgumentError(
                f"failed to decompress the {encoding} request body: {exc}") from None
        if len(out) > limit or inflater.unconsumed_tail:
            raise _decompressed_too_large(limit)
    if received and not inflater.eof:
        raise InvalidArgumentError(f"failed to decompress the {encoding} request body: truncated data")
    return bytes(out)


def _encoding(content_encoding: str | None) -> str | None:
    """`gzip`, `deflate` or None (identity); anything else, an empty value included, is Triton's
    UNSUPPORTED."""
    if content_encoding is None:
        return None
    encoding = content_encoding.strip().lower()
    if encoding == "identity":
        return None
    if encoding not in ("gzip", "deflate"):
        raise UnsupportedError(UNSUPPORTED_ENCODING)
    return encoding


def _decompressed_too_large(limit: int) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"Decompressed data size exceeds the maximum allowed value of {limit} bytes. {LIMIT_HINT}")


def decode(data: bytes, content_encoding: str | None, limit: int) -> bytes:
    """Undo a `gzip` or `deflate` Content-Encoding of a body already read; the decompressed
    size is bounded by `limit` (the compressed one by the caller)."""
    encoding = _encoding(content_encoding or None)
    if encoding is None or not data:
        return data
    return _inflate(io.BytesIO(data), len(data), limit, encoding)


def response_encoding(accept_encoding: str | None) -> str | None:
    """`gzip`, `deflate` or None (identity): Triton's choice among the encodings it offers."""
    if not accept_encoding:
        return None
    best, weight = "identity", 0.0
    for item in accept_encoding.split(","):
        name, _, q = item.partition(";")
        name = name.strip().lower()
        if name not in ("identity", "gzip", "deflate"):
            continue
        w = 1.0
        q = q.strip()
        if q:
            if not q.startswith("q="):
                continue
            try:
                w = float(q[2:])
            except ValueError:
                continue
        if w > weight:
            best, weight = name, w
    return None if best == "identity" else best


def compress(data: bytes, encoding: str) -> bytes:
    if encoding == "gzip":
        deflater = zlib.compressobj(6, zlib.DEFLATED, zlib.MAX_WBITS | 16)
        return deflater.compress(data) + deflater.flush()
    return zlib.compress(data, 6)
