"""The dynamic batcher's queue, with Triton's queue policy and priority levels.

As Triton's PriorityQueue (core, scheduler_utils.cc):
- `priority_levels` queues, served lowest level number first; a request's `priority` picks its
  level, and 0 or a value above `priority_levels` means `default_priority_level`. Without
  priority levels there is one queue.
- each level has a ModelQueuePolicy (`priority_queue_policy[level]`, else `default_queue_policy`):
  `max_queue_size` (0: no limit) refuses a request with UNAVAILABLE "Exceeds maximum queue size";
  `default_timeout_microseconds` (0: none) is how long a request may wait, and with
  `allow_timeout_override` a request's own `timeout` parameter may shorten it (never lengthen it);
  an expired request is rejected (`timeout_action: REJECT`, UNAVAILABLE "Request timeout
  expired") or moved behind the unexpired requests of its level (`DELAY`).
"""

from __future__ import annotations

import collections
import time
from typing import TYPE_CHECKING, Iterator

from host.errors import InvalidArgumentError, UnavailableError
from host.proto import model_config_pb2

if TYPE_CHECKING:
    from host.inference import InferenceRequest

TIMEOUT_EXPIRED = "Request timeout expired"
_REJECT = model_config_pb2.ModelQueuePolicy.REJECT


def request_label(request: InferenceRequest) -> str:
    """Triton's LogRequest(): the prefix of scheduler messages about one request."""
    return f"[request id: {request.id or '<id_unknown>'}] "


class _Level:
    __slots__ = ("policy", "queue", "delayed")

    def __init__(self, policy: model_config_pb2.ModelQueuePolicy) -> None:
        self.policy = policy
        self.queue: collections.deque[tuple[InferenceRequest, int]] = collections.deque()
        self.delayed: collections.deque[InferenceRequest] = collections.deque()

    def __len__(self) -> int:
        return len(self.queue) + len(self.delayed)


class RequestQueue:
    """Requests waiting for an instance; `rows` counts their batch rows. Not thread-safe: the
    batcher calls it with its condition's lock held."""

    def __init__(self, config: model_config_pb2.ModelDynamicBatching | None = None) -> None:
        config = config or model_config_pb2.ModelDynamicBatching()
        default = config.default_queue_policy
        self.levels = config.priority_levels
        if self.levels:
            if not 1 <= config.default_priority_level <= self.levels:
                raise InvalidArgumentError(
                    f"default_priority_level {config.default_priority_level} must be in the range "
                    f"[1, priority_levels ({self.levels})]")
            for level in config.priority_queue_policy:
                if not 1 <= level <= self.levels:
                    raise InvalidArgumentError(
                        f"priority_queue_policy names level {level}, outside [1, {self.levels}]")
            self.default_level = config.default_priority_level
            self._by_level = {level: _Level(config.priority_queue_policy[level]
                                            if level in config.priority_queue_policy else default)
                              for level in range(1, self.levels + 1)}
        else:
            self.default_level = 0
            self._by_level = {0: _Level(default)}
        self._ordered = [self._by_level[level] for level in sorted(self._by_level)]
        self.has_timeouts = any(lv.policy.default_timeout_microseconds for lv in self._ordered)
        self.rows = 0
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def append(self, request: InferenceRequest) -> None:
        """Queue a request, or raise UNAVAILABLE when its level's queue is full."""
        priority = request.priority
        level = self._by_level[priority if self.levels and 1 <= priority <= self.levels
                               else self.default_level]
        policy = level.policy
        if policy.max_queue_size and len(level) >= policy.max_queue_size:
            raise UnavailableError(request_label(request) + "Exceeds maximum queue size")
        timeout_us = policy.default_timeout_microseconds
        if policy.allow_timeout_override and 0 < request.timeout_us < timeout_us:
            timeout_us = request.timeout_us
        deadline = time.perf_counter_ns() + timeout_us * 1000 if timeout_us else 0
        level.queue.append((request, deadline))
        self.rows += request.batch_size
        self._size += 1

    def __iter__(self) -> Iterator[InferenceRequest]:
        """The queued requests in the order they are served."""
        for level in self._ordered:
            for request, _ in level.queue:
                yield request
            yield from level.delayed

    def front(self) -> InferenceRequest | None:
        for level in self._ordered:
            if level.queue:
                return level.queue[0][0]
            if level.delayed:
                return level.delayed[0]
        return None

    def popleft(self) -> InferenceRequest:
        for level in self._ordered:
            if level.queue:
                request = level.queue.popleft()[0]
                break
            if level.delayed:
                request = level.delayed.popleft()
                break
        else:
            raise IndexError("pop from an empty request queue")
        self.rows -= request.batch_size
        self._size -= 1
        return request

    def expire(self, now_ns: int | None = None) -> list[InferenceRequest]:
        """Apply each level's timeout action to its expired requests; returns the rejected ones
        (the caller fails them with TIMEOUT_EXPIRED)."""
        if not self.has_timeouts:
            return []
        now = time.perf_counter_ns() if now_ns is None else now_ns
        rejected: list[InferenceRequest] = []
        for level in self._ordered:
            if not any(deadline and now > deadline for _, deadline in level.queue):
                continue
            keep: collections.deque[tuple[InferenceRequest, int]] = collections.deque()
            for request, deadline in level.queue:
                if deadline and now > deadline:
                    if level.policy.timeout_action == _REJECT:
                        rejected.append(request)
                        self.rows -= request.batch_size
                        self._size -= 1
                    else:
                        level.delayed.append(request)  # served after the level's unexpired ones
                else:
                    keep.append((request, deadline))
            level.queue = keep
        return rejected

    def next_deadline(self) -> int:
        """The earliest deadline of a queued request (perf_counter ns), or 0 when none."""
        deadlines = [d for level in self._ordered for _, d in level.queue if d]
        return min(deadlines) if deadlines else 0
