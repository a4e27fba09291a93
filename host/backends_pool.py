"""Backend objects by name, with Triton's backend lifecycle.

A backend is created and initialized when the first model version using it loads, and finalized
when the last one unloads. When no plugin provides a backend, the native-library search of the
seed is the fallback (`libtriton_<name>.so` in the version folder, the model folder, then
`<backend_directory>/<name>/`); driving such a library through the C API is the seam left for
the native-backend bridge.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Callable

from host.backend import Backend
from host.errors import InvalidArgumentError, NotFoundError, UnsupportedError
from host.paths import check_backend_name, is_inside
from host.plugins.hints import install_hint
from host.plugins.registry import Registry

log = logging.getLogger(__name__)

# Seam for native backends: given the library path, backend name and its --backend-config
# settings, return a Backend.
NativeLoader = Callable[[Path, str, dict], Backend]


def native_library_candidates(name: str, model_path: Path, version: int,
                              backend_directory: Path | None) -> list[Path]:
    """Where Triton looks for `libtriton_<name>.so`, in its order."""
    lib = f"libtriton_{name}.so"
    paths = [model_path / str(version) / lib, model_path / lib]
    if backend_directory is not None:
        paths.append(backend_directory / name / lib)
    return paths


# Triton's defaults for every backend's settings (TritonModel::SetBackendConfigDefaults).
BACKEND_CONFIG_DEFAULTS = {"default-max-batch-size": "4"}


def _log_default_settings(settings: dict[str, str]) -> None:
    """Triton's lines (verbose) as each model version is created: a default kept or replaced."""
    for key, value in BACKEND_CONFIG_DEFAULTS.items():
        if key in settings:
            log.debug("Found overwritten default setting: %s,%s", key, settings[key])
        else:
            log.debug("Adding default backend config setting: %s,%s", key, value)


class BackendPool:
    def __init__(self, registry: Registry, backend_directory: Path | None = None,
                 native_loader: NativeLoader | None = None,
                 config: dict[str, dict[str, str]] | None = None) -> None:
        self.registry = registry
        self.backend_directory = backend_directory
        self.native_loader = native_loader
        # --backend-config: settings by backend name, "" for those every backend gets.
        self.config = config or {}
        self._lock = threading.Lock()
        self._live: dict[str, tuple[Backend, int]] = {}  # name -> (backend, users)

    def acquire(self, name: str, model_path: Path, version: int) -> Backend:
        """The backend for a model version about to load (initialized on first use)."""
        with self._lock:
            if name in self._live:
                _log_default_settings(self.settings(name))
                backend, users = self._live[name]
                self._live[name] = (backend, users + 1)
                return backend
            settings = self.settings(name)
            _log_default_settings(settings)
            backend = self._create(name, model_path, version)
            backend.config = settings
            if self.registry.backends.get(name) is not None:
                # what Triton's backends log when they initialize (a native library logs its own)
                log.debug("backend configuration:\n%s", json.dumps(
                    {"cmdline": self.cmdline(settings)}, sort_keys=True, separators=(",", ":")))
            backend.initialize()  # an error here leaves nothing behind: the model fails to load
            self._live[name] = (backend, 1)
            return backend

    def release(self, name: str) -> None:
        with self._lock:
            backend, users = self._live[name]
            if users > 1:
                self._live[name] = (backend, users - 1)
                return
            del self._live[name]
        try:
            backend.finalize()
        except Exception:
            log.exception("finalize of backend '%s' failed", name)

    def settings(self, name: str) -> dict[str, str]:
        """The backend's --backend-config settings: its own over those for every backend."""
        return {**self.config.get("", {}), **self.config.get(name, {})}

    def cmdline(self, settings: dict[str, str]) -> dict[str, str]:
        """TRITONBACKEND_BackendConfig's "cmdline": the entries Triton always gives a backend,
        then its --backend-config settings (which may replace them)."""
        return {"auto-complete-config": "true",
                "backend-directory": str(self.backend_directory or "/opt/tritonserver/backends"),
                "min-compute-capability": "6.000000",
                **BACKEND_CONFIG_DEFAULTS, **settings}

    def in_use(self) -> dict[str, int]:
        with self._lock:
            return {name: users for name, (_, users) in self._live.items()}

    def _create(self, name: str, model_path: Path, version: int) -> Backend:
        record = self.registry.backends.get(name)
        if record is not None:
            return record.factory(name)
        check_backend_name(name)
        for lib in native_library_candidates(name, model_path, version, self.backend_directory):
            if lib.is_file():
                # A library in the model's folders is the model's own: it must not be a link to
                # code elsewhere on disk (the backend directory is the operator's, not checked).
                if lib.parent in (model_path, model_path / str(version)) and not is_inside(model_path, lib):
                    raise InvalidArgumentError(
                        f"native backend library '{lib}' resolves outside the model directory "
                        f"'{model_path}' (a symbolic link that leaves the model directory is not allowed)")
                if self.native_loader is None:
                    raise UnsupportedError(
                        f"backend '{name}' is provided by no installed plugin; found native library "
                        f"'{lib}', but native Triton backends are not supported by this build")
                return self.native_loader(lib, name, self.settings(name))
        if self.backend_directory is not None and "python" in self.registry.backends:
            # Triton's python-based backends: `<backend-directory>/<name>/model.py` runs every
            # model of that backend through the python backend.
            backend_model = self.backend_directory / name / "model.py"
            if backend_model.is_file():
                python = self.registry.backends["python"].factory(name)
                python.backend_model = backend_model  # type: ignore[attr-defined]
                return python
        known = ", ".join(sorted(self.registry.backends)) or "none"
        hint = install_hint(name, self.registry)
        raise NotFoundError(
            f"no plugin provides backend '{name}'{hint}: installed backends are {known}, and no "
            f"native library libtriton_{name}.so was found")
