"""Typed records of what plugins registered, with duplicate names rejected."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from host.backend import BackendFactory
from host.errors import AlreadyExistsError


@dataclass(frozen=True)
class BackendRecord:
    name: str
    factory: BackendFactory
    plugin: str  # the plugin (entry point) that registered it


@dataclass(frozen=True)
class CacheRecord:
    name: str
    factory: Callable[[dict[str, str]], Any]
    plugin: str


@dataclass(frozen=True)
class LogitsProcessorRecord:
    name: str
    factory: Callable[..., Any]  # the processor itself
    plugin: str


@dataclass
class Registry:
    """Filled by the registration hooks; `current_plugin` is set by the manager around each call."""

    backends: dict[str, BackendRecord] = field(default_factory=dict)
    caches: dict[str, CacheRecord] = field(default_factory=dict)
    logits_processors: dict[str, LogitsProcessorRecord] = field(default_factory=dict)
    current_plugin: str = "?"

    def add_backend(self, name: str, factory: BackendFactory) -> None:
        self._add(self.backends, BackendRecord(name, factory, self.current_plugin), "backend")

    def add_cache(self, name: str, factory: Callable[[dict[str, str]], Any]) -> None:
        self._add(self.caches, CacheRecord(name, factory, self.current_plugin), "cache")

    def add_logits_processor(self, name: str, processor: Callable[..., Any]) -> None:
        self._add(self.logits_processors, LogitsProcessorRecord(name, processor, self.current_plugin),
                  "logits processor")

    @staticmethod
    def _add(table: dict, record: Any, kind: str) -> None:
        old = table.get(record.name)
        if old is not None:
            raise AlreadyExistsError(
                f"{kind} '{record.name}' is registered by two plugins: "
                f"'{old.plugin}' and '{record.plugin}'")
        table[record.name] = record
