"""The `redis` cache plugin against a real redis-server (started here on a free loopback port) and
real `modelhost serve` processes.

redis-server is installed by the project's CI set-up (.ci/run); without it these tests skip.
"""

from __future__ import annotations

import pickle
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from cache_models import write_repository
from host.testing import ServerProcess, ServerStartError, free_port, serve, wait_until

pytest.importorskip("modelhost_redis_cache", reason="the redis cache plugin is not installed")
from modelhost_redis_cache.testing import RedisServer, redis_server_binary  # noqa: E402

pytestmark = [
    pytest.mark.modelhost_only,
    pytest.mark.skipif(redis_server_binary() is None,
                       reason="redis-server is not installed (.ci/run installs it)"),
]

DATA = np.arange(1024, dtype=np.int32).reshape(1, 1024)


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    return write_repository(tmp_path_factory.mktemp("cache_models"), ["cached"])


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def infer(server: ServerProcess, data: np.ndarray) -> np.ndarray:
    c = httpclient.InferenceServerClient(server.url, network_timeout=30.0)
    try:
        inp = httpclient.InferInput("INPUT0", list(data.shape), "INT32")
        inp.set_data_from_numpy(data)
        return c.infer("cached", [inp]).as_numpy("OUTPUT1")
    finally:
        c.close()


def stats(server: ServerProcess) -> tuple[int, int, int]:
    """(cache hits, cache misses, executions) of the `cached` model."""
    c = httpclient.InferenceServerClient(server.url)
    try:
        s = c.get_inference_statistics("cached")["model_stats"][0]
    finally:
        c.close()
    return (s["inference_stats"]["cache_hit"]["count"], s["inference_stats"]["cache_miss"]["count"],
            s["execution_count"])


def test_two_replicas_share_one_redis(repository, redis):
    with serve(repository, *redis.cache_args()) as a, serve(repository, *redis.cache_args()) as b:
        np.testing.assert_array_equal(infer(a, DATA), DATA * 2)
        assert stats(a) == (0, 1, 1)
        np.testing.assert_array_equal(infer(b, DATA), DATA * 2)  # stored by a, served to b
        assert stats(b) == (1, 0, 0)
    assert len(redis.client().keys("modelhost:*")) == 1
    # The cache outlives the replicas: a new process starts with it warm.
    with serve(repository, *redis.cache_args()) as c:
        np.testing.assert_array_equal(infer(c, DATA), DATA * 2)
        assert stats(c) == (1, 0, 0)


def test_redis_killed_and_restarted(repository, redis):
    with serve(repository, *redis.cache_args(retry_interval="200")) as server:
        infer(server, DATA)
        infer(server, DATA)
        assert stats(server) == (1, 1, 1)
        redis.stop()
        for i in range(5):  # inference goes on, uncached
            np.testing.assert_array_equal(infer(server, DATA + i), (DATA + i) * 2)
        hits, misses, executions = stats(server)
        assert (hits, executions) == (1, 6)
        redis.start()  # empty again (no persistence): the next requests store anew

        def cached_again() -> bool:
            infer(server, DATA + 100)
            return stats(server)[0] > hits

        wait_until(cached_again, timeout=30, interval=0.1, message="caching did not resume")
        log = server.log_text()
    # One line when the outage began and one when it ended: never one per request.
    assert log.count("is unreachable") == 1
    assert log.count("caching resumed") == 1


def test_redis_down_at_start(repository, redis):
    # As Triton's redis cache: the server pings Redis when it creates the cache, and does not
    # start without it (an outage after start is served uncached, above).
    redis.stop()
    with pytest.raises(ServerStartError) as info:
        ServerProcess(repository, *redis.cache_args()).start(timeout=60, attempts=1)
    assert (f"Failed to initialize RedisCache: failed to connect to Redis (127.0.0.1:{redis.port}): "
            "Connection refused") in str(info.value)


def test_redis_refusing_writes_is_not_an_outage(repository, redis):
    # An error reply (here: out of memory, nothing to evict) is Redis answering: lookups go on,
    # the failed inserts are logged by the host, rate-limited, and requests are not affected.
    redis.client().config_set("maxmemory", "1")
    redis.client().config_set("maxmemory-policy", "noeviction")
    with serve(repository, *redis.cache_args()) as server:
        for i in range(5):
            np.testing.assert_array_equal(infer(server, DATA + i), (DATA + i) * 2)
        assert stats(server) == (0, 5, 5)
        log = server.log_text()
    assert 1 <= log.count("insert failed") < 5
    assert "is unreachable" not in log


class _WritesAFile:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_poisoned_entries_are_rejected(repository, redis, tmp_path):
    marker = tmp_path / "pickle-was-loaded"
    with serve(repository, *redis.cache_args()) as server:
        infer(server, DATA)
        client = redis.client()
        (name,) = client.keys("modelhost:*")
        good = client.get(name)
        poisons = [
            pickle.dumps(_WritesAFile(str(marker))),  # code, if anyone unpickled it
            b"MHR1" + good[4:-1],                     # framing that does not add up
            # valid framing (8-byte head, two 8-byte lengths), first tensor's datatype code garbled
            good[:28] + b"\xff" + good[29:],
        ]
        for n, poison in enumerate(poisons, start=1):
            client.set(name, poison)
            np.testing.assert_array_equal(infer(server, DATA), DATA * 2)  # computed, not read
            assert stats(server) == (0, 1 + n, 1 + n)
            assert client.get(name) == good  # the miss stored the right entry again
        assert not marker.exists()
        assert server.running()
        log = server.log_text()
    assert "rejected a malformed cached entry" in log or "Redis value" in log


@pytest.mark.parametrize("settings, message", [
    # Triton's texts (qa/L0_response_cache): host and port are required, the port reads as atoi
    (["port=6379"], "Failed to initialize RedisCache, didn't specify address. Must at a minimum "
                    "specify 'host' and 'port' in the configuration"),
    (["host=127.0.0.1", "port=sixty"], "failed to connect to Redis (127.0.0.1:0): Connection refused"),
    (["host=127.0.0.1", "port=1", "colour=blue"], "unknown redis cache setting"),
])
def test_bad_redis_settings_fail_at_start(repository, settings, message):
    args = [a for s in settings for a in ("--cache-config", f"redis,{s}")]
    with pytest.raises(ServerStartError) as info:
        ServerProcess(repository, *args).start(timeout=60, attempts=1)
    assert message in str(info.value)


def test_password_and_db_settings(repository):
    with RedisServer(None, "--requirepass", "s3cret") as redis:
        with serve(repository, *redis.cache_args(password="s3cret", db="3")) as server:
            infer(server, DATA)
            infer(server, DATA)
            assert stats(server) == (1, 1, 1)
        import redis as redis_py

        client = redis_py.Redis(host="127.0.0.1", port=redis.port, password="s3cret", db=3)
        assert len(client.keys("modelhost:*")) == 1
        # Refused credentials stop the server at start, with Redis's reply (Triton's behaviour)
        for extra, env, reply in (({"password": "wrong"}, {}, "WRONGPASS invalid username-password pair"),
                                  ({}, {}, "NOAUTH Authentication required."),
                                  ({}, {"TRITONCACHE_REDIS_PASSWORD": "wrong"}, "WRONGPASS")):
            with pytest.raises(ServerStartError) as info:
                ServerProcess(repository, *redis.cache_args(**extra), env=env).start(
                    timeout=60, attempts=1)
            assert f"Failed to initialize RedisCache: {reply}" in str(info.value)
        # Triton's environment variables give the credentials the settings leave out
        with serve(repository, *redis.cache_args(db="3"),
                   env={"TRITONCACHE_REDIS_USERNAME": "default",
                        "TRITONCACHE_REDIS_PASSWORD": "s3cret"}) as server:
            infer(server, DATA)
            assert stats(server) == (1, 0, 0)  # the entry stored above


def _certificates(directory: Path) -> dict[str, str]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, made with openssl."""
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True, timeout=60)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "1",
        "-subj", "/CN=modelhost-test-ca")
    (directory / "san").write_text("subjectAltName=IP:127.0.0.1\n")
    for name in ("server", "client"):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", f"/CN={name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.crt", "-days", "1", "-extfile", "san")
    return {n: str(directory / n) for n in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")}


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_tls_with_client_certificate(repository, tmp_path):
    certs = _certificates(tmp_path)
    tls_port = free_port()
    with RedisServer(None, "--tls-port", str(tls_port), "--tls-cert-file", certs["server.crt"],
                     "--tls-key-file", certs["server.key"], "--tls-ca-cert-file", certs["ca.crt"],
                     "--tls-auth-clients", "yes") as redis:
        args = ["--cache-config", "redis,host=127.0.0.1", "--cache-config", f"redis,port={tls_port}",
                "--cache-config", "redis,tls_enabled=true", "--cache-config", f"redis,cacert={certs['ca.crt']}",
                "--cache-config", f"redis,cert={certs['client.crt']}",
                "--cache-config", f"redis,key={certs['client.key']}"]
        with serve(repository, *args) as server:
            infer(server, DATA)
            np.testing.assert_array_equal(infer(server, DATA), DATA * 2)
            assert stats(server) == (1, 1, 1)
            assert "is unreachable" not in server.log_text()
        assert len(redis.client().keys("modelhost:*")) == 1  # the plain port sees what TLS stored
