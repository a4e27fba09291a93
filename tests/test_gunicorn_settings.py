"""gunicorn's own settings under modelhost's HTTP worker (host.http.worker.ConnectionWorker), with
real gunicorn and real sockets: honoured (header limits, keepalive 0, max_requests) or refused at
boot with a message (accesslog). A plain WSGI app stands in for the host: these are the worker's
rules, the app does not matter (and a small one starts in a second)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

APP = '''
import os
def app(environ, start_response):
    body = str(os.getpid()).encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gunicorn(tmp_path, *flags: str) -> tuple[subprocess.Popen, int]:
    (tmp_path / "plainapp.py").write_text(APP)
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-k", "host.http.worker.ConnectionWorker", "-w", "1",
         "-b", f"127.0.0.1:{port}", "--chdir", str(tmp_path), *flags, "plainapp:app"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, port


def _exchange(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return data  # the server closed the connection
            data += chunk


def _wait_serving(proc: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    pytest.fail("gunicorn did not start")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_limits_keepalive_and_max_requests_are_honoured(tmp_path):
    proc, port = _gunicorn(tmp_path, "--limit-request-line", "64", "--limit-request-fields", "4",
                           "--limit-request-field_size", "100", "--keep-alive", "0",
                           "--max-requests", "3")
    try:
        _wait_serving(proc, port)
        ok = _exchange(port, b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
        # keepalive 0: the response says close, and the server closed (the read above ended)
        assert ok.startswith(b"HTTP/1.1 200") and b"Connection: close" in ok
        first_pid = ok.rsplit(b"\r\n\r\n", 1)[1]

        long_line = _exchange(port, b"GET /" + b"a" * 100 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert long_line.startswith(b"HTTP/1.1 400"), long_line
        many = b"".join(b"X-%d: y\r\n" % i for i in range(6))
        too_many = _exchange(port, b"GET /a HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n")
        assert too_many.startswith(b"HTTP/1.1 400"), too_many
        big_field = _exchange(port, b"GET /a HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 200 + b"\r\n\r\n")
        assert big_field.startswith(b"HTTP/1.1 400"), big_field

        # max_requests 3: after its third request the worker leaves and gunicorn starts another
        pids = {first_pid}
        deadline = time.monotonic() + 30
        while len(pids) < 2 and time.monotonic() < deadline:
            try:
                reply = _exchange(port, b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
            except OSError:
                time.sleep(0.2)
                continue
            if reply.startswith(b"HTTP/1.1 200"):
                pids.add(reply.rsplit(b"\r\n\r\n", 1)[1])
            time.sleep(0.2)
        assert len(pids) == 2, "the worker was not restarted after max_requests"
    finally:
        _stop(proc)


def test_accesslog_is_refused_with_a_message(tmp_path):
    proc, _ = _gunicorn(tmp_path, "--access-logfile", "-")
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            _stop(proc)
    assert proc.returncode != 0
    assert "unsupported gunicorn setting accesslog" in out, out


def test_modelhost_serve_keeps_its_header_limits():
    """`modelhost serve` sets the limits it always had (8190-byte lines): a long model URL passes."""
    from host.http.h1c import Limits, head_parser

    parse = head_parser(Limits(8190, 100, 8190))
    env, consumed = parse(b"GET /v2/models/" + b"m" * 5000 + b" HTTP/1.1\r\n\r\n", ("h", 1), ("c", 2))
    assert env["PATH_INFO"].endswith("m" * 10) and consumed == 5000 + 28


@pytest.mark.skipif(os.name != "posix", reason="gunicorn runs on POSIX only")
def test_h1c_contract():
    """What host.http.h1c relies on, in the installed gunicorn_h1c: the environ it builds, where the
    head ends (through the private key, and through the public parser: both agree), the limits."""
    import gunicorn_h1c

    from host.http import h1c

    data = b"POST /v2/x?y=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabcGET"
    env, consumed = h1c.head_parser()(data, ("h", 1), ("c", 2))
    assert consumed == data.index(b"abc") == gunicorn_h1c.parse_request(data)["consumed"]
    assert (env["REQUEST_METHOD"], env["PATH_INFO"], env["QUERY_STRING"], env["CONTENT_LENGTH"],
            env["SERVER_PROTOCOL"], env["REMOTE_ADDR"]) == ("POST", "/v2/x", "y=1", "3", "HTTP/1.1", "c")
    assert "_consumed" not in env
    with pytest.raises(h1c.IncompleteError):
        h1c.head_parser()(data[:20], ("h", 1), ("c", 2))
    with pytest.raises(h1c.ParseError):
        h1c.head_parser(h1c.Limits(line=10))(data, ("h", 1), ("c", 2))
