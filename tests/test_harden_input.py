"""Issue 15, finding 8 and the transport defects of issue 16: bad input is a 4xx, never a 500 nor a
traceback flood, and careless or hostile connections do not starve good clients.
"""

from __future__ import annotations

import json
import resource
import socket
import time

import grpc
import pytest
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from host.testing import serve
from test_e2e_serve import infer, write_identity

pytestmark = [pytest.mark.timeout(180), pytest.mark.modelhost_only]

MODEL = "a"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    write_identity(repo, MODEL)
    with serve(repo, "--http-max-input-size", str(1 << 20)) as s:
        yield s


def _raw(server, data: bytes, timeout: float = 20.0) -> bytes:
    """Send bytes as they are; the whole answer (the server closes or answers once)."""
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=timeout) as sock:
        sock.sendall(data)
        answer = b""
        while b"\r\n\r\n" not in answer:
            part = sock.recv(65536)
            if not part:
                break
            answer += part
        return answer


def _post(server, body: bytes) -> tuple[int, str]:
    head = (f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=20) as sock:
        sock.sendall(head + body)
        answer = b""
        while True:
            part = sock.recv(65536)
            if not part:
                break
            answer += part
    status = int(answer.split(b" ", 2)[1])
    return status, answer.split(b"\r\n\r\n", 1)[1].decode()


def _json_input(shape, data):
    return json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": shape,
                                   "data": data}]}).encode()


def test_impossible_shapes_and_deep_json_are_400_over_http(server):
    cases = [
        (_json_input([0, 2**62], []), "is too large"),
        (_json_input([1] * 70, [1.0]), "has 70 dimensions"),
        (b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1],"data":' + b"[" * 1000 + b"1"
         + b"]" * 1000 + b"}]}", "JSON nesting depth exceeds maximum allowed limit (100)"),
    ]
    for body, words in cases:
        status, text = _post(server, body)
        assert status == 400 and words in text, (status, text)
    # binary tensor data with an impossible shape
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [0, 2**62],
                                     "parameters": {"binary_data_size": 0}}]}).encode()
    head = (f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: x\r\nInference-Header-Content-Length: "
            f"{len(header)}\r\nContent-Length: {len(header)}\r\nConnection: close\r\n\r\n").encode()
    assert b" 400 " in _raw(server, head + header).split(b"\r\n")[0]
    assert infer(httpclient.InferenceServerClient(server.url), MODEL, [1.0]).tolist() == [1.0]


def test_impossible_shapes_are_invalid_argument_over_grpc(server):
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.grpc_url))
    for shape, words in (([0, 2**62], "is too large"), ([1] * 70, "has 70 dimensions"),
                         ([2**40, 2**40], "is too large")):
        for raw in (True, False):
            request = pb.ModelInferRequest(model_name=MODEL)
            tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=shape)
            if raw:
                request.raw_input_contents.append(b"")
            else:
                tensor.contents.fp32_contents.extend([])
            with pytest.raises(grpc.RpcError) as info:
                stub.ModelInfer(request, timeout=20)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert words in info.value.details()


def test_malformed_bodies_log_one_line_each_at_most(server):
    before = server.log_text()
    bad = [
        b"POST /v2/models/a/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"POST /v2/models/a/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n",
        b"POST /v2/models/a/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n",
    ]
    for _ in range(20):
        for data in bad:
            assert b" 400 " in _raw(server, data).split(b"\r\n")[0]
    # short bodies: the client announces more than it sends, then leaves
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=20) as sock:
            sock.sendall(b"POST /v2/models/a/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    time.sleep(0.5)
    added = server.log_text()[len(before):]
    assert "Traceback" not in added
    assert added.count("\n") <= 6, added  # rate-limited: a few lines, not one per request
    assert infer(httpclient.InferenceServerClient(server.url), MODEL, [2.0]).tolist() == [2.0]


def test_chunk_framing_is_strict(server):
    gz = _raw(server, b"POST /v2/models/a/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
                      b"0\r\n\r\n")
    assert b" 501 " in gz.split(b"\r\n")[0]
    body = _json_input([1], [3.0])
    # Content-Length and Transfer-Encoding both: Transfer-Encoding wins (RFC 9112 6.3, as Triton
    # does), and the connection closes after the answer, so what follows is never a request.
    smuggled = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=20) as sock:
        sock.sendall(b"POST /v2/models/a/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n%s"
                     % (len(body), body, smuggled))
        answer = b""
        while part := sock.recv(65536):
            answer += part
    assert b" 200 " in answer.split(b"\r\n")[0] and answer.count(b"HTTP/1.1 ") == 1
    good = _raw(server, b"POST /v2/models/a/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                        b"Connection: close\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
    assert b" 200 " in good.split(b"\r\n")[0]


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))


def _worker_pid(server) -> int:
    with open(f"/proc/{server.pid}/task/{server.pid}/children") as f:
        return int(f.read().split()[0])


def test_a_chunk_claiming_a_terabyte_does_not_grow_the_worker(server):
    worker = _worker_pid(server)
    before = _rss_kib(worker)
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=20) as sock:
        sock.sendall(b"POST /v2/models/a/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"10000000000\r\n")  # 1 TiB announced
        block = b"x" * (1 << 20)
        answer = b""
        try:
            for _ in range(8):  # 8 MiB sent, 8 times the limit
                sock.sendall(block)
        except OSError:
            pass  # the server answered and closed: what we want
        sock.settimeout(20)
        try:
            while b"\r\n\r\n" not in answer:
                part = sock.recv(65536)
                if not part:
                    break
                answer += part
        except OSError:
            pass
    assert b" 400 " in answer.split(b"\r\n")[0] and b"maximum allowed input size" in answer
    assert _rss_kib(worker) - before < 64 * 1024  # far below the 1 TiB it claimed
    assert infer(httpclient.InferenceServerClient(server.url), MODEL, [4.0]).tolist() == [4.0]


def test_idle_and_slow_clients_do_not_lock_out_a_good_one(server):
    idle = []
    try:
        for _ in range(1100):  # more than the worker's 1024 connections
            idle.append(socket.create_connection(("127.0.0.1", server.http_port), timeout=20))
        for sock in idle[:20]:  # slowloris: a head that never ends
            sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nX-a: ")
        client = httpclient.InferenceServerClient(server.url, network_timeout=30)
        assert infer(client, MODEL, [5.0]).tolist() == [5.0]
        assert client.is_server_ready()
    finally:
        for sock in idle:
            sock.close()


def test_idle_grpc_connections_leave_descriptors_for_http(tmp_path):
    """HTTP and gRPC share the process's descriptors. Started with the usual soft limit of 1024
    (as on most machines), the server raises it to the hard one (host.startup.raise_file_limit):
    1,100 idle gRPC connections, which send not even an HTTP/2 preface, then leave descriptors
    to accept HTTP and gRPC clients (without it, both stop answering, as Triton does)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip(f"the hard limit on open files here ({hard}) is too low for the test")
    write_identity(tmp_path, MODEL)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))  # what the server inherits
    try:
        started = serve(tmp_path)
        server = started.__enter__()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if soft != resource.RLIM_INFINITY and soft < 2048:  # this process opens 1,100 sockets itself
        resource.setrlimit(resource.RLIMIT_NOFILE, (4096, hard))
    idle = []
    try:
        for _ in range(1100):
            idle.append(socket.create_connection(("127.0.0.1", server.grpc_port), timeout=20))
        client = httpclient.InferenceServerClient(server.url, network_timeout=30)
        assert infer(client, MODEL, [6.0]).tolist() == [6.0]
        channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ServerReady(pb.ServerReadyRequest(), timeout=30).ready
        channel.close()
    finally:
        for sock in idle:
            sock.close()
        started.__exit__(None, None, None)


def test_slow_bodies_in_every_slot_do_not_lock_out_a_good_client():
    """Every connection slot held by a client trickling a large body (each fast enough for
    BODY_MIN_RATE, so none is cut off for hours): a new client still gets its answer, as the
    slowest body's connection is closed to make room."""
    from host.http import server as http_server

    def app(env, start_response):
        data = env["wsgi.input"].read(int(env.get("CONTENT_LENGTH") or 0))
        start_response("200 OK", [("Content-Length", str(len(data)))])
        return [data]

    served = http_server.serve(app, "127.0.0.1", 0, max_connections=8)
    slow = []
    try:
        for _ in range(8):
            sock = socket.create_connection(("127.0.0.1", served.port), timeout=20)
            sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n" + b"x" * 100)
            slow.append(sock)
        time.sleep(1.5)  # each body has now arrived for over a second, far below the eviction rate
        for sock in slow:
            sock.sendall(b"x" * 100)
        with socket.create_connection(("127.0.0.1", served.port), timeout=20) as sock:
            sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc")
            answer = b""
            while not answer.endswith(b"abc"):
                chunk = sock.recv(4096)
                assert chunk, answer
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200")
    finally:
        for sock in slow:
            sock.close()
        served.shutdown(timeout=2)


def test_a_body_that_trickles_in_is_cut_off(monkeypatch):
    """R-U-Dead-Yet: a client that sends its body a byte at a time is answered 408 once its
    average rate falls below the minimum after the grace period (made short here)."""
    from host.http import server as http_server

    monkeypatch.setattr(http_server, "BODY_GRACE_SECONDS", 0.5)

    def app(env, start_response):
        data = env["wsgi.input"].read(int(env.get("CONTENT_LENGTH") or 0))
        start_response("200 OK", [("Content-Length", str(len(data)))])
        return [data]

    served = http_server.serve(app, "127.0.0.1", 0)
    try:
        with socket.create_connection(("127.0.0.1", served.port), timeout=20) as sock:
            sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
            answer = b""
            for _ in range(200):
                try:
                    sock.sendall(b"x")
                except OSError:
                    break
                time.sleep(0.02)
                sock.setblocking(False)
                try:
                    answer += sock.recv(4096)
                except BlockingIOError:
                    pass
                finally:
                    sock.setblocking(True)
                if answer:
                    break
            assert b" 408 " in answer.split(b"\r\n")[0], answer
        with socket.create_connection(("127.0.0.1", served.port), timeout=20) as sock:  # still serving
            sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc")
            assert sock.recv(4096).endswith(b"abc")
    finally:
        served.shutdown(1)


def test_a_head_that_trickles_in_is_cut_off(monkeypatch):
    """Slowloris: headers sent a few bytes at a time get 408 once the head deadline passes
    (made short here)."""
    from host.http import server as http_server

    monkeypatch.setattr(http_server, "HEADER_SECONDS", 0.5)

    def app(env, start_response):
        start_response("200 OK", [("Content-Length", "2")])
        return [b"ok"]

    served = http_server.serve(app, "127.0.0.1", 0)
    try:
        with socket.create_connection(("127.0.0.1", served.port), timeout=20) as sock:
            answer = b""
            for piece in [b"GET / HTTP/1.1\r\n"] + [b"X-a: b\r\n"] * 200:
                try:
                    sock.sendall(piece)
                except OSError:
                    break
                time.sleep(0.02)
                sock.setblocking(False)
                try:
                    answer += sock.recv(4096)
                except BlockingIOError:
                    pass
                finally:
                    sock.setblocking(True)
                if answer:
                    break
            assert b" 408 " in answer.split(b"\r\n")[0], answer
    finally:
        served.shutdown(1)


def test_a_repeated_head_is_parsed_once_and_each_request_gets_its_own_environ():
    """A connection keeps the environ of its last head: the same head again is not parsed
    again. Each request still gets an environ of its own (what the app writes into one is not
    in the next), and a head that differs in one byte, or a pipelined request behind it, is
    read as it is."""
    from host.http import server as http_server

    parsed = []

    def counting_parse(data, server_addr, client_addr):
        parsed.append(data)
        return http_server._default_parse(data, server_addr, client_addr)

    def app(env, start_response):
        seen = "leak" in env
        env["leak"] = True
        env["PATH_INFO"] = "/changed"
        body = f"{env['REQUEST_METHOD']} {env['QUERY_STRING']} {env.get('HTTP_X_TAG')} {seen}".encode()
        start_response("200 OK", [("Content-Length", str(len(body)))])
        return [body]

    served = http_server.serve(app, "127.0.0.1", 0)
    served.parse_head = staticmethod(counting_parse)
    heads = [b"GET /a?q=1 HTTP/1.1\r\nHost: x\r\nX-Tag: 1\r\n\r\n",
             b"GET /a?q=1 HTTP/1.1\r\nHost: x\r\nX-Tag: 1\r\n\r\n",
             b"GET /a?q=1 HTTP/1.1\r\nHost: x\r\nX-Tag: 2\r\n\r\n",
             b"GET /a?q=2 HTTP/1.1\r\nHost: x\r\nX-Tag: 2\r\n\r\n"]
    try:
        with socket.create_connection(("127.0.0.1", served.port), timeout=20) as sock:
            answers = []
            for head in heads[:2]:  # one at a time
                sock.sendall(head)
                answers.append(sock.recv(4096))
            sock.sendall(heads[2] + heads[3])  # pipelined: the fourth waits behind the third
            rest = b""
            while rest.count(b"HTTP/1.1 200") < 2:
                rest += sock.recv(4096)
            answers += [b"HTTP/1.1" + part for part in rest.split(b"HTTP/1.1")[1:]]
        bodies = [a.split(b"\r\n\r\n", 1)[1] for a in answers]
        assert bodies == [b"GET q=1 1 False", b"GET q=1 1 False", b"GET q=1 2 False", b"GET q=2 2 False"]
        assert len(parsed) == 3  # the second head came from the first one's environ
    finally:
        served.shutdown(1)
