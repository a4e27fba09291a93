"""The on-disk model repository: where models are, which versions exist, what changed.

Pure functions over the file system; the model manager decides what to load.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from host.config.platforms import infer_backend  # noqa: F401 - the repository's API
from host.config.versions import select_versions  # noqa: F401 - the repository's API
from host.errors import NotFoundError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelLocation:
    name: str
    root: Path  # the repository root (one of --model-repository)
    path: Path  # root / name


class ModelKey(str):
    """A model's key with Triton's model namespacing (host.namespacing): its name, and the
    repository it is in as its namespace. It reads (formats, prints, serializes) as the bare
    name; keys equal and hash as (namespace, name), so models of one name in two repositories
    are two entries, and a dict lookup by a plain name finds neither; compared with a plain
    string it is its name (a configuration's `name` checked against its folder's). Sorted as
    Triton's ModelIdentifier: by namespace, then name."""

    namespace: str

    def __new__(cls, name: str, namespace: str) -> ModelKey:
        key = super().__new__(cls, name)
        key.namespace = namespace
        return key

    @property
    def qualified(self) -> str:
        """As Triton writes a model identifier in its texts: `<namespace>::<name>`."""
        return f"{self.namespace}::{self}" if self.namespace else str(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ModelKey) and self.namespace != other.namespace:
            return False
        return str.__eq__(self, other) is True

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash((self.namespace, str(self)))

    def __lt__(self, other: str) -> bool:
        if isinstance(other, ModelKey):
            return (self.namespace, str(self)) < (other.namespace, str(other))
        return str.__lt__(self, other)

    def __reduce__(self) -> tuple:
        return ModelKey, (str(self), self.namespace)

    def __repr__(self) -> str:
        return f"ModelKey({str(self)!r}, {self.namespace!r})"


def scan_namespaced(roots: Sequence[Path], mappings: Mapping[Path, Mapping[str, str]] | None = None,
                    labels: Mapping[Path, str] | None = None
                    ) -> tuple[dict[str, ModelLocation], dict[str, str]]:
    """Every model folder under `roots`, keyed by (repository, name): a name may be in several.
    `mappings` and `labels` as for `scan`."""
    found: dict[str, ModelLocation] = {}
    for root in roots:
        for name, path in _model_folders(root, mappings, labels):
            key = ModelKey(name, label(root, labels))
            found[key] = ModelLocation(key, Path(root), path)
    return found, {}


def label(root: Path, labels: Mapping[Path, str] | None) -> str:
    """How a repository is named in messages and namespaces: a cloud repository's local copy
    (host.storage) by the path the user gave, a local one by its own."""
    return labels.get(Path(root), str(root)) if labels else str(root)


def _model_folders(root: Path, mappings: Mapping[Path, Mapping[str, str]] | None,
                   labels: Mapping[Path, str] | None = None) -> list[tuple[str, Path]]:
    """(served name, folder) of each model folder of a repository, by folder name."""
    mapping = mappings.get(Path(root), {}) if mappings else {}
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as exc:
        raise NotFoundError(f"failed to open model repository '{label(root, labels)}': "
                            f"{exc.strerror}") from None
    return [(mapping.get(e.name, e.name), Path(e.path)) for e in entries
            if e.is_dir() and not e.name.startswith(".")]


def scan(roots: Sequence[Path], mappings: Mapping[Path, Mapping[str, str]] | None = None,
         labels: Mapping[Path, str] | None = None) -> tuple[dict[str, ModelLocation], dict[str, str]]:
    """Every model folder under `roots`; a name found in two roots is an error for that model.
    `mappings`: for a root registered with a mapping (Triton's RegisterModelRepository, used by
    SageMaker's multi-model endpoint), subfolder name -> the name its model is served under.
    `labels`: how messages name a root (`label`).

    Returns (locations, errors by model name).
    """
    found: dict[str, ModelLocation] = {}
    errors: dict[str, str] = {}
    for root in roots:
        for name, path in _model_folders(root, mappings, labels):
            if name in found:
                errors[name] = (f"model '{name}' exists in multiple model repositories: "
                                f"'{label(found[name].root, labels)}' and '{label(root, labels)}'")
                continue
            found[name] = ModelLocation(name, Path(root), path)
    return found, errors


def versions_on_disk(path: Path, warn: bool = True) -> list[int]:
    """Numbered version folders of a model, ascending (as in Triton, folders that are not numbers
    are ignored, and numbers written with a leading zero: `01`, each with Triton's warning)."""
    out = []
    for entry in os.scandir(path):
        if (warn and entry.is_dir() and not (entry.name.isascii() and entry.name.isdigit())
                and not entry.name.startswith((".", "__pycache__"))):
            log.warning("ignore version directory '%s' which fails to convert to integral number",
                        entry.name)
        if entry.is_dir() and entry.name.isascii() and entry.name.isdigit():
            if len(entry.name) > 1 and entry.name.startswith("0"):
                if warn:
                    log.warning("ignore version directory '%s' which contains leading zeros in its "
                                "directory name", entry.name)
                continue
            out.append(int(entry.name))
    return sorted(out)


def version_fingerprint(path: Path, version: int) -> tuple:
    """What Triton checks before reloading one version (ModelTimestamp::IsModelVersionModified):
    the files of its version folder and the model folder's own files (its configuration aside,
    which is compared as a configuration)."""
    top = []
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except OSError:
        return ()
    for entry in entries:
        if entry.is_file() and entry.name != "config.pbtxt":
            st = entry.stat()
            top.append((entry.name, st.st_size, st.st_mtime_ns))
    return tuple(top) + fingerprint(path / str(version))


def fingerprint(path: Path) -> tuple:
    """A cheap signature of a model folder (names, sizes, mtimes) to notice changes when polling."""
    items = []
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        items.append((os.path.relpath(dirpath, path), -1, 0))  # an added empty version folder counts
        for name in sorted(filenames):
            try:
                st = os.stat(os.path.join(dirpath, name))
            except OSError:
                continue
            items.append((os.path.relpath(os.path.join(dirpath, name), path), st.st_size, st.st_mtime_ns))
    return tuple(items)
