"""A real `redis-server` on a free loopback port, for tests (no persistence, no config file).

    with RedisServer() as redis:          # skip the test first if `redis_server_binary()` is None
        ... --cache-config redis,host=127.0.0.1 --cache-config redis,port={redis.port}
        redis.stop(); redis.start()       # an outage and a restart on the same port
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time

from host.testing import free_port, wait_until


def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


class RedisServer:
    def __init__(self, port: int | None = None, *extra_args: str) -> None:
        binary = redis_server_binary()
        if binary is None:
            raise FileNotFoundError("redis-server is not installed")
        self.binary = binary
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="modelhost-redis-")
        self.extra_args = list(extra_args)  # more redis-server options, e.g. "--maxmemory", "1mb"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> RedisServer:
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir, "--protected-mode", "yes", *self.extra_args],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_until(self.answers, timeout, message=f"redis-server on port {self.port} did not start")
        return self

    def answers(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"redis-server exited with code {self.process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith((b"+PONG", b"-NOAUTH"))  # up, maybe with a password
        except OSError:
            return False

    def stop(self) -> None:
        """Kill it (SIGKILL: an abrupt outage, as a crash)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self._port_open():
            time.sleep(0.05)

    def _port_open(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def client(self):
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port)

    def cache_args(self, **extra: str) -> list[str]:
        """`modelhost serve` arguments for a redis cache on this server."""
        args = ["--cache-config", "redis,host=127.0.0.1", "--cache-config", f"redis,port={self.port}"]
        for key, value in extra.items():
            args += ["--cache-config", f"redis,{key}={value}"]
        return args

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
