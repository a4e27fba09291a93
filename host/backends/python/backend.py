"""The "python" backend: Triton python-backend models (`model.py` with `TritonPythonModel`), in process.

Triton runs every instance of a python model in its own stub process. Here each instance imports
the model file freshly under a unique module name instead, so module globals stay per instance,
and talks to it through `triton_python_backend_utils` (`host.backends.python.pb_utils`):

- the model file is `<version dir>/<default_model_filename or "model.py">`. It is imported as
  module `model` of a synthetic package whose path is the version directory, so relative imports
  (`from . import helper`) work; during the import, the importing thread finds top-level modules
  in the version directory first (as if it led `sys.path`, which is left alone: other threads
  importing at the same time must not see it), so sibling modules import by absolute name too.
  Sibling modules are imported afresh for each
  instance and taken out of `sys.modules` again, so two models with a `utils.py` do not clash.
  An absolute import made later, while the model runs (`unittest.main("model")` in `execute`),
  finds the version directory last, as Triton's appended `sys.path` entry (_RuntimeFinder).
- `auto_complete_config` imports the module once more, on its own, as Triton's auto-complete stub.
- `initialize(args)` receives Triton's keys: model_config (JSON), model_instance_kind,
  model_instance_name, model_instance_device_id, model_repository, model_version, model_name.
- `execute` may be a coroutine function: it runs on an event loop thread of the instance
  (decoupled models: in the background, as Triton does).
- non-decoupled models answer by returning one `InferenceResponse` per request, or `None` (for the
  whole list or for single requests) after sending that request's one response through its
  response sender; a request left without a response gets an error response.
- decoupled models return None and answer through `request.get_response_sender()`.
- an exception in `execute` (or a malformed return) fails every request that has not had its
  final response, with Triton's message: "Failed to process the request(s) for model
  '<instance>', message: <ExceptionType>: <text>".
- response outputs are pruned to the requested outputs; each keeps the datatype and shape of the
  model's tensor, even where the output's configuration says otherwise (Triton's python backend
  does not check them); BYTES outputs (object arrays of bytes/str, or 'S' arrays) become object
  arrays of `bytes`.

Process mode (`EXECUTION_MODE` "process", docs/process_model.md): each instance runs this same
code in a stub process of its own (`host.backends.python.process`), so CPU-bound models scale with
their instance count.

BLS (`InferenceRequest.exec`/`async_exec`, `load_model`, ...): `host.backends.python.bls` (in
thread mode; a model in process mode gets a clear error).

Request rescheduling (`request.set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)`, for
iterative sequences): once execute returns, the request runs again; a non-decoupled model returns
None for it (anything else fails the execute with Triton's message). Thread mode only.

The optional `is_ready()` is asked on every model-readiness request (`PythonInstance.ready_check`,
as Triton's TRITONBACKEND_ModelInstanceReady). Not supported (yet): GPU-resident tensors
(tensors live in CPU memory); custom metrics of process-mode instances are not exported.
"""

from __future__ import annotations

import asyncio
import importlib.abc
import importlib.machinery
import importlib.util
import itertools
import json
import logging
import os
import re
import sys
import threading
import traceback
import types
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from host import bls
from host.backend import Backend, Instance, InstanceSpec, Model, ModelSpec
from host.backends.python import envs, pb_utils, settings
from host.config import config_from_json, config_to_json
from host.errors import (
    HostError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    error_for,
)
from host.errors import Code as _Code
from host.inference import InferenceRequest as HostRequest
from host.inference import InferenceResponse as HostResponse
from host.inference import Tensor as HostTensor
from host.paths import execution_env_path, resolve_inside

log = logging.getLogger(__name__)

DEFAULT_MODEL_FILENAME = "model.py"
MODEL_CLASS = "TritonPythonModel"

_module_counter = itertools.count(1)
_import_lock = threading.Lock()  # sys.modules juggling is process-global


class _VersionDirFinder(importlib.abc.MetaPathFinder):
    """Top-level modules in the version directory of the model this thread is importing.

    Putting the directory on `sys.path` instead would show it to every thread importing at the same
    time (models load in parallel), and removing it again shifts `sys.path` under another thread's
    path search, which then skips an entry and fails to find an installed package."""

    def __init__(self) -> None:
        self._local = threading.local()

    @contextmanager
    def searching(self, directory: str) -> Iterator[None]:
        previous = getattr(self._local, "directory", None)
        self._local.directory = directory
        try:
            yield
        finally:
            self._local.directory = previous

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        directory = getattr(self._local, "directory", None)
        if directory is None or path is not None:  # not importing a model, or a submodule
            return None
        return importlib.machinery.PathFinder.find_spec(name, [directory])


def _install_finder() -> _VersionDirFinder:
    finder = _VersionDirFinder()
    # Just before the path finder, where sys.path[0] would be searched: built-in and frozen
    # modules still win over a sibling file of the same name.
    at = next((i for i, f in enumerate(sys.meta_path) if f is importlib.machinery.PathFinder),
              len(sys.meta_path))
    sys.meta_path.insert(at, finder)
    return finder


_finder = _install_finder()


class _RuntimeLoader(importlib.abc.Loader):
    """A loader that gives the module the calling model's context (as the model's own modules
    have it) before running it; anything else is the wrapped loader's."""

    def __init__(self, inner: Any, ctx: pb_utils._ModelContext) -> None:
        self._inner = inner
        self._ctx = ctx

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        setattr(module, pb_utils.CONTEXT_GLOBAL, self._ctx)
        self._inner.exec_module(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ... (tracebacks)
        return getattr(self._inner, name)


# Top-level name -> version directory, of the modules _RuntimeFinder loaded, and version directory
# -> calls into that model's code under way (_running); both under _runtime_lock, which is never
# held for long (_import_lock is held while a model file imports, which may take seconds).
_runtime_modules: dict[str, str] = {}
_running_dirs: dict[str, int] = {}
_runtime_lock = threading.Lock()


class _RuntimeFinder(importlib.abc.MetaPathFinder):
    """Triton's stub appends the model's version directory to `sys.path`, so a top-level import
    that a model makes while it runs (in `execute`, say `unittest.main("model")`, which imports
    `model`) finds the model's own files when nothing installed has that name. This finder, last
    on `sys.meta_path` as an appended path entry would be, does that for the calling model. The
    module stays in `sys.modules` (a second import reuses it, as in Triton) until another model
    starts running (`_running`) or the model is unloaded."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if path is not None or getattr(_finder._local, "directory", None) is not None:
            return None  # a submodule, or a model file being imported (_VersionDirFinder)
        ctx = pb_utils._current_context()
        if ctx is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, [ctx.model_dir])
        if spec is None or spec.loader is None:
            return None
        spec.loader = _RuntimeLoader(spec.loader, ctx)
        with _runtime_lock:
            _runtime_modules[name] = ctx.model_dir
        return spec


sys.meta_path.append(_RuntimeFinder())


def _forget_runtime(name: str, directory: str) -> None:
    """Drop a module _RuntimeFinder loaded from `directory` (caller holds _runtime_lock)."""
    module = sys.modules.get(name)
    if module is not None and _is_under(module, os.path.realpath(directory)):
        del sys.modules[name]
    if _runtime_modules.get(name) == directory:
        del _runtime_modules[name]


def _drop_runtime(model_dir: str) -> None:
    """The model is unloaded: its runtime imports go (a new version's files load afresh)."""
    with _runtime_lock:
        for name, directory in list(_runtime_modules.items()):
            if directory == model_dir:
                _forget_runtime(name, directory)


class _running:
    """Around a call into a model (initialize, execute, finalize). In Triton each model has a
    process of its own, so a name that another model's runtime import cached (its `model`) must
    not answer this model's import: it is dropped as this model starts running, unless that other
    model is running too (a BLS call from its execute to this model, say: its tests still use it).
    A class, not a generator: it runs around every execute."""

    __slots__ = ("model_dir",)

    def __init__(self, model_dir: str) -> None:
        self.model_dir = model_dir

    def __enter__(self) -> None:
        model_dir = self.model_dir
        with _runtime_lock:
            _running_dirs[model_dir] = _running_dirs.get(model_dir, 0) + 1
            if _runtime_modules:
                for name, directory in list(_runtime_modules.items()):
                    if directory != model_dir and not _running_dirs.get(directory):
                        _forget_runtime(name, directory)

    def __exit__(self, *exc: object) -> None:
        model_dir = self.model_dir
        with _runtime_lock:
            left = _running_dirs[model_dir] - 1
            if left:
                _running_dirs[model_dir] = left
            else:
                del _running_dirs[model_dir]


# --- locating and importing the model file ----------------------------------------------------

def model_file(spec: ModelSpec, backend_model: Path | None = None) -> Path:
    """The model's python file: its own, or a python-based backend's `model.py`."""
    if backend_model is not None:
        return backend_model
    filename = spec.default_model_filename or DEFAULT_MODEL_FILENAME
    path = resolve_inside(spec.path, filename, "default_model_filename", under=str(spec.version))
    if not path.is_file():
        raise NotFoundError(
            f"Failed to preinitialize Python stub: Python model file not found in '{path}'")
    if path.suffix != ".py":
        raise InvalidArgumentError(
            f"Model name must end with '.py'. Model name is \"{path.name}\".")
    return path


# Triton's python backend (pb_utils.h INVALID_CHARS) refuses to start a stub whose name (the
# model's for auto-complete, else the instance's) holds one of these: the name reaches a shell.
_INVALID_STUB_CHARS = frozenset(";|&$`<>()[]{}\\\"'*?~#!")


def check_stub_name(name: str) -> None:
    if not name or not _INVALID_STUB_CHARS.isdisjoint(name):
        raise InvalidArgumentError("Invalid stub name: contains invalid characters")


def _sanitize(text: str) -> str:
    return re.sub(r"\W", "_", text)


def _sibling_names(directory: Path) -> set[str]:
    """Top-level module names a file or package in `directory` would provide."""
    names: set[str] = set()
    try:
        entries = list(directory.iterdir())
    except OSError:
        return names
    for entry in entries:
        if entry.is_file() and entry.suffix in (".py", ".pyc", ".so", ".pyd"):
            names.add(entry.name.split(".", 1)[0])
        elif entry.is_dir() and entry.name.isidentifier():
            names.add(entry.name)
    return names


def _is_under(module: types.ModuleType, directory: str) -> bool:
    # Modules may answer any attribute (torch.classes gives a _ClassNamespace for __path__):
    # only text paths count.
    paths = [getattr(module, "__file__", None)]
    try:
        paths += list(getattr(module, "__path__", None) or [])
    except TypeError:
        pass
    for p in paths:
        if isinstance(p, str) and p and os.path.realpath(p).startswith(directory + os.sep):
            return True
    return False


def import_model_module(path: Path, ctx: pb_utils._ModelContext, label: str) -> types.ModuleType:
    """Import `path` freshly as `<unique package>.<stem>`; see the module docstring."""
    version_dir = os.path.realpath(path.parent)
    package_name = f"_modelhost_python_{_sanitize(label)}_{next(_module_counter)}"
    package = types.ModuleType(package_name)
    package.__path__ = [version_dir]
    package.__package__ = package_name
    package.__file__ = None
    setattr(package, pb_utils.CONTEXT_GLOBAL, ctx)
    module_name = f"{package_name}.{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise InternalError(f"cannot import python model file '{path}'")
    module = importlib.util.module_from_spec(spec)
    setattr(module, pb_utils.CONTEXT_GLOBAL, ctx)

    with _import_lock:
        # Hide cached modules that a sibling of the model file would shadow, so `import utils`
        # finds this model's utils.py; put them back afterwards.
        hidden = {n: sys.modules.pop(n) for n in _sibling_names(path.parent) if n in sys.modules}
        before = set(sys.modules)
        sys.modules[package_name] = package
        sys.modules[module_name] = module
        token = pb_utils._ACTIVE.set(ctx)
        try:
            with _finder.searching(version_dir):
                spec.loader.exec_module(module)
        except BaseException:
            for name in [package_name, module_name]:
                sys.modules.pop(name, None)
            raise
        finally:
            pb_utils._ACTIVE.reset(token)
            # Siblings imported by absolute name: keep them private to this instance.
            for name in set(sys.modules) - before:
                mod = sys.modules.get(name)
                if mod is not None and not name.startswith(package_name) and _is_under(mod, version_dir):
                    del sys.modules[name]
                    try:
                        setattr(mod, pb_utils.CONTEXT_GLOBAL, ctx)
                    except AttributeError:
                        pass
            sys.modules.update(hidden)
    return module


def forget_module(module: types.ModuleType | None) -> None:
    """Drop a model module (and its package's submodules) from sys.modules."""
    if module is None:
        return
    package_name = module.__name__.rpartition(".")[0]
    with _import_lock:
        # tuple(): a snapshot taken at once; other threads import (add to sys.modules) meanwhile
        for name in [n for n in tuple(sys.modules) if n == package_name or n.startswith(package_name + ".")]:
            del sys.modules[name]


def _model_class(module: types.ModuleType, path: Path) -> type:
    cls = getattr(module, MODEL_CLASS, None)
    if cls is None:
        raise InvalidArgumentError(f"python model file '{path}' does not define class '{MODEL_CLASS}'")
    return cls


class _StubError(Exception):
    """A check of the backend itself (Triton's stub raises these in C++: no type name in the text)."""


def _exception_text(exc: BaseException, model_dir: str | None = None) -> str:
    """How Triton's stub prints an exception: `<type>: <message>` for Python ones, then, as
    pybind11 words a Python error, the frames it went through, innermost first:
    `\n\nAt:\n  <file>(<line>): <function>\n` per frame. The stub calls the model from C++, so
    its list ends at the model's own entry point; here the frames of the host that called the
    model are left out the same way: the list starts at the first frame in `model_dir`."""
    if isinstance(exc, _StubError):
        return str(exc)
    text = f"{type(exc).__name__}: {exc}"
    if model_dir is None:
        return text
    frames = []
    inside = False
    tb = exc.__traceback__
    prefix = os.path.join(model_dir, "")
    while tb is not None:
        code = tb.tb_frame.f_code
        inside = inside or code.co_filename.startswith(prefix)
        if inside:
            frames.append(f"  {code.co_filename}({tb.tb_lineno}): {code.co_name}\n")
        tb = tb.tb_next
    if not frames:
        return text
    return text + "\n\nAt:\n" + "".join(reversed(frames))


def _host_code(code: int) -> _Code:
    try:
        return _Code[pb_utils._ErrorCode(code).name]
    except (KeyError, ValueError):
        return _Code.UNKNOWN


def triton_stub_argv() -> None:
    """Triton's stub embeds Python with `sys.argv == [""]`, and models rely on it: the QA models'
    `unittest.main("model", exit=False)` parses `sys.argv`, which must not hold the server's own
    command line. Called by the processes modelhost owns (`host.serve`, the process-mode stub),
    whose own code has read its command line by then; a program that embeds `Host` keeps its
    `sys.argv`."""
    sys.argv = [""]


def auto_complete(spec: ModelSpec, backend_model: Path | None) -> Any:
    """The model's `auto_complete_config` run on its configuration, in this process: the
    completed configuration, or None when the model has no such function."""
    path = model_file(spec, backend_model)
    ctx = pb_utils._ModelContext(spec.name, model_dir(spec, path, backend_model))
    try:
        module = import_model_module(path, ctx, f"{spec.name}_autocomplete")
    except HostError:
        raise
    except Exception as exc:
        raise InternalError(
            f"failed to import python model '{spec.name}' from '{path}': "
            f"{_exception_text(exc)}") from exc
    try:
        cls = _model_class(module, path)
        hook = getattr(cls, "auto_complete_config", None)
        if hook is None:
            return None
        config = pb_utils.ModelConfig(config_to_json(spec.config))
        token = pb_utils._ACTIVE.set(ctx)
        try:
            result = hook(config)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from exc
        except HostError:
            raise
        except Exception as exc:
            raise InternalError(
                f"auto_complete_config of model '{spec.name}' failed: "
                f"{_exception_text(exc, ctx.model_dir)}") from exc
        finally:
            pb_utils._ACTIVE.reset(token)
        if not isinstance(result, pb_utils.ModelConfig):
            raise InvalidArgumentError(
                f"auto_complete_config function in model '{spec.name}' must return a valid "
                "pb.ModelConfig object.")
        return config_from_json(json.loads(json.dumps(result.as_dict())))
    finally:
        forget_module(module)


def model_environment(spec: ModelSpec) -> envs.Environment | None:
    """The model's execution environment (EXECUTION_ENV_PATH, host.backends.python.envs),
    unpacked and checked; None when it has none."""
    value = spec.config.parameters.get(envs.PARAMETER)
    if value is None or not value.string_value:
        return None
    path = execution_env_path(spec.path, value.string_value)
    mode = spec.parameter(settings.EXECUTION_MODE_PARAMETER)
    if mode is not None and mode.strip().lower() != "process":
        raise InvalidArgumentError(
            f"model '{spec.name}': {envs.PARAMETER} runs the model in a process of its own "
            f"started from that environment; remove {settings.EXECUTION_MODE_PARAMETER} "
            "'thread' or set it to 'process'")
    return envs.locate(path)


def _auto_complete_in(env: envs.Environment | None, spec: ModelSpec,
                      backend_model: Path | None) -> Any:
    """`auto_complete` run by a one-shot child (in the model's environment, if it has one)."""
    import pickle

    from host.proto import model_config_pb2

    payload = pickle.dumps({"name": spec.name, "version": spec.version,
                            "repository": spec.repository, "path": spec.path,
                            "config": spec.config.SerializeToString(),
                            "backend_model": backend_model})
    try:
        done = envs.run_child(env, "host.backends.python.env_child", payload)
    except OSError as exc:
        raise InternalError(f"model '{spec.name}': cannot start its auto-complete process: {exc}") from None
    if done.stderr and done.returncode == 0:
        sys.stderr.buffer.write(done.stderr)  # what the model printed, in the server's log
        sys.stderr.flush()
    try:
        answer = pickle.loads(done.stdout) if done.returncode == 0 else None
    except Exception:  # noqa: BLE001 - whatever the child printed, it is not an answer
        answer = None
    if answer is None:
        why = done.stderr.decode(errors="replace").strip()[-1000:]
        raise InternalError(f"Stub process '{spec.name}' failed to run auto_complete_config in "
                            f"its execution environment: {why}")
    if answer[0] == "error":
        raise error_for(_Code[answer[1]], answer[2])
    return model_config_pb2.ModelConfig.FromString(answer[1])


# --- backend / model / instance ----------------------------------------------------------------

def model_dir(spec: ModelSpec, path: Path, backend_model: Path | None) -> str:
    """What `pb_utils.get_model_dir()` answers: the folder of the model's python file, or for a
    python-based backend (its `model.py` is shared) the model's version folder, as in Triton."""
    return str(spec.path / str(spec.version)) if backend_model is not None else str(path.parent)


class PythonBackend(Backend):
    """Registered under the name "python". A python-based backend (Triton's
    `<backend-directory>/<name>/model.py`, for `backend: "<name>"`) is one of these with
    `backend_model` set: every model using it runs that file (host.backends_pool)."""

    backend_model: Path | None = None
    parallel_instance_loading = True  # as Triton's python backend (see PythonModel)

    def initialize(self) -> None:
        settings.check(self.config)  # --backend-config python,...

    def auto_complete_config(self, spec: ModelSpec) -> None:
        check_stub_name(spec.name)
        env = model_environment(spec)
        if env is not None or settings.execution_mode(spec, self.config) == "process":
            # The model runs in a process of its own: so does its auto-complete (as in Triton's
            # stub), so that the server never imports the model's file (nor what it imports);
            # in its execution environment if it has one (it may import what only that has).
            spec.config.CopyFrom(_auto_complete_in(env, spec, self.backend_model))
            return
        completed = auto_complete(spec, self.backend_model)
        if completed is not None:
            spec.config.CopyFrom(completed)

    def create_model(self, spec: ModelSpec) -> PythonModel:
        model = PythonModel(spec)
        model.backend_settings = self.config
        model.backend_model = self.backend_model
        return model


class PythonModel(Model):
    backend_settings: dict[str, str] = {}
    backend_model: Path | None = None
    in_stub = False  # this model object lives in a process-mode stub (host.backends.python.stub)
    environment: envs.Environment | None = None  # EXECUTION_ENV_PATH: its instances run there

    def initialize(self) -> None:
        self.path = model_file(self.spec, self.backend_model)
        self.model_dir = model_dir(self.spec, self.path, self.backend_model)
        if not self.in_stub:  # a stub runs in the environment already
            self.environment = model_environment(self.spec)
        cfg = self.spec.config
        self.output_names = [o.name for o in cfg.output]

    @property
    def parallel_instance_loading(self) -> bool:
        """As Triton's python backend, instances load in parallel, each in its own process
        (EXECUTION_MODE "process"). In this process (the default "thread" mode) they load one
        after the other: models count their instances in files under POSIX locks (fcntl), which
        keep processes apart, not threads (TRITON_PARALLEL_INSTANCE_LOADING=1 forces it)."""
        return self._in_processes()

    def _in_processes(self) -> bool:
        """Whether each instance runs in a stub process: EXECUTION_MODE "process", or an
        execution environment (only a process can run another Python)."""
        return (self.environment is not None
                or settings.execution_mode(self.spec, self.backend_settings) == "process")

    def create_instance(self, spec: InstanceSpec) -> Instance:
        check_stub_name(spec.name)
        # Process mode (EXECUTION_MODE "process"): the instance runs in a stub process of its own
        # (a python-based backend's too: the stub runs the backend's model.py for this model).
        if self._in_processes():
            from host.backends.python.process import ProcessInstance

            return ProcessInstance(self, spec, settings.arena_bytes(self.backend_settings),
                                   self.environment)
        return PythonInstance(self, spec)


# How long a readiness request waits for the model's is_ready() (Triton's
# kUserModelReadinessTimeoutMs).
READINESS_TIMEOUT_S = 5.0


class _Readiness:
    """One instance's `is_ready()` calls, as Triton's python backend makes them: one at a time
    (a check that arrives while one runs waits for its result, up to the timeout); a check that
    times out answers "not ready" and leaves the call running, whose result the next check that
    was waiting for it gets."""

    def __init__(self, instance_name: str) -> None:
        self._name = instance_name
        self._cv = threading.Condition()
        self._inflight = False
        self._ready = False
        self._error = ""

    def check(self, call: Any) -> str:
        with self._cv:
            if self._inflight:
                if not self._cv.wait_for(lambda: not self._inflight, READINESS_TIMEOUT_S):
                    return "Timed out waiting for in-flight is_ready() response"
                return self._why()
            self._inflight = True
            threading.Thread(target=self._run, args=(call,), daemon=True,
                             name="is_ready").start()
            if not self._cv.wait_for(lambda: not self._inflight, READINESS_TIMEOUT_S):
                return "Timed out waiting for user-defined is_ready() response"
            return self._why()

    def _run(self, call: Any) -> None:
        try:
            ready, error = call()
        except BaseException as exc:  # noqa: BLE001 - the waiters must hear of it
            ready, error = False, str(exc) or type(exc).__name__
        with self._cv:
            self._ready, self._error, self._inflight = ready, error, False
            self._cv.notify_all()

    def _why(self) -> str:
        if self._error:
            return self._error
        return "" if self._ready else f"Model '{self._name}' is not ready (user-defined check failed)."


class _RequestState:
    """One request in one execute: its host request and the model-facing wrapper, whose sender
    is made when someone first asks for it (most models return their responses instead)."""

    __slots__ = ("instance", "request", "pb_request")

    def __init__(self, instance: PythonInstance, request: HostRequest) -> None:
        self.instance = instance
        self.request = request
        self.pb_request = instance._wrap_request(request)

    @property
    def sender(self) -> pb_utils.InferenceResponseSender:
        return self.pb_request._response_sender()  # type: ignore[return-value]

    def fail(self, message: str) -> None:
        """Send an error as the final response unless a final response went out already.

        A non-decoupled request whose one response was sent (not final yet) keeps it: Triton
        delivers that response when it is sent, and its front ends drop what comes after the
        first response of such a request (the error response included)."""
        sender = self.sender
        if sender._close():
            pending, sender._pending = sender._pending, None
            if pending is not None:
                log.warning("request '%s' of model '%s' already has its response; dropped the "
                            "error that followed: %s", self.request.id, self.instance.name, message)
                self.request.respond(self.instance._convert(pending, self.request), True)
                return
            self.request.respond(self.instance._error_response(InternalError(message), self.request), True)


def _make_sender(instance: PythonInstance, request: HostRequest) -> pb_utils.InferenceResponseSender:
    """A request's sender (bound with functools.partial, made on first use). Its way out is a
    closure over the instance and the request, not the request state: the state holds the
    wrapper that holds the sender, and a sender holding the state back would be a reference
    cycle per request, left to the garbage collector (pauses of several milliseconds under load)
    instead of reference counting."""

    def emit(response: pb_utils.InferenceResponse | None, final: bool) -> None:
        request.respond(None if response is None else instance._convert(response, request), final)

    return pb_utils.InferenceResponseSender(instance.decoupled, emit, request.is_cancelled)


class PythonInstance(Instance):
    # In the server's process sys.exit() from a model fails only its requests; a stub process
    # (host.backends.python.stub) sets this so that it ends the stub instead, as Triton's does.
    exit_ends_process = False

    def __init__(self, model: PythonModel, spec: InstanceSpec) -> None:
        self.model = model
        self.spec = spec
        self.decoupled = model.spec.decoupled
        self.name = spec.name
        self.module: types.ModuleType | None = None
        self.user: Any = None
        self.ctx = pb_utils._ModelContext(model.spec.name, model.model_dir)
        self.ctx.instance_name = spec.name  # named in Triton's model-control error texts
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._readiness = _Readiness(spec.name)

    # --- lifecycle ---

    def initialize(self) -> None:
        mspec = self.model.spec
        try:
            self.module = import_model_module(self.model.path, self.ctx, f"{mspec.name}_{self.name}")
            cls = _model_class(self.module, self.model.path)
            with self._active():
                self.user = cls()
                init = getattr(self.user, "initialize", None)
                if init is not None:
                    init({
                        "model_config": json.dumps(config_to_json(mspec.config)),
                        "model_instance_kind": self.spec.kind,
                        "model_instance_name": self.name,
                        "model_instance_device_id": str(self.spec.device_id),
                        "model_repository": str(mspec.path),
                        "model_version": str(mspec.version),
                        "model_name": mspec.name,
                    })
            self.ctx.serving = True  # BLS calls are allowed from now until finalize
        except HostError:
            forget_module(self.module)
            raise
        except Exception as exc:
            forget_module(self.module)
            log.error("initialize of python model '%s' instance '%s' failed:\n%s",
                      mspec.name, self.name, traceback.format_exc())
            raise InternalError(_exception_text(exc, self.ctx.model_dir)) from exc

    def finalize(self) -> None:
        self.ctx.serving = False
        try:
            fin = getattr(self.user, "finalize", None)
            if fin is not None:
                with self._active():
                    fin()
        except Exception:
            log.exception("finalize of python model '%s' instance '%s' failed",
                          self.model.spec.name, self.name)
        finally:
            self._stop_loop()
            forget_module(self.module)
            _drop_runtime(self.ctx.model_dir)
            self.user = None

    # --- readiness ---

    def ready_check(self) -> str:
        """The model's optional `is_ready()`, asked when a client asks whether the model is
        ready: "" when it is, else why not (Triton's texts; host.core logs them)."""
        user = self.user
        fn = getattr(user, "is_ready", None) if user is not None else None
        if fn is None:
            return ""
        return self._readiness.check(lambda: self._call_is_ready(fn))

    def _call_is_ready(self, fn: Any) -> tuple[bool, str]:
        """(ready, error) of one `is_ready()` call, as Triton's stub judges its result."""
        token = pb_utils._ACTIVE.set(self.ctx)
        try:
            result = fn()
            if asyncio.iscoroutine(result):
                result = self._run_coroutine(result)
        except Exception as exc:  # noqa: BLE001 - the model's failure means "not ready"
            return False, _exception_text(exc, self.ctx.model_dir)
        finally:
            pb_utils._ACTIVE.reset(token)
        if not isinstance(result, bool):
            return False, "is_ready() must return a boolean value"
        return result, ""

    # --- execute ---

    def execute(self, requests: Sequence[HostRequest]) -> Sequence[HostResponse] | None:
        states, pb_requests = [], []  # loops, not comprehensions: a batch is often one request
        new_state = _RequestState.__new__
        for r in requests:
            state = new_state(_RequestState)  # __init__ inlined: this runs for every request
            state.instance, state.request = self, r
            state.pb_request = pb = self._wrap_request(r)
            states.append(state)
            pb_requests.append(pb)
        try:
            execute = getattr(self.user, "execute", None)
            if execute is None:
                raise _StubError(
                    f"Python model {self.model.path} does not implement `execute` method.")
            token = pb_utils._ACTIVE.set(self.ctx)  # not a context manager: this is per request
            try:
                with _running(self.ctx.model_dir):
                    result = execute(pb_requests)
            finally:
                pb_utils._ACTIVE.reset(token)
            if type(result) is not list and asyncio.iscoroutine(result):
                if self.decoupled:
                    self._run_in_background(result, states)
                    return None
                result = self._run_coroutine(result)
            responses = self._collect(result, states)
        except BaseException as exc:  # noqa: BLE001 - even sys.exit() fails only these requests
            if self.exit_ends_process and isinstance(exc, SystemExit):
                raise  # in a stub process (process mode) it ends the stub, as in Triton
            self._fail_all(states, exc)
            return None
        for s in states:  # most requests are released plainly: no call for them
            if s.pb_request._release_flags != pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL:
                self._reschedule(states)
                break
        return responses

    def _reschedule(self, states: list[_RequestState]) -> None:
        """Requests the model released with RESCHEDULE run again (host.sequence.batcher); one the
        host cannot take back is answered with the reason, as it would get no answer otherwise."""
        for s in states:
            if s.pb_request._release_flags != pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
                continue
            why = ("Request rescheduling (TRITONSERVER_REQUEST_RELEASE_RESCHEDULE) is not "
                   "supported for python models in process mode") if self.exit_ends_process \
                else s.request.reschedule()
            if why:
                log.error("Failed to release request: %s", why)
                s.fail(why)

    def _fail_all(self, states: list[_RequestState], exc: BaseException) -> None:
        """The model raised: every request still waiting gets Triton's error text."""
        message = (f"Failed to process the request(s) for model '{self.name}', message: "
                   f"{_exception_text(exc, self.ctx.model_dir)}")
        log.error("%s\n%s", message, traceback.format_exc())
        for s in states:
            s.fail(message)

    def _collect(self, result: Any, states: list[_RequestState]) -> list[HostResponse] | None:
        """Check what execute returned; the host responses to return, or None if sent here."""
        if self.decoupled:
            if result is not None:
                raise _StubError(
                    f"Python model '{self.name}' is using the decoupled mode and the execute "
                    "function must return None.")
            return None
        if result is None:
            result = [None] * len(states)
        if not isinstance(result, (list, tuple)):
            raise _StubError(
                f"Expected a list in the execute return, found type '{type(result)}'.")
        if len(result) != len(states):
            raise _StubError(
                "Number of InferenceResponse objects do not match the number of InferenceRequest "
                f"objects. InferenceRequest(s) size is:{len(states)}, and InferenceResponse(s) "
                f"size is:{len(result)}\n")
        reschedule = pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
        fast = True  # every request answered by the return value, no sender used
        for response, s in zip(result, states):
            pb = s.pb_request
            if response is None:
                fast = False
                continue
            if pb._release_flags == reschedule:
                raise _StubError(
                    "Expected a None object in the execute function return list for reschduled "
                    f"request, found type '{type(response)}'.")  # (Triton's spelling)
            if type(response) is not pb_utils.InferenceResponse \
                    and not isinstance(response, pb_utils.InferenceResponse):
                raise _StubError(
                    "Expected an 'InferenceResponse' object in the execute function return list, "
                    f"found type '{type(response)}'.")
            if pb._sender is not None and pb._sender._sent:
                fast = False
        if fast:
            for s in states:
                pb = s.pb_request
                pb._sender_closed = True  # a sender made from now on comes closed; then the
                sender = pb._sender  # one made already (the order matters: _response_sender)
                if sender is not None:
                    sender._close()
            # a padding row's response goes nowhere: not converted (most rows of a direct
            # sequence batch are padding)
            converted = []
            for r, s in zip(result, states):
                converted.append(_DROPPED if s.request.padding else self._convert(r, s.request))
            return converted
        for response, s in zip(result, states):
            if response is not None:
                s.sender.send(response, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            elif s.pb_request._release_flags == reschedule:
                continue  # it runs again (_reschedule)
            elif s.sender._taken:
                # As in Triton, the model may still answer with the sender it took (the request's
                # response factory) from another thread; one that never does leaves the request
                # waiting, as in Triton.
                s.request.factory_held = True
            elif not s.sender._is_closed():
                s.fail(f"Python model '{self.name}' returned no response for request "
                       f"'{s.request.id}' and did not send its final response with the response "
                       "sender before execute returned.")
        return None

    # --- async execute ---

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, daemon=True,
                                      name=f"python-model-{self.name}-loop")
            thread.start()
            self._loop, self._loop_thread = loop, thread
        return self._loop

    def _run_coroutine(self, coro: Any) -> Any:
        ctx = self.ctx
        held = bls.HELD.get()  # this execute's instance: BLS calls the coroutine makes hold it

        async def run() -> Any:
            pb_utils._ACTIVE.set(ctx)
            bls.HELD.set(held)
            return await coro

        return asyncio.run_coroutine_threadsafe(run(), self._ensure_loop()).result()

    def _run_in_background(self, coro: Any, states: list[_RequestState]) -> None:
        ctx = self.ctx

        async def run() -> None:
            pb_utils._ACTIVE.set(ctx)
            try:
                await coro
            except Exception as exc:
                self._fail_all(states, exc)

        asyncio.run_coroutine_threadsafe(run(), self._ensure_loop())

    def _stop_loop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._loop_thread is not None:
                self._loop_thread.join(timeout=5)
            self._loop = self._loop_thread = None

    # --- conversions ---

    @contextmanager
    def _active(self) -> Iterator[None]:
        token = pb_utils._ACTIVE.set(self.ctx)
        try:
            with _running(self.ctx.model_dir):
                yield
        finally:
            pb_utils._ACTIVE.reset(token)

    def _wrap_request(self, request: HostRequest) -> pb_utils.InferenceRequest:
        outputs = request.outputs
        requested = [o.name for o in outputs] if outputs else list(self.model.output_names)
        flags = 0
        if request.sequence_start:
            flags |= pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
        if request.sequence_end:
            flags |= pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
        # Reserved parameters were moved into request fields by the host (host.parameters).
        params = request.parameters
        spec = self.model.spec
        return pb_utils.InferenceRequest._incoming(
            request.id, request.sequence_id, pb_utils._borrowed_inputs(request.inputs, _on_host),
            requested, spec.name, spec.version, flags, request.timeout_us,
            json.dumps(params, default=str) if params else "{}", request.is_cancelled,
            partial(_make_sender, self, request))

    def _base_response(self, request: HostRequest) -> HostResponse:
        return HostResponse(model_name=self.model.spec.name,
                            model_version=str(self.model.spec.version), id=request.id)

    def _error_response(self, error: HostError, request: HostRequest) -> HostResponse:
        response = self._base_response(request)
        response.error = error
        return response

    def _convert(self, response: pb_utils.InferenceResponse, request: HostRequest) -> HostResponse:
        """A model's pb_utils.InferenceResponse as the host's response (an error response if invalid)."""
        err: Any = response._err
        if err is not None:
            error = error_for(_host_code(err.code()), err.message())
            # Triton's python backend reports a request that got an error response, rather
            # than an exception from execute, as a success in its statistics (checked on 2.51)
            error.counted_as_success = True  # type: ignore[attr-defined]
            return self._error_response(error, request)
        spec = self.model.spec
        host = HostResponse(spec.name, str(spec.version), request.id, [])
        raw = response._parameters
        if raw and raw != "{}":  # most responses carry none: skip the JSON parse
            try:
                host.parameters = json.loads(raw)
            except ValueError:
                pass
        outputs = request.outputs
        requested = {o.name for o in outputs} if outputs else None
        # Implicit state: an output named after a state is kept for the sequence batcher.
        states = request.sequence_states.by_output if request.sequence_states is not None else ()
        tensors = host.outputs
        for tensor in response._output_tensors:
            name = tensor._name
            if requested is not None and name not in requested and name not in states:
                continue
            # As Triton's python backend: the tensor goes out with its own datatype, whatever
            # the configuration says (its L0_http test_0_dimension_output sends FP64 for STRING).
            datatype = tensor._datatype
            data = tensor._array
            if datatype == "BYTES":
                data = pb_utils._as_bytes_object_array(data)
            tensors.append(HostTensor(name, datatype, list(data.shape), data))
        return host


_DROPPED = HostResponse()  # stands for a padding row's response (never delivered, never read)


def _on_host(data: Any) -> Any:
    """Python models get inputs in CPU memory, as Triton's python backend gives them by default
    (FORCE_CPU_ONLY_INPUT_TENSORS): a device array (CUDA shared memory) is copied to the host."""
    if type(data) is np.ndarray:  # the common case, without a failed attribute lookup
        return data
    if hasattr(data, "__cuda_array_interface__"):
        return data.get()  # cupy: the host's device arrays are cupy arrays (host.shm.cuda)
    return data
