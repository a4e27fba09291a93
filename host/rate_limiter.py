"""Triton's rate limiter (`--rate-limit=execution_count`): model instances run only while they hold
the resources their `instance_group { rate_limiter { ... } }` names, and take turns by priority.

What Triton's core does (`src/rate_limiter.cc`), and so what this does:

- Resources. An instance needs, for each execute, the `count` of each resource of its group's
  `rate_limiter.resources`. A resource is per device unless `global: true`. How many units exist:
  by default the largest count any one instance needs (per device, or globally); with
  `--rate-limit-resource=<name>:<count>[:<device>]` the counts given there, a resource named by
  none of them counting 0. A count below what one instance needs, or one name used both as a
  global and as a per-device resource, refuses the load, with Triton's texts.
- Turns. An instance that has a batch to run waits ("staged") until the resources are free; the
  staged instances are served strictly in order of their scaled priority, `executions so far *
  max(priority, 1)`, lowest first: an instance with priority 2 gets about half the turns of one
  with priority 1 when they compete; at equal scaled priority the higher priority (lower
  number) goes first, then the instance that waited longer. The first in that order blocks the
  others (head of line).
- The resources are held for the execute only: from before `execute` until it returns. An
  instance whose model still has requests waiting is staged again as it gives its resources
  back, before they go to another (Triton's OnRelease), so that it competes for the next turn
  with its new priority rather than losing it to whoever waited. If no batch comes to claim that
  turn within `UNCLAIMED_S` (another instance of the model took the requests), it goes to the
  next one.
- With `--rate-limit=off` (the default) there is no limiter at all and `rate_limiter` sections
  are ignored, as in Triton.

Unlike Triton's, this limiter does not pick which instance of a model runs a batch: the model's
scheduler picks the instance first, which then waits for its resources.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from typing import Any

from host.errors import InvalidArgumentError

log = logging.getLogger(__name__)

GLOBAL = -2  # the device key of a global resource (Triton's GLOBAL_RESOURCE_KEY)
PER_DEVICE = -1  # --rate-limit-resource without a device: every device (PER_DEVICE_RESOURCE_KEY)
UNCLAIMED_S = 0.05  # a turn granted to an instance staged again at release, left unclaimed

ResourceMap = dict[int, dict[str, int]]  # device key -> resource name -> count


def parse_resources(texts: list[str]) -> ResourceMap:
    """`--rate-limit-resource` values, `<name>:<count>[:<device>]` (checked by the CLI)."""
    explicit: ResourceMap = {}
    for text in texts:
        name, count, *device = text.split(":")
        explicit.setdefault(int(device[0]) if device else PER_DEVICE, {})[name] = int(count)
    return explicit


class _Instance:
    __slots__ = ("needs", "priority", "executions", "staged", "granted", "granted_at", "waiting")

    def __init__(self, needs: ResourceMap, priority: int) -> None:
        self.needs, self.priority = needs, priority
        self.executions = 0
        self.staged = False  # in the queue of turns
        self.granted = False  # holds its resources, its execute may start
        self.granted_at = 0.0
        self.waiting = False  # a thread waits in acquire for it


class RateLimiter:
    def __init__(self, resources: list[str] | None = None) -> None:
        self._explicit = parse_resources(resources or [])
        self._cond = threading.Condition()
        self._instances: dict[Any, _Instance] = {}  # by instance slot
        self._available: ResourceMap = {}
        self._allocated: ResourceMap = {}
        # (scaled priority, priority, arrival, slot): at equal scaled priority the instance of
        # higher priority (lower number) goes first, then the one staged first
        self._staged: list[tuple[int, int, int, Any]] = []
        self._arrival = itertools.count()

    # --- registration (model load and unload) ----------------------------------------------
    def add_instance(self, slot: Any, config: Any, device_id: int) -> None:
        """Register an instance with its group's `rate_limiter` config; refuses, with Triton's
        texts, resources that cannot be had."""
        needs: ResourceMap = {}
        for resource in config.resources:
            key = GLOBAL if getattr(resource, "global") else device_id
            needs.setdefault(key, {})[resource.name] = resource.count
        with self._cond:
            self._instances[slot] = _Instance(needs, max(config.priority, 1))
            try:
                self._available = self._limits()
            except InvalidArgumentError:
                del self._instances[slot]
                self._available = self._limits()
                raise
            self._log_limits()

    def remove_instance(self, slot: Any) -> None:
        with self._cond:
            instance = self._instances.pop(slot, None)
            if instance is not None:
                if instance.granted:
                    self._give_back(instance)
                instance.staged = False
                instance.granted = True  # a waiter (none is expected: unload waits) goes on
                self._available = self._limits()
                self._log_limits()
                self._allocate()
                self._cond.notify_all()

    def _log_limits(self) -> None:
        """Triton's verbose trace of the resource limits after an instance came or went (its
        ParseAndValidateResources, lock held)."""
        if not log.isEnabledFor(logging.DEBUG):
            return
        text = "\nMax Resource Map===>\n"
        for key, resources in self._available.items():
            if resources:
                text += f"\tDevice: {'GLOBAL' if key == GLOBAL else key}\n"
                for name, count in resources.items():
                    text += f"\t\tResource: {name}\t Count: {count}\n"
        log.debug("%s", text)

    def _limits(self) -> ResourceMap:
        """The units of each resource (lock held): the largest need of any instance, or the
        counts given on the command line."""
        needed: ResourceMap = {}
        for instance in self._instances.values():
            for key, resources in instance.needs.items():
                into = needed.setdefault(key, {})
                for name, count in resources.items():
                    into[name] = max(into.get(name, 0), count)
        if self._explicit:
            limits: ResourceMap = {}
            for key, resources in needed.items():
                for name, count in resources.items():
                    if key == GLOBAL:  # any device's count
                        have = max((r.get(name, 0) for r in self._explicit.values()), default=0)
                    else:
                        have = max(self._explicit.get(key, {}).get(name, 0),
                                   self._explicit.get(PER_DEVICE, {}).get(name, 0))
                    if have < count:
                        raise InvalidArgumentError(
                            f'Resource count for "{name}" is limited to {have} which will prevent '
                            "scheduling of one or more model instances, the minimum required "
                            f"count is {count}")
                    limits.setdefault(key, {})[name] = have
            needed = limits
        for name in needed.get(GLOBAL, {}):
            if any(name in resources for key, resources in needed.items() if key != GLOBAL):
                raise InvalidArgumentError(
                    f'Resource "{name}" is present as both global and device-specific resource '
                    "in the model configuration.")
        return needed

    # --- executes ------------------------------------------------------------------------
    def acquire(self, slot: Any) -> None:
        """Wait until `slot`'s instance holds its resources and it is its turn."""
        with self._cond:
            instance = self._instances.get(slot)
            if instance is None:  # not registered (a model loaded before the limiter knew it)
                return
            if not instance.staged and not instance.granted:
                self._stage(slot, instance)
                self._allocate()
            instance.waiting = True
            while not instance.granted:
                self._cond.wait(UNCLAIMED_S)
                self._revoke_unclaimed()
            instance.granted = instance.waiting = False

    def release(self, slot: Any, again: bool = False) -> None:
        """The execute is over: give the resources back, count the execution. `again`: the
        model has requests waiting, so the instance is staged again first."""
        with self._cond:
            instance = self._instances.get(slot)
            if instance is None:
                return
            instance.executions += 1
            self._give_back(instance)
            if again:
                self._stage(slot, instance)
            self._allocate()

    def _stage(self, slot: Any, instance: _Instance) -> None:
        instance.staged = True
        heapq.heappush(self._staged, (instance.executions * instance.priority, instance.priority,
                                      next(self._arrival), slot))

    def _give_back(self, instance: _Instance) -> None:
        for key, resources in instance.needs.items():
            held = self._allocated[key]
            for name, count in resources.items():
                held[name] -= count

    def _revoke_unclaimed(self) -> None:
        """Turns granted to instances staged at release that no batch came to claim: their
        resources go to the next in line (lock held)."""
        now = time.monotonic()
        revoked = False
        for instance in self._instances.values():
            if instance.granted and not instance.waiting and now - instance.granted_at > UNCLAIMED_S:
                instance.granted = False
                self._give_back(instance)
                revoked = True
        if revoked:
            self._allocate()

    def _allocate(self) -> None:
        """Grant the staged instances their resources in order, while the first one fits
        (lock held)."""
        granted = False
        while self._staged:
            slot = self._staged[0][3]
            instance = self._instances.get(slot)
            if instance is None or not instance.staged:  # removed while staged
                heapq.heappop(self._staged)
                continue
            if not self._fits(instance.needs):
                break
            heapq.heappop(self._staged)
            for key, resources in instance.needs.items():
                held = self._allocated.setdefault(key, {})
                for name, count in resources.items():
                    held[name] = held.get(name, 0) + count
            instance.staged = False
            instance.granted = granted = True
            instance.granted_at = time.monotonic()
        if granted:
            self._cond.notify_all()

    def _fits(self, needs: ResourceMap) -> bool:
        for key, resources in needs.items():
            held = self._allocated.get(key, {})
            limits = self._available.get(key, {})
            for name, count in resources.items():
                if held.get(name, 0) + count > limits.get(name, 0):
                    return False
        return True
