"""Soak test: many mixed requests over HTTP, gRPC and gRPC streams, with errors mixed in.

Starts `modelhost serve` on a small repository of its own (an FP32 identity model, the same model
with dynamic batching, and a decoupled model that answers a stream request several times), then
sends `--requests` requests from `--concurrency` threads. Each thread cycles through a fixed mix:

    http infer (identity)  35%     grpc infer (batched)  30%     grpc stream (decoupled)  15%
    expected errors        20%:  unknown model, wrong datatype, wrong shape, malformed JSON,
                                  an impossible shape, a bad chunk size

Every answer is checked: outputs must equal the inputs (random values per request), streams must
deliver every response, and each error request must fail with its expected status. It reports
unexpected errors, wrong answers and the worker's resident memory (RSS) over time; the target is
0 unexpected errors, 0 wrong answers and flat memory after warm-up.

    python benchmarks/soak.py                          # 100,000 requests at concurrency 16
    python benchmarks/soak.py --requests 20000         # a shorter run
"""

from __future__ import annotations

import argparse
import json
import queue
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

IDENTITY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
"""

REPEAT = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            data = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            count = int(pb_utils.get_input_tensor_by_name(r, "COUNT").as_numpy()[0])
            sender = r.get_response_sender()
            for i in range(count):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data + i)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def write_repository(root: Path) -> None:
    io = ('input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
          'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n')
    models = {
        "identity": ('backend: "python"\nmax_batch_size: 0\n' + io, IDENTITY),
        "batched": ('backend: "python"\nmax_batch_size: 8\ndynamic_batching { }\n' + io, IDENTITY),
        "repeat": ('backend: "python"\nmax_batch_size: 0\nmodel_transaction_policy { decoupled: true }\n'
                   'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] },\n'
                   '        { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
                   'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n', REPEAT),
    }
    for name, (config, code) in models.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(f'name: "{name}"\n' + config)
        (root / name / "1" / "model.py").write_text(code)


class Worker:
    """One client thread: its own HTTP client, gRPC client and stream."""

    MIX = ["http_infer"] * 7 + ["grpc_infer"] * 6 + ["stream_infer"] * 3 + ["error"] * 4  # 20 slots: 35/30/15/20 %
    ERRORS = ["unknown_model", "wrong_datatype", "wrong_shape", "bad_json", "huge_shape", "bad_chunk"]

    def __init__(self, index: int, server, counts: Counter, lock: threading.Lock) -> None:
        import tritonclient.grpc as grpcclient
        import tritonclient.http as httpclient

        self.index = index
        self.server = server
        self.http = httpclient.InferenceServerClient(server.url, network_timeout=60)
        self.grpc = grpcclient.InferenceServerClient(server.grpc_url)
        self.httpclient, self.grpcclient = httpclient, grpcclient
        self.rng = np.random.default_rng(index)
        self.counts, self.lock = counts, lock
        self.stream_results: queue.SimpleQueue = queue.SimpleQueue()
        self.grpc.start_stream(callback=lambda result, error: self.stream_results.put((result, error)))
        self.n = 0

    def close(self) -> None:
        self.grpc.stop_stream()
        self.grpc.close()
        self.http.close()

    def count(self, what: str, detail: str = "") -> None:
        with self.lock:
            self.counts[what] += 1
            if detail and self.counts[f"detail:{detail}"] < 3:
                self.counts[f"detail:{detail}"] += 1
                print(f"  {what}: {detail}", file=sys.stderr)

    def one(self) -> None:
        kind = self.MIX[(self.n + self.index) % len(self.MIX)]
        self.n += 1
        try:
            getattr(self, kind)()
        except Exception as exc:  # noqa: BLE001 - counted, the soak goes on
            self.count("unexpected_error", f"{kind}: {type(exc).__name__}: {exc}"[:300])

    def _data(self) -> np.ndarray:
        return self.rng.random(int(self.rng.integers(1, 64)), dtype=np.float32)

    def http_infer(self) -> None:
        data = self._data()
        x = self.httpclient.InferInput("INPUT0", list(data.shape), "FP32")
        x.set_data_from_numpy(data, binary_data=bool(self.n % 2))
        out = self.http.infer("identity", [x]).as_numpy("OUTPUT0")
        self.count("ok" if np.array_equal(out, data) else "wrong_answer")

    def grpc_infer(self) -> None:
        data = self._data()[None, :]
        x = self.grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
        x.set_data_from_numpy(data)
        out = self.grpc.infer("batched", [x], client_timeout=60).as_numpy("OUTPUT0")
        self.count("ok" if np.array_equal(out, data) else "wrong_answer")

    def stream_infer(self) -> None:
        data = self._data()
        count = int(self.rng.integers(1, 5))
        x = self.grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
        x.set_data_from_numpy(data)
        c = self.grpcclient.InferInput("COUNT", [1], "INT32")
        c.set_data_from_numpy(np.array([count], np.int32))
        self.grpc.async_stream_infer("repeat", [x, c])
        got = []
        for _ in range(count):
            result, error = self.stream_results.get(timeout=60)
            if error is not None:
                raise error
            got.append(result.as_numpy("OUTPUT0"))
        ok = all(np.array_equal(g, data + i) for i, g in enumerate(got))
        self.count("ok" if ok else "wrong_answer")

    def error(self) -> None:
        from tritonclient.utils import InferenceServerException

        kind = self.ERRORS[(self.n // len(self.MIX)) % len(self.ERRORS)]
        if kind in ("bad_json", "huge_shape", "bad_chunk"):
            status = self._raw(kind)
            self.count("expected_error" if status == 400 else "unexpected_error",
                       "" if status == 400 else f"{kind} answered {status}")
            return
        data = self._data()
        name, datatype, shape = {"unknown_model": ("nope", "FP32", list(data.shape)),
                                 "wrong_datatype": ("identity", "INT32", list(data.shape)),
                                 "wrong_shape": ("identity", "FP32", [1, 1, len(data)])}[kind]
        use_grpc = bool(self.n % 2)
        module = self.grpcclient if use_grpc else self.httpclient
        x = module.InferInput("INPUT0", shape, datatype)
        x.set_data_from_numpy(data.astype(np.int32 if datatype == "INT32" else np.float32).reshape(shape))
        try:
            (self.grpc.infer(name, [x], client_timeout=60) if use_grpc else self.http.infer(name, [x]))
        except InferenceServerException as exc:
            status = str(exc.status())
            expected = ("404", "400", "StatusCode.NOT_FOUND", "StatusCode.INVALID_ARGUMENT",
                        "StatusCode.UNAVAILABLE", "503")
            self.count("expected_error" if status in expected else "unexpected_error",
                       "" if status in expected else f"{kind}: {status} {exc}")
            return
        self.count("unexpected_error", f"{kind} succeeded")

    def _raw(self, kind: str) -> int:
        body = {"bad_json": b'{"inputs": [',
                "huge_shape": json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32",
                                                      "shape": [0, 2**62], "data": []}]}).encode()}.get(kind)
        if body is not None:
            request = (f"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}"
                       "\r\nConnection: close\r\n\r\n").encode() + body
        else:
            request = (b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n"
                       b"Transfer-Encoding: chunked\r\n\r\n0x4\r\nabcd\r\n0\r\n\r\n")
        with socket.create_connection(("127.0.0.1", self.server.http_port), timeout=60) as sock:
            sock.sendall(request)
            answer = b""
            while b"\r\n" not in answer:
                part = sock.recv(4096)
                if not part:
                    break
                answer += part
        return int(answer.split(b" ", 2)[1]) if answer else 0


def worker_pid(server) -> int:
    with open(f"/proc/{server.pid}/task/{server.pid}/children") as f:
        return int(f.read().split()[0])


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--sample-secs", type=float, default=5.0, help="RSS sampling period")
    args = parser.parse_args(argv)

    from host.testing import serve

    with tempfile.TemporaryDirectory(prefix="modelhost-soak-") as tmp:
        repo = Path(tmp) / "models"
        write_repository(repo)
        with serve(repo) as server:
            pid = worker_pid(server)
            counts: Counter = Counter()
            lock = threading.Lock()
            issued = iter(range(args.requests))
            issue_lock = threading.Lock()
            samples: list[tuple[float, int, float]] = []
            done = threading.Event()
            start = time.monotonic()

            def total() -> int:
                return counts["ok"] + counts["expected_error"] + counts["unexpected_error"] + counts["wrong_answer"]

            def sample() -> None:
                while not done.wait(args.sample_secs):
                    samples.append((time.monotonic() - start, total(), rss_mib(pid)))

            def run(index: int) -> None:
                worker = Worker(index, server, counts, lock)
                try:
                    while True:
                        with issue_lock:
                            if next(issued, None) is None:
                                return
                        worker.one()
                finally:
                    worker.close()

            samples.append((0.0, 0, rss_mib(pid)))
            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            threads = [threading.Thread(target=run, args=(i,)) for i in range(args.concurrency)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            done.set()
            elapsed = time.monotonic() - start
            samples.append((elapsed, total(), rss_mib(pid)))
            alive = server.running() and server.is_ready()
            log = server.log_text()

    print(f"\nsoak: {total()} requests in {elapsed:.0f} s ({total() / elapsed:.0f}/s) at concurrency "
          f"{args.concurrency}; server still ready: {alive}")
    for key in ("ok", "expected_error", "unexpected_error", "wrong_answer"):
        print(f"  {key:17} {counts[key]}")
    print(f"  tracebacks in the server log: {log.count('Traceback')}")
    print("\n  time (s)  requests  worker RSS (MiB)")
    for t, n, rss in samples:
        print(f"  {t:8.0f}  {n:8d}  {rss:10.1f}")
    warm = [s for s in samples if s[1] >= 0.1 * args.requests]
    if len(warm) >= 2:
        growth = warm[-1][2] - warm[0][2]
        print(f"\n  RSS after warm-up (10% of requests): {warm[0][2]:.1f} -> {warm[-1][2]:.1f} MiB "
              f"({growth:+.1f} MiB)")
    return 0 if counts["unexpected_error"] == 0 and counts["wrong_answer"] == 0 and alive else 1


if __name__ == "__main__":
    sys.exit(main())
