"""A small lab for the scale-out test: modelhost replicas, each in its own network namespace with
its own address, behind a real HAProxy, sharing one real redis-server.

    root namespace                               namespace <lab>-r<i> (one per replica)
    HAProxy 127.0.0.1:<http>, :<grpc>  ──┐
    redis-server <net>.1:<port>         ─┤ bridge <lab>br, <net>.1/24
                                         └── veth ──── eth0 <net>.1<i>: modelhost serve :8000 :8001 :8002

Each replica also has a private /dev/shm (its own mount namespace), as a process on another
host would: a client's shared-memory region is not there. The addresses are taken from
198.18.0.0/15, the range reserved for network benchmarks (RFC 2544), and exist only inside the
namespaces and on the bridge this lab creates; everything is removed by `close()`.

Needs root, iproute2 (`ip netns`), haproxy and redis-server; `Lab.unavailable()` says what is
missing.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

from host.testing import free_port, wait_until

HTTP, GRPC, METRICS = 8000, 8001, 8002
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


class Replica:
    def __init__(self, lab: Lab, index: int) -> None:
        self.lab, self.index = lab, index
        self.name = f"r{index}"
        self.netns = f"{lab.tag}-r{index}"
        self.address = f"{lab.net}.{11 + index}"
        self.process: subprocess.Popen | None = None
        self.log_path = lab.workdir / f"{self.name}.log"

    @property
    def http_url(self) -> str:
        return f"{self.address}:{HTTP}"

    def command(self) -> list[str]:
        serve = [sys.executable, "-m", "host", "serve", "--model-repository", str(self.lab.repository),
                 "--http-port", str(HTTP), "--grpc-port", str(GRPC), "--metrics-port", str(METRICS),
                 "--allow-client-shm=true", "--exit-timeout-secs", "10",
                 # behind the balancer: its pooled idle connections do not hold a stop (Triton's
                 # default would serve them until the exit timeout runs out, then exit 1)
                 "--exit-wait-idle-connections=false",
                 "--cache-config", f"redis,host={self.lab.net}.1",
                 "--cache-config", f"redis,port={self.lab.redis_port}"]
        # its own network namespace, and its own /dev/shm in its own mount namespace
        return ["ip", "netns", "exec", self.netns, "unshare", "--mount", "--propagation", "private",
                "sh", "-c", 'mount -t tmpfs -o size=16m tmpfs /dev/shm && exec "$@"', "sh", *serve]

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MODELHOST_")}
        env.update(PYTHONUNBUFFERED="1", PYTHONSAFEPATH="1",
                   PYTHONPATH=os.pathsep.join(filter(None, [self.lab.package_parent,
                                                            env.get("PYTHONPATH")])))
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True)
        wait_until(self.ready, 90, 0.1, f"replica {self.name} did not become ready:\n{self.log()}")

    def ready(self) -> bool:
        assert self.process is not None and self.process.poll() is None, self.log()
        try:
            with _NO_PROXY.open(f"http://{self.http_url}/v2/health/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL, the whole process group: the server dies mid-request."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)

    def stop(self) -> int | None:
        """SIGTERM: in-flight requests finish, then it exits."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            return self.process.wait(60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)

    def metric(self, name: str, model: str) -> float:
        with _NO_PROXY.open(f"http://{self.address}:{METRICS}/metrics", timeout=5) as r:
            text = r.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name + "{") and f'model="{model}"' in line)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""


class Lab:
    def __init__(self, workdir: Path, repository: Path, replicas: int = 3) -> None:
        self.workdir, self.repository = workdir, repository
        self.tag = f"mh{random.randrange(16**4):04x}"
        self.net = f"198.18.{random.randrange(1, 250)}"
        self.bridge = f"{self.tag}br"
        self.package_parent = str(Path(__import__("host").__file__).resolve().parent.parent)
        self.replicas = [Replica(self, i) for i in range(replicas)]
        self.redis_port = free_port()
        self.http_port, self.grpc_port = free_port(), free_port()
        self.haproxy_socket = workdir / "haproxy.sock"
        self._redis: subprocess.Popen | None = None
        self._haproxy: subprocess.Popen | None = None
        self._made: list[tuple[str, ...]] = []  # `ip` commands that undo what was made

    @staticmethod
    def unavailable() -> str:
        """Why the lab cannot run here, or ''."""
        if os.geteuid() != 0:
            return "needs root (network namespaces)"
        for tool in ("ip", "unshare", "haproxy", "redis-server"):
            if shutil.which(tool) is None:
                return f"{tool} is not installed (scripts/install_system_deps.sh installs it)"
        probe = f"mhprobe{os.getpid() % 100000}"
        made = _ip("netns", "add", probe, check=False)
        if made.returncode != 0:
            return f"network namespaces are not permitted here: {made.stderr.strip()}"
        _ip("netns", "del", probe, check=False)
        return ""

    # --- set-up ----------------------------------------------------------------------------------
    def open(self) -> Lab:
        _ip("link", "add", self.bridge, "type", "bridge")
        self._made.append(("link", "del", self.bridge))
        _ip("addr", "add", f"{self.net}.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for r in self.replicas:
            _ip("netns", "add", r.netns)
            self._made.append(("netns", "del", r.netns))
            host_end = f"{self.tag}v{r.index}"
            _ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", r.netns)
            self._made.append(("link", "del", host_end))  # both ends go
            _ip("link", "set", host_end, "master", self.bridge, "up")
            for args in (("addr", "add", f"{r.address}/24", "dev", "eth0"),
                         ("link", "set", "eth0", "up"), ("link", "set", "lo", "up")):
                _ip("netns", "exec", r.netns, "ip", *args)
        self._start_redis()
        for r in self.replicas:
            r.start()
        self._start_haproxy()
        return self

    def _start_redis(self) -> None:
        self._redis = subprocess.Popen(
            ["redis-server", "--bind", f"{self.net}.1", "--port", str(self.redis_port),
             "--save", "", "--appendonly", "no", "--protected-mode", "no"],
            stdout=open(self.workdir / "redis.log", "wb"), stderr=subprocess.STDOUT)

        def up() -> bool:
            address = (f"{self.net}.1", self.redis_port)
            with contextlib.suppress(OSError), socket.create_connection(address, 1):
                return True
            return False

        wait_until(up, 20, 0.05, "redis-server did not start")

    def haproxy_config(self) -> str:
        servers_http = "\n".join(f"    server {r.name} {r.address}:{HTTP} check" for r in self.replicas)
        servers_grpc = "\n".join(
            f"    server {r.name} {r.address}:{GRPC} proto h2 check port {HTTP} check-proto h1"
            for r in self.replicas)
        return f"""
global
    maxconn 2000
    stats socket {self.haproxy_socket} mode 600 level admin
defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    timeout check 1s
    # a refused connection (a replica gone) or a connection closed before any response (a replica
    # killed mid-request) is retried on another replica
    retries 3
    option redispatch 1
    retry-on conn-failure empty-response
    option httpchk GET /v2/health/ready
    http-check expect status 200
    default-server inter 200ms fall 1 rise 2
frontend http
    bind 127.0.0.1:{self.http_port}
    default_backend be_http
frontend grpc
    bind 127.0.0.1:{self.grpc_port} proto h2
    default_backend be_grpc
backend be_http
    balance roundrobin
    http-response set-header X-Served-By %[srv_name]
{servers_http}
backend be_grpc
    balance roundrobin
    http-response set-header X-Served-By %[srv_name]
{servers_grpc}
"""

    def _start_haproxy(self) -> None:
        config = self.workdir / "haproxy.cfg"
        config.write_text(self.haproxy_config())
        check = subprocess.run(["haproxy", "-c", "-f", str(config)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        self._haproxy = subprocess.Popen(["haproxy", "-db", "-f", str(config)],
                                         stdout=open(self.workdir / "haproxy.log", "wb"),
                                         stderr=subprocess.STDOUT)
        wait_until(lambda: all(self.server_up(r) for r in self.replicas), 30, 0.1,
                   "HAProxy did not see every replica up")

    # --- HAProxy's runtime API ---------------------------------------------------------------------
    def haproxy(self, command: str) -> str:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(str(self.haproxy_socket))
            sock.sendall(command.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def server_up(self, replica: Replica) -> bool:
        """HAProxy checks the replica as UP in both backends."""
        with contextlib.suppress(OSError):
            lines = self.haproxy("show stat").splitlines()
            states = {(f[0], f[1]): f[17] for f in (line.split(",") for line in lines[1:]) if len(f) > 17}
            return all(states.get((be, replica.name), "").startswith("UP") for be in ("be_http", "be_grpc"))
        return False

    def set_state(self, replica: Replica, state: str) -> None:
        for backend in ("be_http", "be_grpc"):
            self.haproxy(f"set server {backend}/{replica.name} state {state}")

    def current_sessions(self, replica: Replica) -> int:
        lines = self.haproxy("show stat").splitlines()
        return sum(int(f[4] or 0) for f in (line.split(",") for line in lines[1:])
                   if len(f) > 4 and f[1] == replica.name)

    # --- tear-down -------------------------------------------------------------------------------
    def close(self) -> None:
        for r in self.replicas:
            with contextlib.suppress(Exception):
                r.kill()
        for proc in (self._haproxy, self._redis):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
                if proc.poll() is None:
                    proc.kill()
        for undo in reversed(self._made):
            _ip(*undo, check=False)  # deleting a namespace removes its veth pair too
