"""`RedisCache`: entries in a Redis server, through a redis-py connection pool.

    --cache-config redis,host=127.0.0.1 --cache-config redis,port=6379

Settings (all strings on the command line; timeouts in milliseconds, as Triton's redis cache):

    host (127.0.0.1), port (6379), username (or user), password, db (0),
    connect_timeout (1000), socket_timeout (1000), pool_size (16), wait_timeout (1000: how long
    a request waits for a free pooled connection), tls_enabled (false), cert, key, cacert,
    cacert_dir, key_prefix ("modelhost:"), ttl (seconds, 0: entries do not expire),
    retry_interval (1000: how often an unreachable Redis is tried again)

As in Triton's redis cache: `host` and `port` must both be given (Triton's text otherwise), the
port reads as C's atoi (a word is port 0), the credentials default to the environment variables
TRITONCACHE_REDIS_USERNAME and TRITONCACHE_REDIS_PASSWORD, and the cache pings Redis when it is
created: a server that cannot reach Redis, or is refused by it (WRONGPASS, NOAUTH), does not
start, with Triton's "Failed to initialize RedisCache: ..." and the client library's reason.

When Redis goes away later, lookups are misses and inserts are dropped, so inference goes on
uncached; the outage is logged once when it starts and once when Redis is back, never per
request. While it lasts no request waits on Redis: one attempt per `retry_interval` decides
whether caching resumes.
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass, fields
from typing import Any

from host.cache.base import Entry
from host.errors import InternalError, InvalidArgumentError
from modelhost_redis_cache.framing import frame, unframe

log = logging.getLogger(__name__)


MISSING_ADDRESS = (  # Triton's text
    "Failed to initialize RedisCache, didn't specify address. Must at a minimum specify 'host' "
    "and 'port' in the configuration - e.g. tritonserver --cache-config redis,host=redis "
    "--cache-config redis,port=6379 --model-repository=/models ...")
INIT_FAILED = "Failed to initialize RedisCache: "
# redis-py strips the error code off these replies; hiredis (Triton's client) keeps it.
_REPLY_CODES = (("invalid username-password pair", "WRONGPASS"),
                ("Authentication required", "NOAUTH"))


def _atoi(text: str) -> int:
    """C's atoi: the number at the start of `text` (after blanks), 0 if there is none."""
    match = re.match(r"\s*([+-]?\d+)", text)
    return int(match.group(1)) if match else 0


@dataclass(frozen=True)
class RedisSettings:
    host: str = "127.0.0.1"
    port: int = 6379
    username: str = ""
    password: str = ""
    db: int = 0
    connect_timeout: int = 1000
    socket_timeout: int = 1000
    pool_size: int = 16
    wait_timeout: int = 1000
    tls_enabled: bool = False
    cert: str = ""
    key: str = ""
    cacert: str = ""
    cacert_dir: str = ""
    key_prefix: str = "modelhost:"
    ttl: int = 0
    retry_interval: int = 1000

    @classmethod
    def parse(cls, config: dict[str, str]) -> RedisSettings:
        config = dict(config)
        if "host" not in config or "port" not in config:
            raise InvalidArgumentError(MISSING_ADDRESS)
        config["port"] = str(_atoi(config["port"]))  # Triton reads it with atoi
        if "user" in config:  # Triton's name for it
            config.setdefault("username", config.pop("user"))
        for name, variable in (("username", "TRITONCACHE_REDIS_USERNAME"),
                               ("password", "TRITONCACHE_REDIS_PASSWORD")):
            if name not in config and os.environ.get(variable):
                config[name] = os.environ[variable]
        types = {f.name: f.type for f in fields(cls)}
        unknown = sorted(set(config) - set(types))
        if unknown:
            raise InvalidArgumentError(
                f"unknown redis cache setting(s) {', '.join(unknown)} (expected: "
                f"{', '.join(types)})")
        values: dict[str, Any] = {}
        for name, text in config.items():
            kind = types[name]
            if kind == "int":
                try:
                    values[name] = int(text)
                except ValueError:
                    raise InvalidArgumentError(
                        f"redis cache setting {name}='{text}' is not an integer") from None
                if values[name] < 0:
                    raise InvalidArgumentError(f"redis cache setting {name} must not be negative")
            elif kind == "bool":
                lowered = text.strip().lower()
                if lowered not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                    raise InvalidArgumentError(
                        f"redis cache setting {name}='{text}' is not true or false")
                values[name] = lowered in ("true", "1", "yes", "on")
            else:
                values[name] = text
        settings = cls(**values)
        if settings.pool_size < 1:
            raise InvalidArgumentError("redis cache setting pool_size must be at least 1")
        return settings


class RedisCache:
    def __init__(self, settings: RedisSettings) -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.settings = s = settings
        # Not reaching Redis is an outage (handled here); an error reply (out of memory, a
        # read-only replica) is the server answering: raised, and logged by the host, rate-limited.
        self._errors = (redis.ConnectionError, redis.TimeoutError, OSError)
        kwargs: dict[str, Any] = dict(
            host=s.host, port=s.port, db=s.db, username=s.username or None,
            password=s.password or None,
            socket_connect_timeout=s.connect_timeout / 1000 or None,
            socket_timeout=s.socket_timeout / 1000 or None,
            retry=Retry(NoBackoff(), 0),  # a failure is handled here, not retried per request
            max_connections=s.pool_size, timeout=s.wait_timeout / 1000 or None)
        if s.tls_enabled:
            kwargs.update(connection_class=redis.SSLConnection, ssl_cert_reqs="required",
                          ssl_certfile=s.cert or None, ssl_keyfile=s.key or None,
                          ssl_ca_certs=s.cacert or None, ssl_ca_path=s.cacert_dir or None)
        self._check_reachable(redis, kwargs)
        self.pool = redis.BlockingConnectionPool(**kwargs)
        self.client = redis.Redis(connection_pool=self.pool)
        self.address = f"{s.host}:{s.port}/{s.db}"
        self._retry_at = 0.0  # while Redis is down: when to try it again
        self._down = False

    def _check_reachable(self, redis: Any, kwargs: dict[str, Any]) -> None:
        """Ping once, as Triton's redis cache does when it is created: a Redis that cannot be
        reached, or refuses these credentials, stops the server (Triton's texts)."""
        s = self.settings
        pool = redis.ConnectionPool(**{k: v for k, v in kwargs.items()
                                       if k not in ("max_connections", "timeout")},
                                    max_connections=1, protocol=2)
        try:
            redis.Redis(connection_pool=pool).ping()
        except redis.AuthenticationError as exc:
            text = str(exc)
            for start, code in _REPLY_CODES:
                if text.startswith(start):
                    text = f"{code} {text}"
            raise InternalError(INIT_FAILED + text) from None
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            cause = exc.__context__ if isinstance(exc.__context__, OSError) else None
            reason = (cause.strerror or str(cause)) if cause is not None else str(exc)
            raise InternalError(
                f"{INIT_FAILED}failed to connect to Redis ({s.host}:{s.port}): {reason}") from None
        except redis.RedisError as exc:
            raise InternalError(INIT_FAILED + str(exc)) from None
        finally:
            pool.disconnect()

    @classmethod
    def from_config(cls, config: dict[str, str]) -> RedisCache:
        return cls(RedisSettings.parse(config))

    def _name(self, key: bytes) -> str:
        return self.settings.key_prefix + key.hex()

    # --- the ResponseCache contract ------------------------------------------------------
    def lookup(self, key: bytes) -> Entry | None:
        if self._down and not self._may_retry():
            return None
        try:
            value = self.client.get(self._name(key))
        except self._errors as exc:
            self._went_down(exc)
            return None
        self._came_back()
        return None if value is None else unframe(value)

    def insert(self, key: bytes, entry: Entry) -> None:
        if self._down and not self._may_retry():
            return
        try:
            self.client.set(self._name(key), frame(entry), ex=self.settings.ttl or None)
        except self._errors as exc:
            self._went_down(exc)
            return
        self._came_back()

    def close(self) -> None:
        self.pool.disconnect()

    # --- outages -------------------------------------------------------------------------
    def _may_retry(self) -> bool:
        now = time.monotonic()
        if now < self._retry_at:
            return False
        self._retry_at = now + self.settings.retry_interval / 1000  # one attempt per interval
        return True

    def _went_down(self, exc: BaseException) -> None:
        self._retry_at = time.monotonic() + self.settings.retry_interval / 1000
        if not self._down:
            self._down = True
            log.error("redis cache at %s is unreachable (%s: %s); inference goes on uncached, "
                      "retrying every %d ms", self.address, type(exc).__name__, exc,
                      self.settings.retry_interval)

    def _came_back(self) -> None:
        if self._down:
            self._down = False
            log.warning("redis cache at %s is reachable again; caching resumed", self.address)
