"""A ready-made client side of the callbacks: a thread-safe request queue and response collector.

    q = RequestQueue()
    manager = q.start(model, scheduler_config=..., kv_cache_config=...)
    q.submit(GenerationRequest(1, [5, 6, 7], max_new_tokens=16))
    result = q.result(1)            # waits for the final response
    manager.shutdown()

`on_response(request_id, tensors, final, error)` (optional) sees every response as it is sent,
on the worker thread; `stats` keeps every statistics JSON, parsed (with `keep_stats` False when
`start` runs, the manager makes none).
"""

from __future__ import annotations

import collections
import json
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from host.inflight.manager import BatchManager
from host.inflight.request import GenerationRequest


@dataclass
class Result:
    request_id: int
    responses: list[dict[str, np.ndarray]] = field(default_factory=list)
    error: str = ""
    done: bool = False

    @property
    def tokens(self) -> list[int]:
        """Every token of output_ids across the responses, in order."""
        out: list[int] = []
        for r in self.responses:
            if "output_ids" in r:
                out.extend(int(t) for t in r["output_ids"].reshape(-1))
        return out


class RequestQueue:
    def __init__(self, on_response: Callable[[int, dict, bool, str], None] | None = None,
                 keep_stats: bool = True) -> None:
        self._mutex = threading.Lock()  # the condition's lock, taken directly where nobody waits
        self._lock = threading.Condition(self._mutex)
        self._pending: collections.deque[GenerationRequest] = collections.deque()
        self._stops: set[int] = set()
        self.results: dict[int, Result] = {}
        self.finished: list[Result] = []  # in the order their final responses came
        self.stats: list[dict[str, Any]] = []
        self.keep_stats = keep_stats
        self.on_response = on_response
        self.manager: BatchManager | None = None

    def start(self, model: Any, **options: Any) -> BatchManager:
        # without keep_stats nobody reads the statistics: the manager is not asked to make them
        self.manager = BatchManager(model, get_new_requests=self.get_new_requests,
                                    send_response=self.send_response,
                                    poll_stop_signal=self.poll_stop_signal,
                                    return_stats=self.return_stats if self.keep_stats else None,
                                    **options)
        return self.manager

    # --- the client's side -----------------------------------------------------------------------
    def submit(self, *requests: GenerationRequest) -> None:
        with self._lock:
            for r in requests:
                self.results[r.request_id] = Result(r.request_id)
                self._pending.append(r)
        if self.manager is not None:
            self.manager.notify()

    def stop(self, request_id: int) -> None:
        with self._lock:
            self._stops.add(request_id)

    def result(self, request_id: int, timeout: float | None = 120.0) -> Result:
        with self._lock:
            if not self._lock.wait_for(lambda: self.results[request_id].done, timeout):
                raise TimeoutError(f"request {request_id} not finished after {timeout} s")
            return self.results[request_id]

    def wait_all(self, timeout: float | None = 600.0) -> list[Result]:
        with self._lock:
            if not self._lock.wait_for(lambda: all(r.done for r in self.results.values()), timeout):
                raise TimeoutError("requests not finished")
            return list(self.results.values())

    # --- the callbacks ---------------------------------------------------------------------------
    # The manager calls these every iteration: an empty queue or stop set is seen without the
    # lock (one submitted meanwhile is picked up at the next iteration, as it would be anyway).
    def get_new_requests(self, n: int) -> list[GenerationRequest]:
        if not self._pending:
            return []
        with self._mutex:
            count = len(self._pending) if n < 0 else min(n, len(self._pending))
            return [self._pending.popleft() for _ in range(count)]

    def send_response(self, request_id: int, tensors: dict, final: bool, error: str) -> None:
        if self.on_response is not None:
            self.on_response(request_id, tensors, final, error)
        with self._mutex:
            result = self.results.get(request_id)
            if result is None:
                result = self.results[request_id] = Result(request_id)
            if tensors:
                result.responses.append(tensors)
            if final:
                result.error, result.done = error, True
                self.finished.append(result)
                self._lock.notify_all()

    def poll_stop_signal(self) -> set[int]:
        if not self._stops:
            return set()
        with self._mutex:
            stops, self._stops = self._stops, set()
            return stops

    def return_stats(self, text: str) -> None:
        if self.keep_stats:
            self.stats.append(json.loads(text))
