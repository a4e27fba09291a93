"""`Host`: the single facade both front ends call (health, metadata, infer, repository, stats).

No wire format lives here and no business rule lives anywhere else: the front ends turn their
requests into `host.inference` types, call one method, and map `HostError.code` to a status.
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

from host import (__version__, affinity, bls, datatypes, devices, headers, logsettings, overrides, shm, storage,
                  validation)
from host import config as config_mod
from host.backends_pool import BackendPool
from host.cache.service import CacheService, load_response_cache
from host.ensemble import EnsembleRuntime
from host.errors import (HostError, InternalError, UnsupportedError,
                         InvalidArgumentError, UnavailableError, error_for, poll_failure)
from host.latency import parse_metrics_config
from host.inference import InferenceRequest, InferenceResponse, ResponseCallback, drain
from host.manager import ModelManager
from host.namespacing import NamespacedModelManager
from host.model import READY, ModelVersion
from host.native import backend as native_backend
from host.options import CONTROL_MODES, ServerOptions
from host.plugins import Plugins, get_plugin_manager
from host.proto import model_config_pb2
from host.rate_limiter import RateLimiter
from host.scheduler import submit_deferrable
from host.stages import Stages
from host.trace import TraceManager

log = logging.getLogger(__name__)

SERVER_NAME = "modelhost"
# Server metadata's extensions, in Triton's order (core server.cc); the shared-memory ones go
# between the two halves when client shared memory is on (host.shm).
EXTENSIONS = ["classification", "sequence", "model_repository", "model_repository(unload_dependents)",
              "schedule_policy", "model_configuration"]
EXTENSIONS_AFTER_SHM = ["binary_tensor_data", "parameters", "statistics", "generate", "trace",
                        "logging"]


class Host:
    def __init__(self, options: ServerOptions | None = None, plugins: Plugins | None = None) -> None:
        self.options = options or ServerOptions()
        if self.options.model_control_mode not in CONTROL_MODES:
            raise InvalidArgumentError(
                f"unknown model control mode '{self.options.model_control_mode}' "
                f"(expected one of {', '.join(CONTROL_MODES)})")
        try:
            affinity.configure(self.options.python_cpu)  # before any thread of ours starts
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None
        devices.configure(self.options.min_supported_compute_capability)  # before any config
        self.plugins = plugins or get_plugin_manager(self.options.blocked_plugins)
        self.backends = BackendPool(self.plugins.registry, self.options.backend_directory,
                                    native_loader=native_backend.loader(self.options.backend_directory),
                                    config=_backend_settings(self.options))
        # The response cache (None without --cache-config); see host.stages for where it is used.
        self.cache: CacheService | None = load_response_cache(
            self.options.cache_config, self.options.cache_directory, self.plugins.registry)
        opts = self.options
        self.ensembles = EnsembleRuntime(self)  # ensemble steps: requests the host sends itself
        manager_type = NamespacedModelManager if opts.model_namespacing else ModelManager
        # Cloud repositories are served from local copies (host.storage), made here, filled by
        # the manager's first scan.
        self.repositories = storage.Repositories(opts.model_repositories)
        self.manager = manager_type(self.repositories.roots, self.backends,
                                    opts.model_control_mode, self._on_model_state,
                                    auto_complete=not (opts.disable_auto_complete_config
                                                       or opts.strict_model_config),
                                    config_name=opts.model_config_name,
                                    load_threads=opts.model_load_thread_count,
                                    ensembles=self.ensembles,
                                    unload_wait=opts.exit_timeout_secs,
                                    load_retries=opts.model_load_retry_count,
                                    storage=self.repositories)
        self.latency_config = parse_metrics_config(self.options.metrics_config)
        if self.latency_config.any:
            self.manager.latency_config = self.latency_config
        self.manager.repoagent_directory = opts.repoagent_directory
        if opts.rate_limit == "execution_count":  # Triton's rate limiter (host.rate_limiter)
            self.manager.rate_limiter = RateLimiter(opts.rate_limit_resources)
        self.shm = shm.SharedMemoryManager(self.options.allow_client_shm)
        self.journal: Any = None  # host.supervise.Journal in a supervised worker
        self._ready = False
        self._init_failed = False  # start() found no model repository (serve_without_repository)
        self._stopping = threading.Event()
        self._poller: threading.Thread | None = None
        # Tracing: the request path checks `self.tracing` only; the manager keeps it up to date.
        self.tracer = TraceManager(self.options.trace)
        self.tracing = self.tracer.active
        self.tracer.on_change = self._tracing_changed
        # Header forwarding (host.headers): None unless a pattern was given.
        # In OpenTelemetry trace mode they also take the W3C trace context (traceparent).
        otel = self.tracer.mode == "opentelemetry"
        self.http_header_forwarder = headers.forwarder(self.options.http_header_forward_pattern, otel)
        self.grpc_header_forwarder = headers.forwarder(self.options.grpc_header_forward_pattern, otel)
        # Streams run their scheduler call here so responses reach the client while execute runs.
        self._stream_pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="stream")

    # --- start and stop ------------------------------------------------------------------------
    def start(self) -> dict[str, str]:
        """Load the initial models for the control mode; returns load errors by model name.

        With `exit_on_error`, any load error is raised instead (after unloading what loaded).
        """
        try:
            return self._start()
        except BaseException:
            self.repositories.close()  # a worker that fails to start exits without stop()
            raise

    def _start(self) -> dict[str, str]:
        opts = self.options
        bls.attach(self)  # models' own requests (BLS) come here
        missing = [root for root in opts.model_repositories
                   if not storage.is_remote(root) and not Path(root).is_dir()]
        unreadable = False
        try:
            self.repositories.sync()  # a cloud repository that cannot be read stops the start
        except HostError as exc:
            if not opts.serve_without_repository:
                raise
            log.error("%s", exc)
            unreadable = True
        if (missing or unreadable) and opts.serve_without_repository:
            # Triton with --exit-on-error=false: the server failed to initialize but keeps its
            # endpoints up, not live and not ready, and loads no model.
            for root in missing:
                log.error("Internal: failed to stat file %s", root)
            self._init_failed = True
            return {}
        if opts.model_control_mode == "explicit":
            errors = self.manager.load_all(opts.load_models) if opts.load_models else {}
        else:
            errors = self.manager.load_all()
        for name, reason in errors.items():
            log.error("failed to load '%s': %s", name, reason)
        if errors and opts.exit_on_error:
            self.manager.unload_all()
            raise UnavailableError("failed to load all models: " +
                                   "; ".join(f"'{n}': {r}" for n, r in errors.items()))
        if opts.model_control_mode == "poll":
            self._poller = threading.Thread(target=self._poll_loop, name="repository-poll", daemon=True)
            self._poller.start()
        self._ready = True
        self.plugins.manager.hook.modelhost_startup(host=self)
        return errors

    def stop(self, exit_timeout: int | None = None) -> bool:
        """Refuse new work, let in-flight requests finish, finalize every model.

        `exit_timeout` (the server's shutdown: what its front ends left of --exit-timeout-secs):
        wait as Triton's InferenceServer::Stop does, with its countdown lines, for the
        inferences in flight, then for the unloads; False when the time ran out first (the
        caller then exits at once, as Triton does: nothing more is waited for)."""
        if self._stopping.is_set():
            return True
        self._ready = False
        self._stopping.set()
        if self._poller is not None:
            self._poller.join()
        if exit_timeout is None:
            self.manager.unload_all()
        elif not self._wait_and_unload(exit_timeout):
            return False
        self.ensembles.close()
        bls.detach(self)
        self.shm.close()  # unmaps only: the clients' regions stay as they are
        self._stream_pool.shutdown(wait=True)
        if self.cache is not None:
            self.cache.close()
        self.tracer.close()  # after the last request: its traces are written or exported
        self.repositories.close()  # the local copies of cloud repositories
        self.plugins.manager.hook.modelhost_shutdown(host=self)
        return True

    def _wait_and_unload(self, seconds: int) -> bool:
        """Triton's shutdown wait (core server.cc Stop): a line a second while versions have
        inferences in flight, then the unloads, a line a second until none is left."""
        log.info("Waiting for in-flight requests to complete.")
        left = max(int(seconds), 0)
        unloading = False
        tick = threading.Event()
        while True:
            if not unloading:
                status = self.manager.inflight_status()
                log.info("Timeout %d: Found %d model versions that have in-flight inferences",
                         left, len(status))
                for name, version, count in status:
                    log.info("Model '%s' (version %d) has %d in-flight inferences",
                             name, version, count)
                if not status:
                    self.manager.unload_all(wait=False)
                    unloading = True
                    log.info("All models are stopped, unloading models")
                    continue
                done = lambda: not self.manager.inflight_status()  # noqa: E731
            else:
                live = self.manager.live_versions()
                log.info("Timeout %d: Found %d live models and %d in-flight non-inference "
                         "requests", left, live, 0)
                if not live:
                    return True
                done = lambda: not self.manager.live_versions()  # noqa: E731
            if left <= 0:
                if not unloading:  # what is stuck ends with the process; the rest unloads
                    self.manager.unload_all(wait=False)
                break
            left -= 1
            for _ in range(20):  # a second, ended early once what it waits for is done
                if done():
                    break
                tick.wait(0.05)
        log.error("failed to stop server: Internal - Exit timeout expired. Exiting immediately.")
        return False

    def _poll_loop(self) -> None:
        while not self._stopping.wait(self.options.repository_poll_secs):
            try:
                self.manager.poll()
            except Exception:
                log.exception("repository poll failed")

    def _on_model_state(self, name: str, version: int, state: str, reason: str) -> None:
        self.plugins.manager.hook.modelhost_model_state(name=name, version=version, state=state,
                                                        reason=reason)

    # --- health and metadata -------------------------------------------------------------------
    def live(self) -> bool:
        return not self._stopping.is_set() and not self._init_failed

    def ready(self) -> bool:
        if not self._ready:
            return False
        return not self.options.strict_readiness or self.manager.all_ready()

    def server_metadata(self) -> dict[str, Any]:
        return {"name": self.options.server_id or SERVER_NAME, "version": __version__,
                "extensions": EXTENSIONS + self.shm.extensions() + EXTENSIONS_AFTER_SHM}

    def model_ready(self, name: str, version: str = "") -> bool:
        """Whether the version serves; a version that is no number is Triton's error, raised."""
        number = _version(version)
        try:
            mv = self.manager.get(name, number)
        except HostError:
            return False
        # A backend's own readiness check per instance (Triton's TRITONBACKEND_ModelInstanceReady:
        # the python backend's stub health and the model's is_ready()).
        for slot in mv.slots:
            check = getattr(slot.instance, "ready_check", None)
            why = check() if check is not None else ""
            if why:
                log.error("Model '%s' version %s is not ready: %s", name, mv.version, why)
                return False
        return True

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        mv = self.manager.get(name, _version(version))
        entry = self.manager.entry(name)
        cfg = mv.config
        batch = [-1] if cfg.max_batch_size > 0 else []

        def tensors(items) -> list[dict[str, Any]]:
            return [{"name": t.name,
                     "datatype": datatypes.from_config_enum(t.data_type),
                     "shape": batch + list(t.dims)} for t in items]

        return {
            "name": name,
            "versions": [str(v.version) for v in reversed(entry.ready_versions())] if entry else [],
            "platform": cfg.platform or cfg.backend,
            "inputs": tensors(cfg.input),
            "outputs": tensors(cfg.output),
        }

    def model_config(self, name: str, version: str = "") -> model_config_pb2.ModelConfig:
        return self.manager.get(name, _version(version)).config

    def model_config_json(self, name: str, version: str = "") -> dict[str, Any]:
        return config_mod.config_to_json(self.model_config(name, version))

    # --- inference -----------------------------------------------------------------------------
    def infer(self, request: InferenceRequest, timeout: float | None = None,
              endpoint: str = "HTTP end point") -> InferenceResponse:
        """Unary inference; a response that carries an error is raised as that error."""
        finished: queue.SimpleQueue = queue.SimpleQueue()  # C-level, cheap to make per request
        self._infer_async(request, finished.put, endpoint, False)  # it waits: nothing deferred
        try:
            result = finished.get(timeout=timeout)  # the direct scheduler has usually finished already
        except queue.Empty:
            request.cancel()
            raise UnavailableError("inference request timed out") from None
        if isinstance(result, BaseException):
            raise result
        return result

    def infer_async(self, request: InferenceRequest,
                    done: Callable[[InferenceResponse | HostError], None],
                    endpoint: str = "HTTP end point") -> None:
        """Unary inference that does not wait: `done(response or error)` runs once, on the
        thread that finished the request. Errors found before scheduling are raised here. On a
        front end's event loop (host.scheduler.open_deferral) the execute may wait for the end
        of the loop's round of events, to share it with the requests that came with this one."""
        self._infer_async(request, done, endpoint, True)

    def _infer_async(self, request: InferenceRequest,
                     done: Callable[[InferenceResponse | HostError], None],
                     endpoint: str, deferrable: bool) -> None:
        mv = self.manager.get(request.model_name, request.model_version)
        if mv.decoupled:
            raise UnsupportedError(f"{endpoint} doesn't support models with decoupled transaction policy")
        got: list[InferenceResponse] = []

        def collect(response: InferenceResponse | None, final: bool) -> None:
            if response is not None:
                got.append(response)
            if final:
                if not got:
                    done(InternalError(f"model '{mv.name}' sent no response for the request"))
                else:
                    done(got[-1].error or got[-1])

        run = (mv.stages or Stages.of(self, mv)).run  # `_submit`, inlined: once per request
        if deferrable:
            submit_deferrable(run, request, collect)
        else:
            run(request, collect)

    def infer_stream(self, request: InferenceRequest) -> Iterator[InferenceResponse]:
        """Yield each response as it comes (final included when it carries data); closing early
        cancels the request."""
        mv = self.manager.get(request.model_name, request.model_version)
        responses: queue.SimpleQueue = queue.SimpleQueue()
        stages = Stages.of(self, mv)
        hit = stages.start(request, lambda r, final: responses.put((r, final)))
        if hit is not None:
            request.respond(hit, True)  # from the response cache: nothing is scheduled
        else:
            self._stream_pool.submit(stages.schedule, request)
        return drain(request, responses)

    def submit(self, request: InferenceRequest, callback: ResponseCallback) -> None:
        """Validate and schedule; `callback(response | None, final)` gets every response (the
        execute may be deferred as in `infer_async`)."""
        self._submit(self.manager.get(request.model_name, request.model_version), request, callback,
                     True)

    def _submit(self, mv: ModelVersion, request: InferenceRequest, callback: ResponseCallback,
                deferrable: bool = False) -> None:
        run = (mv.stages or Stages.of(self, mv)).run
        if deferrable:
            submit_deferrable(run, request, callback)
        else:
            run(request, callback)

    # --- repository ----------------------------------------------------------------------------
    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return self.manager.index(ready_only)

    def load_model(self, name: str, config: str | None = None,
                   files: dict[str, bytes] | None = None) -> None:
        """Load (or reload) a model, optionally with a config override and its own files."""
        self.manager.check_control_allowed()
        overrides.check_model_name(name)
        try:
            folder = None
            if files:
                try:
                    if config is None:
                        raise InvalidArgumentError(overrides.CONFIG_REQUIRED)
                    folder = overrides.write(name, files, self.options.http_max_input_size)
                except HostError as exc:  # Triton writes the override files when it polls
                    raise poll_failure(exc) from None
            self.manager.load(name, config, override_dir=folder)  # removes an unused folder
        except HostError as exc:
            if exc.poll_failure:
                # Triton's answer when it cannot read the model's folder, configuration or
                # override files (model_repository_manager.cc): INTERNAL and this text, which its
                # clients and QA tests check, with the cause in the server's log.
                log.error("Poll failed for model directory '%s': %s", name, exc.message)
                raise InternalError(
                    f"failed to load '{name}', failed to poll from model repository") from None
            if (config is None and not files) or exc.message.startswith(
                    ("failed to load", "load failed for model")):  # Triton's texts already
                raise
            # Triton reports a load with overrides that fails as "failed to load '<name>' ...".
            raise error_for(exc.code, f"failed to load '{name}': {exc.message}") from None
        if self.journal is not None:  # a restarted worker loads it again (host.supervise)
            if files:  # its files are not kept: after a crash it is not loaded again
                self.journal.model_unloaded(name)
            else:
                self.journal.model_loaded(name, config)

    def load_model_from(self, name: str, root: str, folder: str) -> None:
        """Load model `name` from `root/folder`, serving `root`'s other models too (an ensemble's
        steps): SageMaker's multi-model endpoint. `root` stays registered until
        `unload_model_from`; a failed load unregisters it again."""
        self.manager.check_control_allowed()
        self.manager.register_repository(Path(root), {folder: name})
        try:
            self.load_model(name)
        except BaseException:
            self.manager.unregister_repository(Path(root))
            raise

    def unload_model_from(self, name: str, root: str) -> None:
        """Undo `load_model_from`: unload `name` and what it loaded, forget `root`."""
        self.manager.check_control_allowed()
        try:
            self.unload_model(name, unload_dependents=True)
        finally:
            self.manager.unregister_repository(Path(root))

    def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        self.manager.check_control_allowed()
        self.manager.unload(name, unload_dependents)
        if self.journal is not None:
            self.journal.model_unloaded(name)

    # --- statistics ----------------------------------------------------------------------------
    def statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        if not name:
            versions = self.manager.loaded()
        else:
            # Triton's rules and texts (TRITONSERVER_ServerModelStatistics): the model's READY
            # versions, and a bad name or version is an invalid argument, not "not found".
            entry = self.manager.entry(name)
            versions = [v for v in entry.versions.values() if v.state == READY] if entry else []
            if not versions:
                raise InvalidArgumentError(f"requested model '{name}' is not available")
            if version not in ("", -1):
                number = _version(version)
                versions = [v for v in versions if v.version == number]
                if not versions:
                    raise InvalidArgumentError(
                        f"requested model version is not available for model '{name}'")
        for v in versions:
            v.collect_response_statistics()
        return {"model_stats": [v.stats.as_dict() for v in
                                sorted(versions, key=lambda v: (v.name, v.version))]}

    # --- trace and logging extensions ----------------------------------------------------------
    def _tracing_changed(self, active: bool) -> None:
        self.tracing = active

    def trace_setting(self, model: str = "", changes: dict[str, Any] | None = None) -> dict[str, Any]:
        """Triton's trace extension: the effective setting of `model` (or the global one), after
        applying `changes` (setting -> text value, a list for trace_level, None to clear)."""
        if model:
            try:
                self.manager.get(model, _version(""))
            except HostError:
                raise InvalidArgumentError(f"Request for unknown model : {model}") from None
        if changes:
            return self.tracer.update(model, changes)
        return self.tracer.get(model)

    def log_settings(self, changes: dict[str, Any] | None = None,
                     format_name: str = "log_format") -> dict[str, Any]:
        """Triton's logging extension: the log settings, after applying `changes`
        (`format_name`: see host.logsettings.update)."""
        if changes:
            return logsettings.update(changes, format_name)
        return logsettings.current().as_dict()


def _backend_settings(options: ServerOptions) -> dict[str, dict[str, str]]:
    """--backend-config settings by backend; with auto-complete off, backends are told so."""
    settings = {name: dict(values) for name, values in options.backend_config.items()}
    if options.disable_auto_complete_config or options.strict_model_config:
        settings.setdefault("", {}).setdefault("auto-complete-config", "false")
    return settings


def _version(version: str | int) -> int:
    """'' or -1 mean the default version; anything else must be a non-negative integer
    (host.validation.parse_version, with Triton's texts)."""
    if version in ("", None, -1):
        return -1
    if type(version) is int and version >= 0:
        return version
    return validation.parse_version(str(version))
