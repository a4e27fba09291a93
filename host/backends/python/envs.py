"""Execution environments of python models: the python backend's `EXECUTION_ENV_PATH`.

A model whose configuration sets `EXECUTION_ENV_PATH` brings its own Python packages: a
conda-pack archive, any tar archive of an environment with a `bin/activate` script, or such a
folder, inside the model directory. As in Triton, where the backend's own stub binary runs the
model with the environment's variables and libraries, the model runs in a stub process of its
own (process mode, docs/process_model.md) started by this server's interpreter, which:

- unpacks an archive once into a private folder of this server (into a new one when the
  archive's modification time changes), with the secure-extraction rules of Triton's libarchive call
  (`check_env_archive`: no absolute path, no `..`) and Python's `data` filter (no link or device
  pointing outside the folder); a folder is used in place;
- requires `bin/activate` (Triton's rule and text);
- starts the stub with the variables Triton's launcher takes from the activation script
  (`VIRTUAL_ENV`, the environment's `bin` first on `PATH` and its `lib` first on
  `LD_LIBRARY_PATH`, no `PYTHONHOME`);
- puts the environment's `lib/python<X.Y>/site-packages` (its `.pth` files included) first on
  the stub's `sys.path`, before the server's own packages: the model imports the environment's
  versions, and what the environment lacks (the stub's own numpy and protobuf, say) comes from
  the server. The environment must be built for this server's Python `X.Y` (Triton's stub is
  built for one Python version too); packages for another version are refused at load.

`auto_complete_config` of such a model runs there too (a one-shot child, `run_child`), never in
the server process.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
from pathlib import Path

from host.errors import InternalError

log = logging.getLogger(__name__)

PARAMETER = "EXECUTION_ENV_PATH"
_VERSION = f"{sys.version_info[0]}.{sys.version_info[1]}"


def check_env_archive(path: Path) -> None:
    """Refuse an archive that Triton's secure extraction would refuse (libarchive's rules: an
    entry with an absolute path or a `..` component), with Triton's error text."""
    if not path.is_file():
        return
    try:
        with tarfile.open(path) as archive:
            for member in archive:
                why = ("Path is absolute" if member.name.startswith("/") else
                       "Path contains '..'" if ".." in member.name.split("/") else "")
                if why:
                    raise InternalError(
                        f"archive_write_header() failed with error code = -25 error message "
                        f"is {why}")
    except tarfile.TarError as exc:
        raise InternalError(
            f"archive_read_next_header() failed for {PARAMETER} '{path}': {exc}") from None


class Environment:
    """An unpacked (or in-place) environment: its variables and its packages' folder."""

    def __init__(self, root: Path, source: Path) -> None:
        self.root, self.source = root, source
        site_dir = root / "lib" / f"python{_VERSION}" / "site-packages"
        self.site_dirs = [str(site_dir)] if site_dir.is_dir() else []
        if not self.site_dirs:
            others = sorted(p.parent.name for p in root.glob("lib/python3*/site-packages"))
            if others:
                raise InternalError(
                    f"{PARAMETER} '{source}': the environment holds packages for "
                    f"{', '.join(others)}; this server runs Python {_VERSION}, and a model's "
                    "environment must be built for the same Python version")

    def variables(self) -> dict[str, str]:
        """The stub's environment: this process's, as the activation script changes it."""
        env = dict(os.environ)
        root = str(self.root)
        env["VIRTUAL_ENV"] = root
        env["VIRTUAL_ENV_PROMPT"] = f"({root})"
        env["PATH"] = f"{root}/bin" + (f":{env['PATH']}" if env.get("PATH") else "")
        env["LD_LIBRARY_PATH"] = f"{root}/lib" + (
            f":{env['LD_LIBRARY_PATH']}" if env.get("LD_LIBRARY_PATH") else "")
        env.pop("PYTHONHOME", None)
        return env

    def command(self, module: str, *args: str) -> list[str]:
        """`python -m module args` with this environment's packages first on `sys.path`."""
        boot = ("import runpy, site, sys; n = len(sys.path); "
                f"[site.addsitedir(d) for d in {self.site_dirs!r}]; "
                "sys.path[:] = sys.path[n:] + sys.path[:n]; "
                f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
        return [sys.executable, "-c", boot, *args]


def run_child(env: Environment | None, module: str, payload: bytes, timeout: float | None = None
              ) -> subprocess.CompletedProcess:
    """Run `module` once in `env` (None: this server's own packages), `payload` on its standard
    input; its output is returned."""
    command = [sys.executable, "-m", module] if env is None else env.command(module)
    return subprocess.run(command, input=payload, capture_output=True,
                          env=None if env is None else env.variables(), timeout=timeout, check=False)


class _Registry:
    """The environments unpacked by this server, keyed by the archive's real path."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.base: Path | None = None
        self.unpacked: dict[str, tuple[Path, int]] = {}  # archive -> (folder, mtime_ns)
        self.folders = itertools.count()

    def _base(self) -> Path:
        if self.base is None:
            self.base = Path(tempfile.mkdtemp(prefix="modelhost-python-envs-"))  # mode 0700
            atexit.register(shutil.rmtree, self.base, True)
        return self.base

    def locate(self, path: Path) -> Environment:
        """The environment `path` names (an archive or a folder), unpacked if need be, checked."""
        try:
            real = os.path.realpath(path, strict=True)
            st = os.stat(real)
        except OSError:
            raise InternalError(f"Failed to get the canonical path for {path}.") from None
        if os.path.isdir(real):
            root = Path(real)
        else:
            check_env_archive(Path(real))
            with self.lock:
                known = self.unpacked.get(real)
                if known is not None and known[1] == st.st_mtime_ns:
                    root = known[0]
                else:
                    # A changed archive goes to a new folder: a stub may still run in the old one.
                    root = self._base() / str(next(self.folders))
                    log.info("Extracting Python execution env %s", real)
                    root.mkdir(mode=0o755)
                    try:
                        with tarfile.open(real) as archive:
                            archive.extractall(root, filter="data")
                    except (tarfile.TarError, OSError) as exc:
                        shutil.rmtree(root, ignore_errors=True)
                        raise InternalError(
                            f"failed to extract {PARAMETER} '{path}': {exc}") from None
                    self.unpacked[real] = (root, st.st_mtime_ns)
        activate = root / "bin" / "activate"
        if not activate.is_file():
            # Triton's text (python_backend's stub launcher)
            raise InternalError(f"Path {activate} does not exist. The Python environment should "
                                "contain an 'activate' script.")
        return Environment(root, path)


_registry = _Registry()
locate = _registry.locate
