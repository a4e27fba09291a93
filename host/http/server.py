"""A small HTTP/1.1 WSGI server for the front end: one thread per connection, no hand-offs.

gunicorn's gthread worker passes every keep-alive request from its poller thread to a pool thread
and back (two thread switches and a re-registration per request), which on a small machine costs
more than the whole inference of a small model. Here the connection's own thread reads the request
(parsed by gunicorn_h1c's C parser, a gunicorn[fast] dependency), calls the app and writes the
response, so a client at concurrency 1 meets no thread switch in the server at all.

Supported: keep-alive and pipelining, Content-Length and chunked request bodies (read lazily: the
app decides how much to read, and refuses too large ones before they are read), `Expect:
100-continue`, Content-Length and chunked (streamed, e.g. server-sent events) responses, graceful
shutdown. Not supported: TLS, HTTP/2, upgrades (use a proxy in front for those).
"""

from __future__ import annotations

import functools
import logging
import re
import socket
import ssl
import struct
import sys
import threading
import time
from typing import Any, Callable, Iterable
from urllib.parse import unquote_to_bytes

from host import affinity
from host.http.h1c import IncompleteError, ParseError, head_parser

from host.ratelog import RateLimitedLog

log = logging.getLogger("host.http.server")
_quiet_log = RateLimitedLog(log)  # bad requests and failed handshakes: one line, rate-limited

WSGIApp = Callable[[dict, Callable], Iterable[bytes]]

MAX_HEADER_BYTES = 64 * 1024
HANDSHAKE_SECONDS = 10.0
HEADER_SECONDS = 30.0  # from a request's first byte to the end of its head
# A body must keep coming: after BODY_GRACE_SECONDS, at BODY_MIN_RATE bytes/s on average at least
# (a client that trickles its body would otherwise hold its connection's thread for ever).
BODY_GRACE_SECONDS = 30.0
BODY_MIN_RATE = 1024
# When every connection slot is held and none is idle, a connection whose body has been arriving
# for at least a second at under this rate is closed to make room: slow senders, however many,
# cannot lock out a client that has a request to make (BODY_MIN_RATE alone lets a large body
# hold its slot for hours).
EVICTABLE_BODY_RATE = 64 * 1024
# environ key: a callable that says whether the client has closed its connection (under another
# WSGI server it is absent: handlers treat that as "still there")
CLIENT_GONE = "modelhost.client_gone"
_CLOSE_AFTER = "modelhost.close_after"  # environ key: close the connection after this request
_CL_WITH_TE = "Content-Length with Transfer-Encoding"  # gunicorn_h1c's ParseError text
MAX_CHUNKS = 1 << 16  # non-empty chunks in one chunked request body (Triton's kMaxChunkedChunks)
_RECV = 64 * 1024  # below malloc's mmap threshold: no mmap/munmap per read
_SMALL_RESPONSE = 64 * 1024
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_NO_BODY_STATUS = ("1", "204", "304")


class _ClientGone(Exception):
    pass


class _BadRequest(Exception):
    status = "400 Bad Request"


class _NotImplemented(_BadRequest):
    status = "501 Not Implemented"


class _Timeout(_BadRequest):
    status = "408 Request Timeout"


# A chunk size is hex digits only (RFC 9112 7.1): no sign, no '0x', no spaces inside, bounded.
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")


class _Body:
    """`wsgi.input`: the request body, read from the socket only when the app asks for it."""

    __slots__ = ("_conn", "_buf", "_remaining", "_chunked", "_done", "_continue", "failure",
                 "_chunk_left", "_started", "_received", "_chunks")

    def __init__(self, conn: _Connection, length: int, chunked: bool, expect_continue: bool) -> None:
        self._conn = conn
        self._buf = b""  # body bytes already received, not yet given to the app (chunked only)
        self._remaining = length  # Content-Length bodies: bytes still to give
        self._chunk_left = 0  # chunked bodies: bytes of the current chunk not read yet
        self._chunks = 0  # chunked bodies: non-empty chunks so far (at most MAX_CHUNKS)
        self._started = 0.0  # when the app first asked for the body
        self._received = 0
        self._chunked = chunked
        self._done = not chunked and length == 0
        self._continue = expect_continue and not self._done
        # What went wrong reading the body (the app only sees an exception): the server answers
        # for it instead of the app once the app returns.
        self.failure: Exception | None = None

    def read(self, size: int | None = -1) -> bytes:
        try:
            return self._read(size)
        except (_BadRequest, _ClientGone) as exc:
            self.failure = exc
            raise

    def _read(self, size: int | None) -> bytes:
        if self._done and not self._buf:
            return b""
        if self._continue:
            self._continue = False
            self._conn.send(_CONTINUE)
        if not self._started:
            self._started = time.monotonic()
        if self._chunked:
            return self._read_chunked(size)
        n = self._remaining if size is None or size < 0 else min(size, self._remaining)
        data = self._conn.read_exact(n, self)
        self._remaining -= n
        self._done = self._remaining == 0
        return data

    def _read_chunked(self, size: int | None) -> bytes:
        want = None if size is None or size < 0 else size
        # One growing buffer, not a list of parts: a body of 65,536 one-byte chunks would
        # otherwise allocate half a MiB of list for 64 KiB of data (L0_http
        # http_request_many_chunks checks the server's RSS stays flat under such bodies).
        parts = bytearray(self._buf)
        self._buf = b""
        try:
            self._read_chunks(parts, want)
        except BaseException:
            parts.clear()  # the exception's traceback may keep this frame a while
            raise
        data = bytes(parts)
        if want is not None and len(data) > want:
            data, self._buf = data[:want], data[want:]
        return data

    def _read_chunks(self, parts: bytearray, want: int | None) -> None:
        """Read chunks onto `parts` until it holds `want` bytes (None: to the body's end)."""
        have = len(parts)
        while not self._done and (want is None or have < want):
            if not self._chunk_left:
                size_text = self._conn.read_line(self).split(b";", 1)[0].rstrip(b" \t")
                if not _CHUNK_SIZE.fullmatch(size_text):
                    raise _BadRequest("invalid chunk size")
                length = int(size_text, 16)
                if length == 0:
                    while self._conn.read_line():  # trailers, up to the empty line
                        pass
                    self._done = True
                    break
                self._chunks += 1
                if self._chunks > MAX_CHUNKS:  # Triton's kMaxChunkedChunks, and its text
                    raise _BadRequest(f"Chunked request body exceeds maximum of {MAX_CHUNKS} non-empty "
                                      "chunks. Send fewer or larger HTTP chunks.")
                self._chunk_left = length
            # Only what the app asked for: a chunk that claims a terabyte is read (and refused
            # by the app's size limit) piece by piece, never held whole.
            n = self._chunk_left if want is None else min(self._chunk_left, want - have)
            parts += self._conn.read_exact(n, self)
            self._chunk_left -= n
            have += n
            if not self._chunk_left and self._conn.read_exact(2) != b"\r\n":
                raise _BadRequest("invalid chunk terminator")

    def slow_rate(self, now: float) -> float | None:
        """This body's average rate when it is still arriving, for a second at least, slower
        than EVICTABLE_BODY_RATE; None otherwise."""
        if self._done or not self._started or now - self._started < 1.0:
            return None
        rate = self._received / (now - self._started)
        return rate if rate < EVICTABLE_BODY_RATE else None

    def progress(self, count: int) -> None:
        """`count` more body bytes arrived; refuse a body that comes too slowly."""
        self._received += count
        elapsed = time.monotonic() - self._started
        if elapsed > BODY_GRACE_SECONDS and self._received < BODY_MIN_RATE * elapsed:
            raise _Timeout("request body arriving too slowly")

    def readline(self, size: int | None = -1) -> bytes:  # WSGI asks for it; bodies here are not lines
        return self.read(size)

    def readlines(self, hint: int | None = None) -> list[bytes]:
        data = self.read()
        return [data] if data else []

    def __iter__(self):
        data = self.read()
        return iter([data] if data else [])

    def skippable(self) -> bool:
        """Whether what the app left unread can be skipped to reuse the connection: not when the
        client still waits for 100 Continue, nor for a large body (cheaper to close)."""
        if self._continue:
            return False
        # A chunked body's length is unknown until its end: left unread, the connection closes.
        return (self._done and not self._chunk_left) if self._chunked else self._remaining <= 16 * _RECV

    def finish(self) -> bool:
        """Skip what the app left unread; False when the connection cannot be reused."""
        if not self.skippable():
            return False
        try:
            while not (self._done and not self._buf):
                self._buf = b""
                self._read(_RECV)
        except (_ClientGone, _BadRequest, OSError):
            return False
        return True


_default_parse = head_parser()


class _Connection:
    __slots__ = ("sock", "pending", "server_addr", "client_addr", "parse", "body", "head", "head_env",
                 "gone", "facts")

    def __init__(self, sock: socket.socket, server_addr: tuple, client_addr: tuple,
                 parse: Callable = _default_parse) -> None:
        self.parse = parse  # host.http.h1c.head_parser, with the server's header limits
        self.sock = sock
        self.pending = b""  # received, not yet consumed
        self.server_addr = server_addr
        self.client_addr = client_addr
        self.body: _Body | None = None  # the body of the request being handled
        # The last head parsed on this connection and its environ, untouched: a client sends the
        # same head again and again (same model, same sizes), and parsing it into an environ
        # costs more than the rest of reading the request (see read_environ).
        self.head = b""
        self.head_env: dict[str, Any] = {}
        self.gone = functools.partial(_peer_closed, sock)  # CLIENT_GONE of its requests
        # The framing of the request being read (host.http.server._framing): kept while the
        # same head comes again, None when a new one must be worked out.
        self.facts: tuple[bool, bool, bool, int, bool] | None = None

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError as exc:
            raise _ClientGone() from exc

    def recv(self) -> bytes:
        try:
            data = self.sock.recv(_RECV)
        except OSError as exc:
            raise _ClientGone() from exc
        if not data:
            raise _ClientGone()
        return data

    def read_exact(self, n: int, body: _Body | None = None) -> bytes:
        pending = self.pending
        if len(pending) >= n:
            self.pending = pending[n:] if len(pending) > n else b""
            return pending[:n] if len(pending) > n else pending
        parts = [pending]
        have = len(pending)
        self.pending = b""
        while have < n:
            try:
                chunk = self.sock.recv(min(n - have, 4 * 1024 * 1024))
            except OSError as exc:
                raise _ClientGone() from exc
            if not chunk:
                raise _ClientGone()
            parts.append(chunk)
            have += len(chunk)
            if body is not None:
                body.progress(len(chunk))
        return b"".join(parts)

    def read_line(self, body: _Body | None = None) -> bytes:
        while b"\r\n" not in self.pending:
            if len(self.pending) > MAX_HEADER_BYTES:
                raise _BadRequest("line too long")
            data = self.recv()
            self.pending += data
            if body is not None:
                body.progress(len(data))
        line, self.pending = self.pending.split(b"\r\n", 1)
        return line

    def _parse_chunked_over_length(self, data: bytes) -> tuple[dict, int]:
        """A head with both Content-Length and Transfer-Encoding: as Triton (libevent) and RFC
        9112 section 6.3 say, Transfer-Encoding wins; the connection closes after the answer
        (RFC 9112 6.1), so a body framed two ways cannot smuggle a second request."""
        end = data.find(b"\r\n\r\n")
        if end < 0:
            raise _BadRequest(_CL_WITH_TE)
        lines = data[:end].split(b"\r\n")
        kept = [line for line in lines if not line.lower().startswith(b"content-length:")]
        try:
            env, _ = self.parse(b"\r\n".join(kept) + b"\r\n\r\n", self.server_addr, self.client_addr)
        except (IncompleteError, ParseError) as exc:
            raise _BadRequest(str(exc) or type(exc).__name__) from None
        env[_CLOSE_AFTER] = True
        return env, end + 4

    def read_environ(self) -> dict | None:
        """The next request's environ, or None when the client closed between requests.

        A request's head must arrive within HEADER_SECONDS of its first byte: a client that
        trickles its headers (slowloris) is cut off instead of holding its thread for ever."""
        data = self.pending
        started = time.monotonic() if data else 0.0
        while True:
            if data:
                head = self.head
                if head and data.startswith(head):
                    # The bytes of a head the parser took, up to its end: the parser reads no
                    # further, so it would give the same environ (the addresses are this
                    # connection's). A copy: the request's handling writes into its environ.
                    env, consumed = self.head_env.copy(), len(head)
                    break
                self.facts = None
                try:
                    env, consumed = self.parse(data, self.server_addr, self.client_addr)
                    self.head, self.head_env = data[:consumed], env.copy()
                    break
                except IncompleteError:
                    if len(data) > MAX_HEADER_BYTES:
                        raise _BadRequest("request headers too large") from None
                except ParseError as exc:
                    if str(exc) != _CL_WITH_TE:
                        raise _BadRequest(str(exc) or type(exc).__name__) from None
                    env, consumed = self._parse_chunked_over_length(data)
                    self.head = b""  # framed two ways: never taken again from a kept environ
                    break
            try:
                chunk = self.sock.recv(_RECV)
            except OSError:
                return None
            if not chunk:
                if data:
                    raise _ClientGone()
                return None
            now = time.monotonic()
            if not data:
                started = now
            elif now - started > HEADER_SECONDS:
                raise _Timeout("request headers not received in time")
            data = data + chunk if data else chunk
        self.pending = data[consumed:]
        return env


def _status_has_body(status: str) -> bool:
    return not status.startswith(_NO_BODY_STATUS)


class HTTPServer:
    """`HTTPServer.bind(app, host, port).serve_forever()`; `shutdown()` from another thread.

    Built over listening sockets it is given (gunicorn's, in `host.http.worker`) or binds its own.
    Accept loops poll their listener with a short timeout instead of being woken by closing it:
    a listener inherited from gunicorn's master must stay open for the next worker.
    """

    ACCEPT_POLL_SECONDS = 0.1  # also how long the end of a drain waits for them to stop
    # The request-head parser (host.http.h1c.head_parser); host.http.worker gives the server one
    # with gunicorn's limit_request_* settings.
    parse_head: Callable = staticmethod(_default_parse)

    def __init__(self, app: WSGIApp, listeners: list[socket.socket], *, max_connections: int = 1024,
                 keepalive_timeout: float = 120.0, ssl_context: ssl.SSLContext | None = None) -> None:
        self.app = app
        self.ssl_context = ssl_context  # HTTPS: each connection's thread does its handshake
        self.listeners = listeners
        self.address = listeners[0].getsockname()[:2]
        self.keepalive_timeout = keepalive_timeout
        self._owns_listeners = False
        self.max_connections = max_connections
        self._slots = threading.BoundedSemaphore(max_connections)
        self._lock = threading.Lock()
        # socket -> False when idle; its _Connection (or True once chosen for closing) when busy
        self._connections: dict[socket.socket, bool | _Connection] = {}
        self._stopping = threading.Event()
        # drain(): new connections are closed as they come; open ones are still served
        self._refusing = threading.Event()
        self._close_when_idle = False  # drain(close_idle=True): a connection ends with its response
        self._accepting = 0
        self._stopped = threading.Event()
        self._base_env = {
            "wsgi.version": (1, 0), "wsgi.errors": sys.stderr, "wsgi.multithread": True,
            "wsgi.multiprocess": False, "wsgi.run_once": False, "SCRIPT_NAME": "",
            "SERVER_SOFTWARE": "modelhost",
        }

    @classmethod
    def bind(cls, app: WSGIApp, host: str = "0.0.0.0", port: int = 8000, *, backlog: int = 1024,
             **kwargs: Any) -> HTTPServer:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        server = cls(app, [sock], **kwargs)
        server._owns_listeners = True
        return server

    @property
    def port(self) -> int:
        return self.address[1]

    # --- lifecycle -----------------------------------------------------------------------------
    def serve_forever(self) -> None:
        """Accept on every listener until `shutdown()`; returns when all accept loops ended."""
        others = [threading.Thread(target=self._accept_loop, args=(listener,), daemon=True,
                                   name="http-accept") for listener in self.listeners[1:]]
        for t in others:
            t.start()
        try:
            self._accept_loop(self.listeners[0])
            for t in others:
                t.join()
        finally:
            self._stopped.set()

    def _accept_loop(self, listener: socket.socket) -> None:
        listener.settimeout(self.ACCEPT_POLL_SECONDS)
        while not self._stopping.is_set():
            try:
                sock, client = listener.accept()
            except (TimeoutError, BlockingIOError, InterruptedError):
                continue
            except OSError as exc:
                if self._stopping.is_set():
                    break
                _quiet_log.error("accept failed: %s", exc)  # e.g. out of file descriptors
                self._stopping.wait(0.05)
                continue
            if self._stopping.is_set():
                sock.close()
                break
            if self._refusing.is_set():  # draining: as Triton, a new connection is closed at once
                sock.close()
                continue
            if not self._take_slot():
                _quiet_log.warning("all %d connections are busy with requests; refused %s",
                                   self.max_connections, client[0])
                _refuse(sock)
                continue
            threading.Thread(target=self._serve, args=(sock, client), daemon=True,
                             name=f"http-{client[1] if len(client) > 1 else ''}").start()

    def _take_slot(self) -> bool:
        """A connection slot for a new client. When every slot is held, the connection idle the
        longest (between requests, or still sending its headers) is closed to make room, else
        the one whose body arrives the slowest (EVICTABLE_BODY_RATE): idle and slow clients,
        however many, cannot lock out one that has a request to make."""
        if self._slots.acquire(blocking=False):
            return True
        for _ in range(3):
            with self._lock:
                idle = next((s for s, busy in self._connections.items() if not busy), None)
                if idle is None:
                    idle = self._slowest_body()
                if idle is None:
                    return False
                self._connections[idle] = True  # not chosen twice; its thread removes it
            _shutdown_socket(idle)
            if self._slots.acquire(timeout=1.0):
                return True
        return False

    def _slowest_body(self) -> socket.socket | None:
        """The connection whose request body arrives the slowest, if one is slow (under _lock)."""
        now, slowest, lowest = time.monotonic(), None, float("inf")
        for sock, conn in self._connections.items():
            body = getattr(conn, "body", None)
            rate = body.slow_rate(now) if body is not None else None
            if rate is not None and rate < lowest:
                slowest, lowest = sock, rate
        return slowest

    def drain(self, seconds: int, close_idle: bool = False) -> int:
        """Stop as Triton's HTTP front end does on SIGINT/SIGTERM (HTTPServer::Stop with its exit
        timeout): new connections are closed as they arrive, the open ones (keep-alive ones
        included) are served until their clients close them or `seconds` run out, with a line
        a second; returns the seconds left of the exit timeout. Then `shutdown(0)`.

        `close_idle`: close the connections that are idle now instead of waiting for them
        (modelhost's test servers, whose clients often outlive them)."""
        self._refusing.set()
        self._close_when_idle = close_idle
        left = max(int(seconds), 0)
        ticks = threading.Event()
        while left > 0:
            if close_idle:
                self._close_idle()
            with self._lock:
                count = len(self._connections)
            if not count:
                break
            log.info("Timeout %d: Found %d HTTP service connections", left, count)
            # a second, but ended early when the last connection closes (no idle wait)
            for _ in range(20):
                if close_idle:
                    self._close_idle()
                with self._lock:
                    if not self._connections:
                        break
                ticks.wait(0.05)
            left -= 1
        self._stopping.set()
        # the accept loops end within a poll: then closing the listeners frees the port at once
        self._stopped.wait(2 * self.ACCEPT_POLL_SECONDS)
        self.shutdown(0)
        return left

    def _close_idle(self) -> None:
        with self._lock:
            for sock, busy in self._connections.items():
                if not busy:
                    _shutdown_socket(sock)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop accepting, let requests in progress finish (up to `timeout`), close idle connections."""
        self._stopping.set()
        self._stopped.wait(timeout)
        if self._owns_listeners:
            for listener in self.listeners:
                listener.close()
        deadline = threading.Event()
        waited = 0.0
        while True:
            with self._lock:
                for sock, busy in self._connections.items():
                    if not busy:
                        _shutdown_socket(sock)
                left = len(self._connections)
            if not left or waited >= timeout:
                break
            deadline.wait(0.05)
            waited += 0.05
        with self._lock:
            for sock in self._connections:
                _shutdown_socket(sock)

    # --- one connection --------------------------------------------------------------------------
    def _serve(self, sock: socket.socket, client: tuple) -> None:
        affinity.pin()  # this thread runs Python: on the Python CPU (host.affinity)
        with self._lock:
            self._connections[sock] = False
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.ssl_context is not None:
                tls_sock = self._handshake(sock, client)
                if tls_sock is None:
                    return
                with self._lock:
                    self._connections.pop(sock, None)
                    self._connections[tls_sock] = False
                sock = tls_sock
            _set_kernel_timeouts(sock, self.keepalive_timeout)
            conn = _Connection(sock, self.address, client[:2], self.parse_head)
            while not self._stopping.is_set():
                try:
                    env = conn.read_environ()
                except _BadRequest as exc:
                    _quiet_log.warning("bad request from %s: %s", client[0], exc)
                    _reply_error(conn, exc.status, str(exc))
                    return
                except _ClientGone:
                    return
                if env is None:
                    return
                with self._lock:
                    self._connections[sock] = conn  # busy (true), and its body can be looked at
                try:
                    keep_alive = self._handle(conn, env)
                except _BadRequest as exc:
                    _quiet_log.warning("bad request from %s: %s", client[0], exc)
                    _reply_error(conn, exc.status, str(exc))
                    return
                except _ClientGone:
                    _quiet_log.warning("connection from %s ended in the middle of a request",
                                       client[0])
                    return
                finally:
                    conn.body = None
                    with self._lock:
                        self._connections[sock] = False
                if not keep_alive:
                    return
        except BaseException:  # noqa: BLE001 - a connection's failure must not reach the accept loop
            log.exception("connection from %s failed", client)
        finally:
            with self._lock:
                self._connections.pop(sock, None)
            try:
                sock.close()
            finally:
                self._slots.release()

    def _handshake(self, sock: socket.socket, client: tuple) -> ssl.SSLSocket | None:
        """The TLS handshake, bounded in time; None (connection closed) when it fails."""
        assert self.ssl_context is not None
        try:
            _set_kernel_timeouts(sock, HANDSHAKE_SECONDS)
            return self.ssl_context.wrap_socket(sock, server_side=True)
        except (OSError, ValueError) as exc:
            _quiet_log.warning("TLS handshake with %s failed: %s", client[0], exc)
            return None

    def _handle(self, conn: _Connection, env: dict) -> bool:
        """Run one request; True when the connection stays open."""
        env.update(self._base_env)
        path = env["PATH_INFO"]
        if "%" in path:
            env["PATH_INFO"] = unquote_to_bytes(path).decode("latin-1")
        facts = conn.facts  # the head's framing, when it is the last head again (read_environ)
        if facts is None:
            facts = conn.facts = _framing(env)
        http11, keep_alive, chunked, length, expect = facts
        body = conn.body = _Body(conn, length, chunked, expect)
        env["wsgi.input"] = body
        env[CLIENT_GONE] = conn.gone

        state: dict[str, Any] = {}

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None):
            if exc_info and state.get("sent"):
                raise exc_info[1].with_traceback(exc_info[2])
            state["status"], state["headers"] = status, headers
            return _no_write

        result = self.app(env, start_response)
        if body.failure is not None:
            failure, body.failure = body.failure, None
            close = getattr(result, "close", None)
            if close is not None:
                close()
            try:
                raise failure
            finally:  # no cycle (this frame -> failure -> its traceback -> this frame) to keep the
                del failure  # connection and its buffers alive until the garbage collector runs
        try:
            keep_alive = self._respond(conn, env, state, result, http11, keep_alive and body.skippable())
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        return (body.finish() and keep_alive and not self._stopping.is_set()
                and not self._close_when_idle)

    def _respond(self, conn: _Connection, env: dict, state: dict, result: Iterable[bytes],
                 http11: bool, keep_alive: bool) -> bool:
        status: str = state["status"]
        headers = state["headers"]
        length = None
        lines = [f"HTTP/1.1 {status}\r\n"]
        for name, value in headers:
            lname = name.lower()
            if lname == "content-length":
                length = value
            elif lname == "connection" and value.lower() == "close":
                keep_alive = False
            lines.append(f"{name}: {value}\r\n")
        head_only = env["REQUEST_METHOD"] == "HEAD" or not _status_has_body(status)
        if isinstance(result, (list, tuple)) and (len(result) <= 1 or length is not None):
            data = result[0] if len(result) == 1 else b"".join(result)
            if length is None and not head_only:
                lines.append(f"Content-Length: {len(data)}\r\n")
            lines.append(_connection_header(keep_alive, http11))
            head = "".join(lines).encode("latin-1")
            state["sent"] = True
            if head_only or not data:
                conn.send(head)
            elif len(data) < _SMALL_RESPONSE:
                conn.send(head + data)
            else:
                conn.send(head)
                conn.send(data)
            return keep_alive
        # A streamed body (server-sent events): chunked on HTTP/1.1, else until the connection closes.
        use_chunks = length is None and http11 and not head_only
        if use_chunks:
            lines.append("Transfer-Encoding: chunked\r\n")
        elif length is None:
            keep_alive = False
        lines.append(_connection_header(keep_alive, http11))
        conn.send("".join(lines).encode("latin-1"))
        state["sent"] = True
        for chunk in result:
            if not chunk or head_only:
                continue
            conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk) if use_chunks else chunk)
        if use_chunks:
            conn.send(b"0\r\n\r\n")
        return keep_alive


def _framing(env: dict) -> tuple[bool, bool, bool, int, bool]:
    """(HTTP/1.1, keep-alive, chunked, Content-Length, Expect: 100-continue) of a request head,
    or the error that refuses it. A function of the head alone: a connection keeps it with the
    head's environ (_Connection.read_environ)."""
    http11 = env["SERVER_PROTOCOL"] == "HTTP/1.1"
    connection = env.get("HTTP_CONNECTION", "").lower()
    keep_alive = ("close" not in connection) if http11 else ("keep-alive" in connection)
    if env.pop(_CLOSE_AFTER, False):
        keep_alive = False
    coding = env.get("HTTP_TRANSFER_ENCODING")
    chunked = coding is not None
    if coding is not None:  # chunked
        # Only plain `chunked` (RFC 9112 6.1): other codings are not implemented, and a
        # body framed two ways (with Content-Length too) is how requests are smuggled.
        if [c.strip().lower() for c in coding.split(",")] != ["chunked"]:
            raise _NotImplemented(f"unsupported Transfer-Encoding '{coding}'")
        if env.get("CONTENT_LENGTH"):
            raise _BadRequest("a request may not have both Content-Length and Transfer-Encoding")
        length = 0
    else:
        try:
            length = int(env.get("CONTENT_LENGTH") or 0)
        except ValueError:
            raise _BadRequest("invalid Content-Length") from None
        if length < 0:
            raise _BadRequest("invalid Content-Length")
    expect = env.get("HTTP_EXPECT", "").lower() == "100-continue"
    return http11, keep_alive, chunked, length, expect


def _connection_header(keep_alive: bool, http11: bool) -> str:
    """The end of the response head, saying when the connection does not do its version's default."""
    if not keep_alive:
        return "Connection: close\r\n\r\n"
    return "\r\n" if http11 else "Connection: keep-alive\r\n\r\n"


def _no_write(data: bytes) -> None:
    raise NotImplementedError("the write() callable is not supported; return an iterable")


def _reply_error(conn: _Connection, status: str, message: str) -> None:
    body = ('{"error":"%s"}' % message.replace("\\", "\\\\").replace('"', '\\"')).encode()
    head = (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode("latin-1")
    try:
        conn.send(head + body)
    except _ClientGone:
        pass


def _refuse(sock: socket.socket) -> None:
    try:
        sock.settimeout(1.0)
        body = b'{"error":"Server is busy: too many connections"}'
        sock.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
    except OSError:
        pass
    finally:
        sock.close()


def _peer_closed(sock: socket.socket) -> bool:
    """True once the client closed its side (a long request can stop working for nobody)."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True


def _set_kernel_timeouts(sock: socket.socket, seconds: float) -> None:
    """Idle and stalled-peer limits enforced by the kernel (SO_RCVTIMEO/SO_SNDTIMEO).

    A Python-level `settimeout` would poll() before every recv and send: two more system calls
    per request. With kernel timeouts the socket stays blocking and a limit that expires
    surfaces as an OSError (EAGAIN), which ends the connection like any socket error.
    """
    sock.settimeout(None)
    whole = int(seconds)
    value = struct.pack("ll", whole, int((seconds - whole) * 1_000_000))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)


def _shutdown_socket(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def serve(app: WSGIApp, host: str = "0.0.0.0", port: int = 8000, **kwargs: Any) -> HTTPServer:
    """Start serving `app` on a background thread; returns the server (call `shutdown()` to stop)."""
    server = HTTPServer.bind(app, host, port, **kwargs)
    threading.Thread(target=server.serve_forever, name="http-accept", daemon=True).start()
    return server
