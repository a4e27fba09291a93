"""A local mirror of a cloud repository: a private folder kept equal to the objects under the
repository's path, so that the server reads (and fingerprints, to notice changes) a local folder.

Triton localizes a cloud model into a temporary folder at each load; a mirror does the same once,
and then only fetches what changed. A sync lists the objects, downloads those whose ETag or size
changed (streamed to a staging file, then renamed into place), removes local files whose objects
are gone, and gives each file its object's modification time, so that the repository's
fingerprints (host.repository) see every change.

The bucket is not trusted: a key that would name anything outside the mirror (`..`, an empty or
absolute part, a backslash, a NUL) is skipped with a warning, and no symlink is ever followed or
created.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import tempfile
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterable, Protocol

log = logging.getLogger("host.storage")

DOWNLOAD_THREADS = 8
_KEEP = "__pycache__"  # written next to a python model's files by the interpreter: left alone


@dataclass(frozen=True)
class RemoteObject:
    key: str  # relative to the repository's path, '/'-separated; a trailing '/' is a folder marker
    size: int
    etag: str
    mtime_ns: int


class Store(Protocol):
    """One cloud repository's objects (host.storage.cloud.CloudStore)."""

    url: str  # the repository's path as the user gave it, for messages

    def list(self) -> Iterable[RemoteObject]:
        """Every object under the repository's path; raises HostError."""

    def download(self, key: str, into: BinaryIO) -> None:
        """Stream the object at `key` (relative) into `into`; raises HostError."""


Parts = tuple[str, ...]


def safe_parts(key: str) -> Parts | None:
    """The path parts of a relative key, or None when it could name anything outside the mirror."""
    body = key[:-1] if key.endswith("/") else key
    parts = tuple(body.split("/"))
    for part in parts:
        if part in ("", ".", "..") or "\\" in part or "\0" in part:
            return None
    return parts


class Mirror:
    def __init__(self, store: Store, mount_directory: str | None = None) -> None:
        self.store = store
        self.url = store.url
        # mkdtemp: mode 0700, a fresh name. `repository` is what the server reads; `partial`
        # holds downloads until they are complete (same file system: renamed into place).
        self._base = Path(tempfile.mkdtemp(prefix="modelhost-repository-", dir=mount_directory))
        self._finalizer = weakref.finalize(self, shutil.rmtree, str(self._base), True)
        self.root = self._base / "repository"
        self._partial = self._base / "partial"
        self.root.mkdir(mode=0o700)
        self._partial.mkdir(mode=0o700)
        self._have: dict[Parts, tuple[str, int, int]] = {}  # parts -> (etag, size, mtime_ns)
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def close(self) -> None:
        self._finalizer()

    # --- sync ----------------------------------------------------------------------------------
    def sync(self) -> None:
        with self._lock:
            files, folders = self._wanted(self.store.list())
            self._remove_stale(self.root, (), files, folders)
            for parts in sorted(folders):
                self._make_folder(parts)
            todo = [(parts, obj) for parts, obj in files.items() if not self._current(parts, obj)]
            if todo:
                with ThreadPoolExecutor(min(DOWNLOAD_THREADS, len(todo)),
                                        thread_name_prefix="repository-download") as pool:
                    list(pool.map(lambda item: self._download(*item), todo))

    def _wanted(self, objects: Iterable[RemoteObject]) -> tuple[dict[Parts, RemoteObject], set[Parts]]:
        """The files and folders the mirror should hold."""
        files: dict[Parts, RemoteObject] = {}
        folders: set[Parts] = set()
        for obj in objects:
            parts = safe_parts(obj.key)
            if parts is None:
                self._warn(obj.key, "it names a path outside the repository")
                continue
            folders.update(parts[:i] for i in range(1, len(parts)))
            if obj.key.endswith("/"):
                folders.add(parts)
            else:
                files[parts] = obj
        for parts in [p for p in files if p in folders]:  # `a` and `a/b` both exist: keep the folder
            self._warn(files.pop(parts).key, "a folder of the same name exists")
        return files, folders

    def _warn(self, key: str, why: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("model repository '%s': object '%s' skipped: %s", self.url, key, why)

    def _remove_stale(self, folder: Path, parts: Parts, files: dict[Parts, RemoteObject],
                      folders: set[Parts]) -> None:
        """Remove what has no object any more (and anything that is not a plain file or folder)."""
        with os.scandir(folder) as entries:
            for entry in list(entries):
                here = (*parts, entry.name)
                mode = entry.stat(follow_symlinks=False).st_mode
                if stat.S_ISDIR(mode):
                    if here in folders:
                        self._remove_stale(Path(entry.path), here, files, folders)
                    elif not (entry.name == _KEEP and parts in folders):
                        shutil.rmtree(entry.path)
                        self._forget(here)
                elif not stat.S_ISREG(mode) or here not in files:
                    os.unlink(entry.path)
                    self._have.pop(here, None)

    def _forget(self, parts: Parts) -> None:
        for known in [k for k in self._have if k[:len(parts)] == parts]:
            del self._have[known]

    def _make_folder(self, parts: Parts) -> None:
        path = self.root
        for part in parts:
            path = path / part
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                if not stat.S_ISDIR(os.lstat(path).st_mode):  # removed as stale before: cannot be
                    raise
        # the mirror's own folders hold nothing but what sync wrote: no symlink can be on the way

    def _current(self, parts: Parts, obj: RemoteObject) -> bool:
        have = self._have.get(parts)
        if have is None or have[:2] != (obj.etag, obj.size):
            return False
        try:
            st = os.lstat(self.root.joinpath(*parts))
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode) and st.st_size == obj.size and st.st_mtime_ns == have[2]

    def _download(self, parts: Parts, obj: RemoteObject) -> None:
        target = self.root.joinpath(*parts)
        if os.path.commonpath([self.root, target]) != str(self.root):  # safe_parts already said so
            self._warn(obj.key, "it names a path outside the repository")
            return
        # A changed object always changes the file's fingerprint (size, mtime), even when it was
        # written again within the same second (S3 keeps modification times to the second).
        previous = self._have.get(parts)
        mtime = obj.mtime_ns if previous is None else max(obj.mtime_ns, previous[2] + 1000)
        fd, partial = tempfile.mkstemp(dir=self._partial)
        try:
            with os.fdopen(fd, "wb") as out:
                self.store.download(obj.key, out)
            os.utime(partial, ns=(mtime, mtime))
            os.replace(partial, target)  # a rename: replaces a link itself, never its target
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(partial)
            raise
        self._have[parts] = (obj.etag, os.lstat(target).st_size, mtime)
        log.debug("model repository '%s': fetched '%s'", self.url, obj.key)

