"""The host's side of the response cache: build it from the server options, and per request look
it up and store the response.

    cache = load_response_cache(options.cache_config, options.cache_directory, registry)
    probe = cache.probe(mv, request)      # None: this request does not use the cache
    probe.hit                             # the cached response, or None on a miss
    probe.finish(final_response)          # on a miss: store a successful response, count the miss

A model uses the cache only when the server has one and its config says
`response_cache { enable: true }`. The rules of what is looked up and what is stored live here
and in `host.cache.key.cacheable_request`; the cache implementation only stores buffers. A cache
that fails (raises, or returns an entry that does not decode) never fails a request: the request
goes on uncached and the error is logged, rate-limited.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

from host.cache import codec
from host.cache.base import ResponseCache
from host.cache.key import cacheable_request, request_key
from host.cache.native import load_native_cache
from host.errors import HostError, InvalidArgumentError, NotFoundError
from host.inference import InferenceResponse
from host.plugins.hints import install_hint

if TYPE_CHECKING:
    from host.inference import InferenceRequest
    from host.model import ModelVersion
    from host.plugins.registry import Registry

log = logging.getLogger(__name__)

ERROR_LOG_INTERVAL_S = 30.0


def load_response_cache(config: dict[str, dict[str, str]], directory: Path | None,
                        registry: Registry) -> CacheService | None:
    """The server's cache from `--cache-config` settings (name -> settings), or None.

    A plugin that registered the name builds it; otherwise the native library
    `<directory>/<name>/libtritoncache_<name>.so` is the fallback, as in Triton.
    """
    if not config:
        return None
    if len(config) > 1:
        # Triton's text (its core refuses a second cache the same way)
        raise InvalidArgumentError(
            "found multiple cache configurations, but only a single cache is currently "
            f"supported (--cache-config names {', '.join(sorted(config))})")
    (name, settings), = config.items()
    record = registry.caches.get(name)
    if record is not None:
        cache = record.factory(dict(settings))
        source = f"plugin '{record.plugin}'"
    else:
        try:
            cache = load_native_cache(name, directory, dict(settings))
        except NotFoundError as exc:
            known = ", ".join(sorted(registry.caches)) or "none"
            raise NotFoundError(
                f"unable to find cache '{name}': no installed plugin provides it (installed "
                f"caches: {known}) and {exc}{install_hint(name, registry)}") from None
        source = "native library"
    log.info("response cache '%s' (%s) enabled", name, source)
    return CacheService(name, cache)


class CacheService:
    def __init__(self, name: str, cache: ResponseCache) -> None:
        self.name, self.cache = name, cache
        self._errors = RateLimitedLog(f"response cache '{name}'")
        # Per loaded model version, read once from its config: does it cache, and its outputs.
        self._models: weakref.WeakKeyDictionary[ModelVersion, frozenset[str] | None] = (
            weakref.WeakKeyDictionary())

    def _outputs_if_enabled(self, mv: ModelVersion) -> frozenset[str] | None:
        """The model's output names when it enables the cache, else None."""
        try:
            return self._models[mv]
        except KeyError:
            plan = (frozenset(o.name for o in mv.config.output)
                    if mv.config.response_cache.enable else None)
            self._models[mv] = plan
            return plan

    def close(self) -> None:
        try:
            self.cache.close()
        except Exception:
            log.exception("closing response cache '%s' failed", self.name)

    def probe(self, mv: ModelVersion, request: InferenceRequest) -> Probe | None:
        """Look `request` up if its model and its inputs allow caching; None when they do not."""
        all_outputs = self._outputs_if_enabled(mv)
        if all_outputs is None or not cacheable_request(request):
            return None
        start = time.perf_counter_ns()
        # with namespacing, models of one name in two repositories are two models (ModelKey)
        key = request_key(getattr(mv.name, "qualified", mv.name), mv.version, request)
        hit: InferenceResponse | None = None
        try:
            entry = self.cache.lookup(key)
            if entry is not None:
                outputs = codec.decode_entry(entry)
                # Models produce only the outputs asked for (all of them when none are named), so
                # an entry may lack one asked for now: that is a miss, and the new response
                # replaces the entry.
                have = {t.name for t in outputs}
                if (all(o.name in have for o in request.outputs) if request.outputs
                        else all_outputs <= have):
                    hit = InferenceResponse(outputs=outputs)
        except codec.CorruptEntryError as exc:
            self._errors.error("rejected a malformed cached entry (treated as a miss): %s", exc)
        except BaseException as exc:  # noqa: BLE001 - a cache plugin's failure is never the request's
            self._errors.error("lookup failed (request goes on uncached): %s: %s",
                               type(exc).__name__, exc)
        elapsed = time.perf_counter_ns() - start
        if hit is not None:
            mv.stats.cache_hit(elapsed)
        return Probe(self, mv, key, hit, elapsed)

    def store(self, key: bytes, response: InferenceResponse) -> None:
        try:
            entry = codec.encode_entry(response.outputs)
            if entry is not None:
                self.cache.insert(key, entry)
        except HostError as exc:  # a refusal (e.g. too large for the cache): Triton's line
            self._errors.error("Failed to insert key [%s] into response cache: %s", key.hex(), exc)
        except BaseException as exc:  # noqa: BLE001 - a cache plugin's failure is never the request's
            self._errors.error("Failed to insert key [%s] into response cache (insert failed, "
                               "response not cached): %s: %s", key.hex(), type(exc).__name__, exc)


class Probe:
    """One request's lookup: `hit` is the cached response, or None on a miss, in which case
    `finish` stores the final response (if it succeeded) and records the miss."""

    __slots__ = ("service", "mv", "key", "hit", "lookup_ns")

    def __init__(self, service: CacheService, mv: ModelVersion, key: bytes,
                 hit: InferenceResponse | None, lookup_ns: int) -> None:
        self.service, self.mv, self.key, self.hit, self.lookup_ns = service, mv, key, hit, lookup_ns

    def finish(self, response: InferenceResponse | None) -> None:
        """Called with the final response of a miss, before it is filtered or sent: it has every
        output the model produced, so the entry serves any later selection of outputs."""
        if self.hit is not None:
            return
        start = time.perf_counter_ns()
        if response is not None and response.error is None:
            self.service.store(self.key, response)
        self.mv.stats.cache_miss(self.lookup_ns + time.perf_counter_ns() - start)


class RateLimitedLog:
    """Log the first error at once, then at most one per interval with the count suppressed,
    so a cache that is down does not write a line per request."""

    def __init__(self, what: str, interval: float = ERROR_LOG_INTERVAL_S) -> None:
        self.what, self.interval = what, interval
        self._lock = threading.Lock()
        self._next = 0.0
        self._suppressed = 0

    def error(self, message: str, *args: object) -> None:
        now = time.monotonic()
        with self._lock:
            if now < self._next:
                self._suppressed += 1
                return
            suppressed, self._suppressed = self._suppressed, 0
            self._next = now + self.interval
        more = f" ({suppressed} more since the last report)" if suppressed else ""
        log.error("%s: " + message + more, self.what, *args)
