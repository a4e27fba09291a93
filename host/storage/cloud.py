"""What the cloud stores (host.storage.s3, .gcs, .azure) share: Triton's credential file, the
bounded waits, the lazy import of their client library, and the start-up probe with its messages.

A store module gives the dispatcher (host.storage) `parse(path)`, a `Store` class (a `CloudStore`)
and `MOUNT_DIRECTORY_VARIABLE`; everything else about a scheme stays in its module.
"""

from __future__ import annotations

import importlib
import json
import os
import threading
from abc import ABC, abstractmethod
from datetime import datetime
from types import ModuleType
from typing import Any, BinaryIO, Iterable, Mapping

from host.errors import InvalidArgumentError, NotFoundError, UnsupportedError
from host.storage.mirror import RemoteObject

CREDENTIAL_FILE_VARIABLE = "TRITON_CLOUD_CREDENTIAL_PATH"
# Bounded waits: a store that does not answer fails a start-up or a load, it never hangs one.
CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 60
MAX_ATTEMPTS = 3
CHUNK = 1 << 20  # downloads are streamed in pieces of this size


def path_parts(rest: str) -> list[str]:
    """The parts of a path without its leading, trailing or repeated slashes."""
    return [p for p in rest.split("/") if p]


def mtime_ns(when: datetime) -> int:
    return int(when.timestamp()) * 10**9 + when.microsecond * 1000


def first_line(exc: BaseException) -> str:
    """The first line of an exception's text (the client libraries' texts may run over several)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def require(module: str, scheme: str, package: str, extra: str) -> ModuleType:
    """Import a store's client library, or say which extra installs it (UnsupportedError)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UnsupportedError(f'{scheme}:// model repositories need {package}: '
                               f'pip install "modelhost[{extra}]"') from None


def credential_entry(section: str, path: str, environ: Mapping[str, str] | None = None) -> object | None:
    """With TRITON_CLOUD_CREDENTIAL_PATH set, the entry of its `section` ("s3", "gs", "as") whose
    name is the longest prefix of `path` (Triton's rule; "" matches every path); None without it."""
    environ = os.environ if environ is None else environ
    file = environ.get(CREDENTIAL_FILE_VARIABLE)
    if not file:
        return None
    try:
        with open(file, encoding="utf-8") as f:
            entries = json.load(f).get(section, {})
        names = [name for name in entries if isinstance(name, str) and path.startswith(name)]
    except (OSError, ValueError, AttributeError, TypeError) as exc:
        raise InvalidArgumentError(f"cannot read the credential file {CREDENTIAL_FILE_VARIABLE}="
                                   f"'{file}': {exc}") from None
    if not names:  # Triton's text
        raise NotFoundError(f"Cannot match credential for path {path} in {CREDENTIAL_FILE_VARIABLE}")
    return entries[max(names, key=len)]


def credential_fields(section: str, path: str, entry: object) -> dict[str, str]:
    """An object entry's non-empty string fields (the s3 and as entries)."""
    if not isinstance(entry, dict):
        raise InvalidArgumentError(f"{CREDENTIAL_FILE_VARIABLE}: the {section} entry for {path} is not an object")
    return {k: v for k, v in entry.items() if isinstance(v, str) and v}


class CloudStore(ABC):
    """The objects under one repository's path in a bucket (or container): host.storage.mirror.Store,
    plus the check the server makes before it starts."""

    kind = "bucket"  # what the store calls the top-level namespace, for messages

    def __init__(self, url: str, container: str, prefix: str) -> None:
        self.url = url  # as the user gave it: what messages show
        self.container = container
        self.prefix = prefix  # without leading or trailing '/'; "" for the container's root
        self._client: Any = None
        self._client_lock = threading.Lock()

    def client(self) -> Any:
        """The store's client library object, made on first use (the library is imported then)."""
        with self._client_lock:
            if self._client is None:
                self._client = self.make_client()
            return self._client

    @abstractmethod
    def make_client(self) -> Any:
        """Import the client library and make the client; raises HostError."""

    @property
    def key_prefix(self) -> str:
        return self.prefix + "/" if self.prefix else ""

    @property
    def failure(self) -> str:
        """The start of every message about a failed request."""
        return f"failed to read model repository '{self.url}'"

    def missing_container(self) -> NotFoundError:
        return NotFoundError(f"{self.failure}: {self.kind} '{self.container}' does not exist")

    @abstractmethod
    def list(self) -> Iterable[RemoteObject]:
        """Every object under the repository's path (keys relative to it); raises HostError."""

    @abstractmethod
    def download(self, key: str, into: BinaryIO) -> None:
        """Stream the object at `key` (relative) into `into`; raises HostError."""

    @abstractmethod
    def any_object(self) -> bool:
        """Whether any object's name starts with `key_prefix`; raises HostError (a missing
        container: `missing_container()`)."""

    def probe(self) -> None:
        """The container exists, and so does the repository's path in it (NotFoundError). The
        root of an empty container is an empty repository."""
        if not self.any_object() and self.prefix:
            raise NotFoundError(f"model repository '{self.url}' does not exist: no object under "
                                f"'{self.key_prefix}' in {self.kind} '{self.container}'")
