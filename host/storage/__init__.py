"""Model repositories in cloud storage, as Triton's file systems: `s3://` (Amazon S3 and S3-compatible
stores), `gs://` (Google Cloud Storage) and `as://` (Azure Blob Storage).

A cloud repository is served from a private local mirror (host.storage.mirror): the rest of the
server sees a local folder, which `Repositories.sync` brings up to date before each scan of the
repositories (start-up, each poll, each load and index request). This module is the one place
that tells a cloud path from a local one, and maps each scheme to its implementation.
"""

from __future__ import annotations

import argparse
import importlib
import os
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Sequence

from host.errors import HostError, InvalidArgumentError

if TYPE_CHECKING:
    from host.storage.mirror import Mirror

# A repository as given: a local folder, or a cloud path (its text, checked; see repository_arg).
Root = Path | str

# scheme -> the module that serves it (host.storage.cloud): parse(path), Store, MOUNT_DIRECTORY_VARIABLE
_SCHEMES = {"s3": "host.storage.s3", "gs": "host.storage.gcs", "as": "host.storage.azure"}


def scheme(path: str | Path) -> str | None:
    """The cloud scheme of a repository path ("s3", "gs", "as"), or None for a local folder. As in
    Triton, only a path that starts with `s3://`, `gs://` or `as://` is a cloud one."""
    if not isinstance(path, str):
        return None
    for name in _SCHEMES:
        if path.startswith(name + "://"):
            return name
    return None


def is_remote(path: str | Path) -> bool:
    return scheme(path) is not None


def _module(path: str) -> ModuleType:
    return importlib.import_module(_SCHEMES[scheme(path) or ""])


def parse_root(text: str) -> Root:
    """A repository path as given on the command line: a cloud path is kept as its text once its
    grammar is checked (InvalidArgumentError); anything else is a local Path."""
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
    _module(path).Store(path).probe()


# (not `mirror`: importing the submodule host.storage.mirror sets that name on this package)
def mirror_of(path: str) -> Mirror:
    """A cloud repository's local copy, empty until its first sync: in a private folder under the
    scheme's TRITON_*_MOUNT_DIRECTORY when that is set (it must exist), else the temporary folder."""
    from host.storage.mirror import Mirror

    module = _module(path)
    variable = module.MOUNT_DIRECTORY_VARIABLE
    mount = os.environ.get(variable) or None
    if mount is not None and not os.path.isdir(mount):
        raise InvalidArgumentError(f"{variable}='{mount}' is not a folder: it must exist to hold "
                                   f"the copy of model repository '{path}'")
    return Mirror(module.Store(path), mount)


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
                    copy = mirror_of(str(root))
                    self.mirrors[copy.root] = copy
                    self.roots.append(copy.root)
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
