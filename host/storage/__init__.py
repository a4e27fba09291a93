"""Model repositories in cloud storage, as Triton's file systems: `s3://` (Amazon S3 and S3-compatible
stores); `gs://` and `as://` are recognized and refused.

A cloud repository is served from a private local mirror (host.storage.mirror): the rest of the
server sees a local folder, which `Repositories.sync` brings up to date before each scan of the
repositories (start-up, each poll, each load and index request). This module is the one place
that tells a cloud path from a local one, and maps each scheme to its implementation.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Sequence

from host.errors import HostError, UnsupportedError

if TYPE_CHECKING:
    from host.storage.mirror import Mirror

# A repository as given: a local folder, or a cloud path (its text, checked; see repository_arg).
Root = Path | str

# scheme -> the module that serves it: parse(path), check(path), mirror(path)
_SCHEMES = {"s3": "host.storage.s3"}
# Triton's other cloud file systems, not provided here (yet): refused with their names.
_UNSUPPORTED = {"gs": "Google Cloud Storage", "as": "Azure Storage"}


def scheme(path: str | Path) -> str | None:
    """The cloud scheme of a repository path ("s3"), or None for a local folder. As in Triton,
    only a path that starts with `s3://`, `gs://` or `as://` is a cloud one."""
    if not isinstance(path, str):
        return None
    for name in (*_SCHEMES, *_UNSUPPORTED):
        if path.startswith(name + "://"):
            return name
    return None


def is_remote(path: str | Path) -> bool:
    return scheme(path) is not None


def _module(path: str) -> ModuleType:
    name = scheme(path)
    if name in _UNSUPPORTED:
        raise UnsupportedError(
            f"model repository '{path}': {name}:// ({_UNSUPPORTED[name]}) repositories are not "
            f"supported by modelhost; s3:// and local folders are")
    return importlib.import_module(_SCHEMES[name or ""])


def parse_root(text: str) -> Root:
    """A repository path as given on the command line: a cloud path is kept as its text once its
    grammar is checked (InvalidArgumentError, UnsupportedError); anything else is a local Path."""
    if not is_remote(text):
        return Path(text)
    _module(text).parse(text)
    return text


def repository_arg(text: str) -> Root:
    """argparse `type` of --model-repository: `parse_root`, its errors as argparse's."""
    try:
        return parse_root(text)
    except HostError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def check(path: str) -> None:
    """Before the server forks: the repository can be reached and exists. Raises HostError with
    the one line the user reads."""
    _module(path).check(path)


class Repositories:
    """The repositories a server serves, in the order given: local folders as they are, each cloud
    repository through its local mirror (created here, empty until `sync`)."""

    def __init__(self, roots: Sequence[Root]) -> None:
        self.given = list(roots)
        self.mirrors: dict[Path, Mirror] = {}
        self.roots: list[Path] = []
        try:
            for root in self.given:
                if is_remote(root):
                    mirror = _module(str(root)).mirror(str(root))
                    self.mirrors[mirror.root] = mirror
                    self.roots.append(mirror.root)
                else:
                    self.roots.append(Path(root))
        except BaseException:
            self.close()
            raise

    @property
    def labels(self) -> dict[Path, str]:
        """How messages name each mirror: the cloud path the user gave."""
        return {root: mirror.url for root, mirror in self.mirrors.items()}

    def sync(self) -> None:
        """Bring every mirror up to date; raises HostError naming the repository that failed."""
        for mirror in self.mirrors.values():
            mirror.sync()

    def close(self) -> None:
        for mirror in self.mirrors.values():
            mirror.close()
        self.mirrors.clear()
