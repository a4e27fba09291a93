"""The model manager: repository state, control modes (none, explicit, poll), load and unload.

Repository actions are serialized by one lock, which a load asked for on its own lets go of while
its versions load (loads of different models run in parallel, as in Triton); loads and unloads of
one model never overlap (`_claim`). The request path only reads `self._models` (a dict swapped by
assignment), so a load never blocks inference on other models.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from host import config as config_mod
from host import affinity, overrides, paths, repository, supervise
from host.backend import ModelSpec
from host.backends_pool import BackendPool
from host.ensemble import EnsembleVersion
from host.ensemble.control import Dependencies, composing_of
from host.ensemble.scheduler import StepRunner
from host.errors import (AlreadyExistsError, HostError, InternalError, InvalidArgumentError,
                         NotFoundError, UnavailableError, poll_failure, state_reason)
from host.latency import LatencyConfig, LatencyRecorder, for_model
from host.model import READY, UNAVAILABLE, ModelVersion
from host.proto import model_config_pb2
from host.rate_limiter import RateLimiter

if TYPE_CHECKING:
    from host.storage import Repositories

log = logging.getLogger(__name__)
# Verbose level 2 (host.logsettings): Triton's traces of its model lifecycle, which its QA greps.
VERBOSE_2 = logging.DEBUG - 1

StateListener = Callable[[str, int, str, str], None]


@dataclass
class ModelEntry:
    """Everything known about one model name."""

    name: str
    location: repository.ModelLocation | None = None
    _versions: dict[int, ModelVersion] = field(default_factory=dict)
    newest_first: list[ModelVersion] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)  # version -> reason
    error: str = ""  # a failure before any version could be tried (config, backend)
    poll_failed: bool = False  # `error` came from polling: to requests the model is unknown
    # Triton's lifecycle map (requests' error texts): a load got past polling, and the versions
    # it tried; both kept after an unload.
    in_lifecycle: bool = False
    known_versions: set[int] = field(default_factory=set)
    # The config override of the last load: a load without one reuses it while the model's
    # files are unchanged since (Triton keeps the loaded config then).
    config_override: str | dict | None = None
    fingerprint: tuple = ()
    unloaded: bool = False
    override_dir: Path | None = None  # the private folder of a load with file overrides
    agents: Any = None  # the repository agents of the loaded model (host.native.repoagent)
    explicit: bool = False  # loaded on request, not only as a composing model of an ensemble
    waiting_on: set[str] = field(default_factory=set)  # unloaded composing models (ensembles)
    # Versions being unloaded: they finish their requests in flight first (ModelManager.unload).
    unloading: dict[int, ModelVersion] = field(default_factory=dict)

    def ready_versions(self) -> list[ModelVersion]:
        return [v for v in self.newest_first if v.state == READY]

    @property
    def versions(self) -> dict[int, ModelVersion]:
        return self._versions

    @versions.setter
    def versions(self, value: dict[int, ModelVersion]) -> None:
        # Kept sorted once per change, so picking the default version costs no sort per request.
        self._versions = value
        self.newest_first = sorted(value.values(), key=lambda v: v.version, reverse=True)

    def default_version(self) -> ModelVersion | None:
        for v in self.newest_first:
            if v.state == READY:
                return v
        return None


class ModelManager:
    def __init__(self, roots: list[Path], backends: BackendPool, mode: str = "none",
                 on_state: StateListener | None = None, *, auto_complete: bool = True,
                 config_name: str = "", load_threads: int = 1,
                 ensembles: StepRunner | None = None, unload_wait: float = 30.0,
                 load_retries: int = 0, storage: Repositories | None = None) -> None:
        self.roots = [Path(r) for r in roots]
        # Cloud repositories (host.storage): `roots` holds their local copies, which `_sync`
        # brings up to date before each scan; messages name them by the path the user gave.
        self.storage = storage
        self.labels: dict[Path, str] = storage.labels if storage is not None else {}
        # Repositories registered while serving (SageMaker's multi-model endpoint), each with
        # its subfolder -> model name mapping (Triton's RegisterModelRepository).
        self.mappings: dict[Path, dict[str, str]] = {}
        self.repoagent_directory: Path | None = None  # --repoagent-directory
        self._repo_agents: Any = None  # host.native.repoagent.AgentRegistry, made on first use
        self.unload_wait = unload_wait  # seconds an unload waits for requests in flight
        self.load_retries = max(0, load_retries)  # --model-load-retry-count
        self._finishers: dict[ModelVersion, threading.Thread] = {}  # versions being unloaded
        self.backends = backends
        self.mode = mode
        self.auto_complete = auto_complete  # off: --disable-auto-complete-config
        self.config_name = config_name  # --model-config-name
        self.load_threads = max(1, load_threads)  # --model-load-thread-count
        self._on_state = on_state or (lambda *a: None)
        self._models: dict[str, ModelEntry] = {}
        self._lock = threading.RLock()
        self.latency_config: LatencyConfig | None = None  # set by the host (--metrics-config)
        self.rate_limiter: RateLimiter | None = None  # set by the host (--rate-limit)
        self.ensembles = ensembles  # how ensemble steps reach their models (host.ensemble)
        self._deps = Dependencies(self)  # ensembles and their composing models
        self._pass: set[str] | None = None  # models loaded by the running load_all
        # Finishers of versions a reload replaced, waited for (a bounded time) only once the
        # repository lock is released: a replaced version stuck in execute must not hold up the
        # index, loads or polling of other models.
        self._replaced: list[threading.Thread] = []
        # Models removed from the repository while polling, with the versions Triton had tried:
        # requests for them are answered as Triton does (_request_error).
        self._retired: dict[str, set[int]] = {}
        self._duplicated: dict[str, str] = {}  # names found in several repositories (last scan)
        self._local = threading.local()  # .loading: this thread is inside _locked()
        # Models a load or unload is working on, by name: (thread, depth). Loads of different
        # models run in parallel (a load lets go of the repository lock while its versions load,
        # see _unlocked); loads and unloads of one model run one at a time (_claim).
        self._busy: dict[str, tuple[int, int]] = {}
        self._busy_cond = threading.Condition(self._lock)

    # --- request path ------------------------------------------------------------------------
    def get(self, name: str, version: int = -1) -> ModelVersion:
        """The READY version a request should use, or Triton's error."""
        entry = self._models.get(name)
        if entry is not None:
            if version < 0:
                mv = entry.default_version()
                if mv is not None:
                    return mv
            else:
                mv = entry.versions.get(version)
                if mv is not None and mv.state == READY:
                    return mv
        raise self._request_error(name, version, entry)

    def _request_error(self, name: str, version: int, entry: ModelEntry | None) -> HostError:
        """Triton's answer (model_lifecycle.cc, GetModel): a model it ever tried to load (its
        versions, even unloaded or failed, or removed from the repository since) has "no
        available versions"; one it never did "is not found"; so is a version it never tried."""
        if entry is not None:
            known = entry.known_versions.union(entry.versions, entry.failed, entry.unloading)
            in_lifecycle = entry.in_lifecycle or bool(known)
        else:
            retired = self._retired.get(name)
            known, in_lifecycle = retired or set(), retired is not None
        if not in_lifecycle:
            return NotFoundError(f"Request for unknown model: '{name}' is not found")
        if version < 0:
            return NotFoundError(f"Request for unknown model: '{name}' has no available versions")
        if version not in known:
            return NotFoundError(f"Request for unknown model: '{name}' version {version} is not found")
        return UnavailableError(
            f"Request for unknown model: '{name}' version {version} is not at ready state")

    def entry(self, name: str) -> ModelEntry | None:
        return self._models.get(name)

    def loaded(self) -> list[ModelVersion]:
        return [v for e in list(self._models.values()) for v in e.versions.values()]

    def all_ready(self) -> bool:
        """Triton's strict readiness: every model a load was asked for has its versions READY
        (a version that is unavailable because it was unloaded does not count)."""
        for entry in list(self._models.values()):
            if entry.unloaded or entry.poll_failed:  # a model that failed to poll is not known
                continue
            versions = entry.versions
            if entry.error and not versions:
                return False
            # unloaded versions do not count, an ensemble's whose composing model was unloaded
            # neither ("unloaded: its composing model ..."; L0_lifecycle's concurrent unloads)
            if any(v not in versions and not reason.startswith("unloaded")  # a failed reload
                   for v, reason in entry.failed.items()):                 # keeps its version
                return False
            if any(v.state != READY and not v.reason.startswith("unloaded")
                   for v in versions.values()):
                return False
        return True

    # --- repository index ----------------------------------------------------------------------
    def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        with self._lock:
            self._refresh_locations()
            rows: list[dict[str, Any]] = []
            for name in sorted(self._models):
                entry = self._models[name]
                if name in self._duplicated and not entry.versions:  # Triton's index entry
                    rows.append({"name": name, "state": UNAVAILABLE,
                                 "reason": "model appears in two or more repositories"})
                    continue
                rows.extend(self._index_rows(entry))
        if ready_only:
            rows = [r for r in rows if r.get("state") == READY]
        return rows

    @staticmethod
    def _index_rows(entry: ModelEntry) -> list[dict[str, Any]]:
        rows = []
        for v in sorted(entry.versions.values(), key=lambda v: v.version):
            row: dict[str, Any] = {"name": entry.name, "version": str(v.version), "state": v.state}
            if v.reason:
                row["reason"] = v.reason
            rows.append(row)
        for v in sorted(entry.unloading.values(), key=lambda v: v.version):
            if v.version not in entry.versions:  # listed until its requests finished
                rows.append({"name": entry.name, "version": str(v.version), "state": v.state})
        for version, reason in sorted(entry.failed.items()):
            if version not in entry.versions and version not in entry.unloading:
                rows.append({"name": entry.name, "version": str(version), "state": UNAVAILABLE,
                             "reason": reason})
        if not rows:
            row = {"name": entry.name}
            if entry.error or entry.unloaded:
                row.update(state=UNAVAILABLE, reason=entry.error or "unloaded")
            rows.append(row)
        return rows

    def _scan(self) -> tuple[dict[str, repository.ModelLocation], dict[str, str]]:
        """The models on disk by key (their name; host.namespacing keys them by repository too)."""
        return repository.scan(self.roots, self.mappings, self.labels)

    def _sync(self) -> None:
        """Bring the local copies of cloud repositories up to date (host.storage); HostError
        when one cannot be read."""
        if self.storage is not None and not getattr(self._local, "synced", False):
            self.storage.sync()

    def _refresh_locations(self) -> dict[str, str]:
        """Learn models added to the repository (the index lists them even when not loaded)."""
        self._sync()
        locations, errors = self._scan()
        self._duplicated = errors
        for name, loc in locations.items():
            entry = self._models.get(name)
            if entry is None:
                entry = self._models[name] = ModelEntry(name)
                if name in self._retired:  # back in the repository: Triton still knew it
                    entry.in_lifecycle, entry.known_versions = True, self._retired.pop(name)
            if entry.override_dir is None:  # a model loaded from override files stays there
                entry.location = loc
        return errors

    # --- registered repositories -----------------------------------------------------------------
    def register_repository(self, root: Path, mapping: dict[str, str]) -> None:
        """Serve the models of `root` too, subfolders named in `mapping` under the mapped name
        (Triton's TRITONSERVER_ServerRegisterModelRepository and its texts)."""
        root = Path(root)
        with self._locked():
            if root in self.roots:
                raise AlreadyExistsError(f"model repository '{root}' has already been registered")
            for other in self.mappings.values():
                for name in mapping.values():
                    if name in other.values():
                        raise AlreadyExistsError(f"failed to register '{root}', there is a "
                                                 f"conflicting mapping for '{name}'")
            self.roots.append(root)
            self.mappings[root] = dict(mapping)

    def unregister_repository(self, root: Path) -> None:
        root = Path(root)
        with self._locked():
            if root not in self.roots:
                raise InvalidArgumentError(f"failed to unregister '{root}', repository not found")
            self.roots.remove(root)
            self.mappings.pop(root, None)
            for entry in self._models.values():
                if entry.location is not None and entry.location.root == root:
                    entry.location = None  # as a model whose folder was removed

    # --- control -------------------------------------------------------------------------------
    def check_control_allowed(self) -> None:
        # Triton words it so in both 'none' and 'poll' mode (core LoadUnloadModel).
        if self.mode != "explicit":
            raise UnavailableError("explicit model load / unload is not allowed if polling is enabled")

    def load_all(self, names: list[str] | None = None) -> dict[str, str]:
        """Load every model (or `names`); returns the errors by model name, loads the rest."""
        with self._locked():
            scan_errors = self._refresh_locations()
            wanted = sorted(self._models) if names is None or "*" in names else names
            errors: dict[str, str] = {}

            def load_one(name: str) -> None:
                try:
                    if name in scan_errors:
                        raise InvalidArgumentError(scan_errors[name])
                    if name not in self._models:  # Triton's text (--load-model of no model)
                        raise NotFoundError(f"failed to poll model '{name}': model not found in "
                                            "any model repository.")
                    self._load(name, None, None, refresh=False)
                except HostError as exc:
                    errors[name] = str(exc).rstrip("\n")  # a log line's, without Triton's newline

            # Ensembles load last, one by one on this thread: each needs its composing models
            # loaded (and loads those not asked for). The rest loads in parallel
            # (--model-load-thread-count), as in Triton: each load touches only its own entry;
            # the backend pool serializes backend creation.
            ensembles = [n for n in wanted if self._is_ensemble(n)]
            models = [n for n in wanted if n not in ensembles]
            self._pass = set()  # an ensemble loads a composing model once, not again here
            try:
                if self.load_threads == 1 or len(models) < 2:
                    for name in models:
                        load_one(name)
                else:
                    with ThreadPoolExecutor(min(self.load_threads, len(models)),
                                            thread_name_prefix="model-load") as pool:
                        list(pool.map(load_one, models))
                for name in ensembles:
                    if name not in self._pass:
                        load_one(name)
            finally:
                self._pass = None
            for name in wanted:  # loaded on request, even if an ensemble loaded it first
                if name in self._models and name not in errors:
                    self._models[name].explicit = True
            return errors

    def _is_ensemble(self, name: str) -> bool:
        entry = self._models.get(name)
        if entry is None or entry.location is None:
            return False
        try:
            cfg = config_mod.load_config_file(entry.location.path, self.config_name)
        except HostError:  # a broken config fails its own load, with its own error
            return False
        return cfg is not None and cfg.platform == config_mod.ENSEMBLE_PLATFORM

    def load(self, name: str, config_json: str | dict | None = None,
             override_dir: Path | None = None, explicit: bool = True) -> None:
        """(Re)load a model: every version its policy selects. Raises the first failure.

        With `override_dir` the model loads from that folder (host.overrides) instead of the
        repository; the folder is removed once no version of the model uses it.

        An ensemble first loads the composing models that are not loaded yet (`explicit` False
        for those, so that `unload_dependents` may unload them again); a model that loaded
        brings back the ensembles that went down with it, and re-checks those that use it.
        """
        outer = not getattr(self._local, "loading", False)
        free = getattr(self._local, "free", False)
        with self._locked():
            with self._claim(name):
                # Only a load asked for on its own (not one nested in another load, a poll or
                # load_all) lets go of the repository lock while its versions load.
                self._local.free = outer
                try:
                    self._load_locked(name, config_json, override_dir, explicit)
                finally:
                    self._local.free = free

    @contextlib.contextmanager
    def _claim(self, name: str) -> Iterator[None]:
        """Wait (lock held; waiting lets go of it) until no other thread loads or unloads
        `name`, then hold it: as Triton, actions on one model are serialized."""
        me = threading.get_ident()
        while True:
            owner = self._busy.get(name)
            if owner is None or owner[0] == me:
                break
            self._busy_cond.wait()
        self._busy[name] = (me, (owner[1] if owner else 0) + 1)
        try:
            yield
        finally:
            ident, depth = self._busy[name]
            if depth == 1:
                del self._busy[name]
                self._busy_cond.notify_all()
            else:
                self._busy[name] = (ident, depth - 1)

    @contextlib.contextmanager
    def _nested(self) -> Iterator[None]:
        """Loads made inside this one (an ensemble's composing models, the ensembles that use
        a model just loaded) keep the repository lock."""
        free = getattr(self._local, "free", False)
        self._local.free = False
        try:
            yield
        finally:
            self._local.free = free

    @contextlib.contextmanager
    def _unlocked(self, allowed: bool = True) -> Iterator[None]:
        """Let go of the repository lock (every level this thread holds) for the slow part of
        a load asked for on its own (see load): loads of other models, unloads, the index and
        polling go on meanwhile; `_claim` keeps others off this model."""
        if not allowed or not getattr(self._local, "free", False):
            yield
            return
        saved = self._lock._release_save()  # type: ignore[attr-defined]
        try:
            yield
        finally:
            self._lock._acquire_restore(saved)  # type: ignore[attr-defined]

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The repository lock, for loads. The outermost holder (a load, load_all or poll, not
        a load nested in them) then waits, a bounded time and after releasing the lock, for the
        versions its reloads replaced: one stuck in execute holds up nothing else."""
        outer = not getattr(self._local, "loading", False)
        self._local.loading = True
        # A load asked for on a front-end thread runs on every CPU: the threads it starts (an
        # ONNX Runtime pool, a batcher) inherit its affinity (host.affinity).
        widened = outer and affinity.widen()
        try:
            with self._lock:
                yield
        finally:
            if widened:
                affinity.pin()
            if outer:
                self._local.loading = False
                with self._lock:
                    waits, self._replaced = self._replaced, []
                self._wait_unloaded(waits)

    def _load_locked(self, name: str, config_json: str | dict | None, override_dir: Path | None,
                     explicit: bool) -> None:
        with self._lock:
            old = self._models.get(name)
            previous = old.override_dir if old is not None else None
            if old is not None and previous is not None:
                old.override_dir, old.location = None, None  # back to the repository's copy
            try:
                self._load(name, config_json, override_dir, explicit=explicit)
            finally:
                entry = self._models.get(name)
                for folder in (override_dir, previous):
                    if entry is not None and folder is not None:
                        self._settle_override(entry, folder)

    def _load(self, name: str, config_json: str | dict | None, override_dir: Path | None,
              refresh: bool = True, explicit: bool = True) -> None:
        if refresh:
            self._refresh_locations()
        if override_dir is not None:
            created = self._models.setdefault(name, ModelEntry(name))
            created.location = repository.ModelLocation(name, override_dir.parent, override_dir)
            created.override_dir = override_dir
        entry = self._models.get(name)
        if entry is None or entry.location is None or not entry.location.path.is_dir():
            raise poll_failure(
                NotFoundError(f"failed to load '{name}', failed to poll from model repository"))
        entry.unloaded = False
        entry.explicit = entry.explicit or explicit
        fingerprint = repository.fingerprint(entry.location.path)
        if config_json is None and entry.config_override is not None \
                and fingerprint == entry.fingerprint:
            config_json = entry.config_override  # as Triton: unchanged files keep the override
        entry.fingerprint = fingerprint
        self._deps.loading.append(name)
        try:
            try:
                try:
                    base = self._base_config(entry, config_json)
                    on_disk = repository.versions_on_disk(entry.location.path)
                    agents = self._agents_load(entry, base)
                except HostError as exc:  # Triton reads the folder and config when it polls
                    raise poll_failure(exc) from None
                entry.in_lifecycle = True
                try:
                    versions = repository.select_versions(base.version_policy, on_disk, name)
                except HostError as exc:  # Triton's load (model_lifecycle.cc), not its poll
                    raise InvalidArgumentError(
                        f"load failed for model '{name}': {exc.message}\n") from None
                if config_mod.backend_for(base) == config_mod.ENSEMBLE_PLATFORM:
                    with self._nested():
                        self._deps.load_composing(name, base)
            except HostError as exc:
                entry.error = str(exc).rstrip("\n")  # Triton ends some load errors with one
                entry.poll_failed = exc.poll_failure
                self._notify(name, -1, UNAVAILABLE, entry.error)
                raise
            entry.error, entry.poll_failed = "", False
            entry.waiting_on.clear()
            try:
                self._load_versions_with(entry, base, versions, agents)
            except HostError:
                log.log(VERBOSE_2, "OnLoadFinal() '%s' for all version(s)", name)
                log.info("failed to load '%s'", name)  # Triton's lines (model_lifecycle.cc)
                raise
            log.log(VERBOSE_2, "OnLoadFinal() '%s' for all version(s)", name)
            log.info("successfully loaded '%s'", name)
            entry.config_override = config_json
        finally:
            self._deps.loading.remove(name)
        if self._pass is not None:
            self._pass.add(name)
        with self._nested():
            self._deps.model_loaded(name)

    def _agents_load(self, entry: ModelEntry, base: model_config_pb2.ModelConfig) -> Any:
        """The LOAD action of the model's repository agents (None when it names none); an
        agent's error fails the load as a poll failure, as in Triton."""
        if not base.model_repository_agents.agents:
            return None
        from host.native.repoagent import AgentRegistry

        if self._repo_agents is None:
            self._repo_agents = AgentRegistry(self.repoagent_directory)
        assert entry.location is not None
        return self._repo_agents.load(base, config_mod.config_to_json(base), entry.location.path)

    def _load_versions_with(self, entry: ModelEntry, base: model_config_pb2.ModelConfig,
                            versions: list[int], agents: Any) -> None:
        """`_load_versions`, from the folder the repository agents point at (Triton loads the
        model from the last agent's location), then LOAD_COMPLETE or LOAD_FAIL; the agents of
        the load before are sent UNLOAD once these replace them."""
        if agents is None:
            self._load_versions(entry, base, versions)
            return
        from host.native.repoagent import LOAD_COMPLETE, LOAD_FAIL

        home = entry.location
        assert home is not None
        if agents.location != home.path:
            entry.location = repository.ModelLocation(entry.name, agents.location.parent,
                                                      agents.location)
        try:
            self._load_versions(entry, base, versions)
        except BaseException:
            agents.act(LOAD_FAIL)
            agents.close()
            raise
        finally:
            entry.location = home
        agents.act(LOAD_COMPLETE)
        previous, entry.agents = entry.agents, agents
        if previous is not None:
            previous.unload()

    def _base_config(self, entry: ModelEntry, config_json: str | dict | None) -> model_config_pb2.ModelConfig:
        assert entry.location is not None
        if config_json is not None:
            try:
                cfg = config_mod.config_from_json(config_json)
            except HostError as exc:
                raise InvalidArgumentError(f"Invalid config override: {exc}") from None
        else:
            found = config_mod.load_config_file(entry.location.path, self.config_name)
            if found is None and not self.auto_complete:  # Triton reads the (missing) file
                raise InvalidArgumentError(  # Triton's text (L0_lifecycle greps the log for it)
                    f"failed to open text file for read "
                    f"{entry.location.path / config_mod.CONFIG_FILENAME}: No such file or directory")
            cfg = found or model_config_pb2.ModelConfig()
        loc = entry.location
        if not cfg.name or loc.path.name in self.mappings.get(loc.root, ()):
            cfg.name = entry.name  # a mapped folder (register_repository) takes its mapped name
        # Triton completes the backend fields (from the first version folder's files) and
        # validates the configuration when it polls, before it looks for versions or loads a
        # backend; inputs and outputs wait for the backend's auto-complete unless it is off.
        # The rest of the normalization is done on a copy: the backend's auto-complete must
        # still see what the user wrote (host.config.autocomplete).
        probe = copy.deepcopy(cfg)
        config_mod.normalize_config(probe, entry.name, model_dir=entry.location.path,
                                    validate_io=not self.auto_complete, validate_groups=False)
        cfg.platform, cfg.backend = probe.platform, probe.backend
        cfg.default_model_filename = probe.default_model_filename
        if not config_mod.backend_for(cfg):
            cfg.backend = repository.infer_backend(entry.location.path)
            if not cfg.backend:
                raise InvalidArgumentError(
                    f"model '{entry.name}' names no backend or platform and none can be inferred "
                    f"from its files")
        config_mod.default_policy(cfg)
        return cfg

    def _load_versions(self, entry: ModelEntry, base: model_config_pb2.ModelConfig,
                       versions: list[int]) -> None:
        new: dict[int, ModelVersion] = {}
        entry.failed = {}
        entry.known_versions.update(versions)
        unchanged = self._unchanged_key(entry, base)
        same_but_groups = self._unchanged_key(entry, base, instance_groups=False)
        updated: dict[int, str] = {}  # versions whose in-place update failed: still serving
        for version in versions:
            old = entry.versions.get(version)
            files = repository.version_fingerprint(entry.location.path, version) \
                if unchanged and entry.location is not None else None
            key = (unchanged, files) if files is not None else None
            if key is not None and old is not None and old.state == READY and old.reload_key == key:
                # As Triton (model_lifecycle.cc, AsyncLoad): a serving version whose files and
                # configuration did not change is not loaded again.
                new[version] = old
                continue
            if key is not None and old is not None and old.state == READY \
                    and old.update_key == (same_but_groups, files):
                # As Triton (ModelLifeCycle::UpdateModelConfig): only the instance groups
                # changed: the serving version takes them in place, and keeps serving.
                log.log(VERBOSE_2, "UpdateModelConfig() '%s' version %d", entry.name, version)
                new[version] = old
                try:
                    with self._unlocked(bool(unchanged)):
                        old.update_instances(base)
                    old.reload_key = key
                except HostError as exc:
                    updated[version] = state_reason(exc)
                continue
            try:
                with self._unlocked(bool(unchanged)):
                    new[version] = mv = self._load_version(entry, copy.deepcopy(base), version)
                mv.reload_key = key
                mv.update_key = (same_but_groups, files) if files is not None else None
            except HostError as exc:
                entry.failed[version] = state_reason(exc)
                self._notify(entry.name, version, UNAVAILABLE, str(exc))
                old = entry.versions.get(version)
                if old is not None and old.state == READY:
                    new[version] = old  # a failed reload keeps the version that was serving
        old_versions = entry.versions
        if entry.failed or updated:
            # Triton's answer (model_repository_manager.cc): INVALID_ARG, naming each failed
            # version (one that failed an in-place update is still READY, and says so).
            failures = {v: f"{UNAVAILABLE} state: {reason}" for v, reason in entry.failed.items()}
            failures.update((v, f"{READY} state: {reason}") for v, reason in updated.items())
            # Triton's message ends with a newline (ModelRepositoryManager::LoadModel).
            error = InvalidArgumentError(f"load failed for model '{entry.name}': " + "".join(
                f"version {version} is at {what};" for version, what in sorted(failures.items()))
                + "\n")
            # As Triton (model_lifecycle.cc, OnLoadFinal): a load that fails for one version
            # releases every version it loaded; the versions that served before keep serving.
            for version, mv in new.items():
                if old_versions.get(version) is not mv:
                    self._replaced.append(self._unload_version(mv))
                    entry.failed[version] = "unloaded"
            raise error
        entry.versions = new
        self._replaced.extend(self._unload_version(mv) for version, mv in old_versions.items()
                              if new.get(version) is not mv)
        for version in old_versions:  # dropped by the version policy: Triton lists it so
            if version not in new:
                entry.failed[version] = "unloaded"

    @staticmethod
    def _unchanged_key(entry: ModelEntry, base: model_config_pb2.ModelConfig,
                       instance_groups: bool = True) -> bytes:
        """The configuration as a reload compares it (its version policy aside; its instance
        groups too with `instance_groups` False, as Triton's ConfigChangeRequiresReload); empty
        for an ensemble, which Triton always loads again. Compared normalized (defaults filled
        in), so that a config given to the load API as the server answered it (get_model_config)
        equals the file it came from."""
        if config_mod.backend_for(base) == config_mod.ENSEMBLE_PLATFORM or entry.location is None:
            return b""
        cfg = copy.deepcopy(base)
        if not instance_groups:
            try:
                config_mod.normalize_config(cfg, entry.name, validate_io=False,
                                            validate_groups=False)
            except HostError:  # the load reports it
                cfg = copy.deepcopy(base)
            cfg.ClearField("instance_group")
        cfg.ClearField("version_policy")
        return str(entry.location.path).encode() + b"\0" + cfg.SerializeToString(deterministic=True)

    def _load_version(self, entry: ModelEntry, cfg: model_config_pb2.ModelConfig, version: int) -> ModelVersion:
        assert entry.location is not None
        backend_name = config_mod.backend_for(cfg)
        paths.check_config_files(entry.location.path, version, cfg)  # before any backend sees it
        spec = ModelSpec(name=entry.name, version=version, repository=entry.location.root,
                         path=entry.location.path, config=cfg, backend=backend_name)
        self._notify(entry.name, version, "LOADING", "")
        log.info("loading: %s:%d", entry.name, version)
        if backend_name == config_mod.ENSEMBLE_PLATFORM:
            return self._load_ensemble_version(spec)
        loading = supervise.loading(entry.name, version)  # named by the master if the process dies
        pristine = copy.deepcopy(cfg) if self.load_retries else cfg  # a load completes its config
        try:
            for attempt in range(self.load_retries + 1):  # --model-load-retry-count, as Triton
                if attempt:
                    cfg = copy.deepcopy(pristine)
                    spec = replace(spec, config=cfg)
                try:
                    return self._load_version_now(entry, spec, cfg, backend_name, version)
                except HostError as exc:
                    if attempt == self.load_retries:
                        raise
                    log.warning("failed to load '%s' version %d, retrying: %s", entry.name,
                                version, exc)
            raise AssertionError("unreachable")
        finally:
            supervise.done(loading)

    def _load_version_now(self, entry: ModelEntry, spec: ModelSpec, cfg: model_config_pb2.ModelConfig,
                          backend_name: str, version: int) -> ModelVersion:
        started = time.perf_counter()
        try:
            backend = self.backends.acquire(backend_name, spec.path, version)
        except HostError:
            raise
        except BaseException as exc:  # noqa: BLE001 - even sys.exit(): this model fails to load
            raise UnavailableError(f"backend '{backend_name}' failed to initialize: "
                                   f"{type(exc).__name__}: {exc}") from exc
        try:
            if self.auto_complete:
                backend.auto_complete_config(spec)
            config_mod.normalize_config(spec.config, entry.name)
            mv = ModelVersion(spec)
            mv.rate_limiter = self.rate_limiter
            if self.latency_config is not None:  # summaries / histograms (host.latency)
                mv.stats.latency = LatencyRecorder(for_model(self.latency_config, spec.config),
                                                   bool(spec.config.response_cache.enable))
            mv.load(backend)
            mv.load_duration_secs = time.perf_counter() - started
        except BaseException as exc:
            self.backends.release(backend_name)
            if isinstance(exc, HostError):
                raise
            # Any other exception, sys.exit() included, fails this model's load only.
            log.exception("model '%s' version %d failed to load", entry.name, version)
            raise InternalError(f"{type(exc).__name__}: {exc}") from exc
        self._notify(entry.name, version, READY, "")
        return mv

    def _load_ensemble_version(self, spec: ModelSpec) -> ModelVersion:
        """An ensemble has no backend: check it against its composing models and serve."""
        if self.ensembles is None:
            raise UnavailableError(f"model '{spec.name}': this host runs no ensembles")
        config_mod.normalize_config(spec.config, spec.name)
        mv = EnsembleVersion(spec, self.ensembles, self._deps.config_lookup(spec.name))
        if self.latency_config is not None:  # summaries / histograms (host.latency)
            mv.stats.latency = LatencyRecorder(self.latency_config,
                                               bool(spec.config.response_cache.enable))
        mv.load()
        self._notify(spec.name, spec.version, READY, "")
        return mv

    def unload(self, name: str, unload_dependents: bool = False) -> None:
        """Unload every version of a model; waits at most `unload_wait` seconds for their
        requests in flight, and never while holding the repository lock, so that a model stuck
        in execute freezes neither the caller nor loads, unloads, the index or polling."""
        with self._lock, self._claim(name):  # after a load of it under way, as Triton
            pending = self._unload_entry(name, unload_dependents)
            if getattr(self._local, "loading", False):
                # Nested in a load on this thread (a python model's `initialize` unloading a
                # model): the versions finish with the lock, which this thread holds until the
                # load ends; the outermost load waits for them once it has let go of it.
                self._replaced.extend(pending)
                return
        self._wait_unloaded(pending)

    def _unload_entry(self, name: str, unload_dependents: bool = False) -> list[threading.Thread]:
        entry = self._models.get(name)
        if entry is None:  # as Triton: unloading a model it does not know succeeds
            return []
        log.log(VERBOSE_2, "AsyncUnload() '%s'", name)
        entry.unloaded = True
        entry.explicit = False
        entry.waiting_on.clear()
        composing = composing_of(entry)
        pending = []
        for mv in list(entry.versions.values()):
            entry.unloading[mv.version] = mv  # listed (UNLOADING) until its requests finish
            pending.append(self._unload_version(mv, entry=entry))
        # Triton's index goes on listing each version it unloaded: UNAVAILABLE, "unloaded"
        entry.failed = {version: "unloaded" for version in entry.versions}
        entry.versions = {}
        if entry.agents is not None:  # UNLOAD, UNLOAD_COMPLETE, then the agent models go
            agents, entry.agents = entry.agents, None
            agents.unload()
        if entry.override_dir is not None:
            overrides.remove(entry.override_dir)
            entry.override_dir, entry.location = None, None
        self._deps.model_unloaded(name)
        if unload_dependents:
            pending += self._deps.unload_unused(composing)
        return pending

    @staticmethod
    def _settle_override(entry: ModelEntry, folder: Path) -> None:
        """After a load: keep an override folder a version still runs from, remove it otherwise."""
        if any(mv.spec.path == folder for mv in entry.versions.values()):
            entry.override_dir = folder  # also a failed reload that keeps the old version serving
            entry.location = repository.ModelLocation(entry.name, folder.parent, folder)
            return
        overrides.remove(folder)
        if entry.override_dir == folder:
            entry.override_dir, entry.location = None, None

    def unload_all(self, wait: bool = True) -> None:
        with self._lock:
            # loads under way finish first (a bounded time: a load stuck in a model's
            # initialize must not hold the exit up)
            self._busy_cond.wait_for(lambda: not self._busy, self.unload_wait)
            pending = [t for name in list(self._models) for t in self._unload_entry(name)]
        if wait:
            self._wait_unloaded(pending)

    def inflight_status(self) -> list[tuple[str, int, int]]:
        """(name, version, count) of every loaded version with inferences in flight (Triton's
        ModelLifeCycle::InflightStatus, which the server's shutdown logs and waits for)."""
        with self._lock:
            versions = [mv for entry in self._models.values() for mv in entry.versions.values()]
        status = [(mv.name, mv.version, mv.inflight_inferences()) for mv in versions]
        return sorted(s for s in status if s[2])

    def live_versions(self) -> int:
        """Versions loaded or still unloading (Triton's live models plus background ones)."""
        with self._lock:
            loaded = sum(len(entry.versions) for entry in self._models.values())
            return loaded + sum(1 for t in list(self._finishers.values()) if t.is_alive())

    def _unload_version(self, mv: ModelVersion, reason: str = "unloaded",
                        entry: ModelEntry | None = None) -> threading.Thread:
        """Refuse the version's new requests now; a thread of its own waits for those in flight
        and then finalizes it (returned, for callers that wait a bounded time)."""
        finisher = self._finishers.get(mv)
        if finisher is not None:  # already unloading: one finisher per version
            return finisher
        self._notify(mv.name, mv.version, "UNLOADING", "")
        mv.begin_unload()
        finisher = self._finishers[mv] = threading.Thread(
            target=self._finish_unload, args=(mv, reason, entry), daemon=True,
            name=f"unload-{mv.name}-{mv.version}")
        finisher.start()
        return finisher

    def _finish_unload(self, mv: ModelVersion, reason: str, entry: ModelEntry | None) -> None:
        was_loaded = mv.scheduler is not None and not isinstance(mv, EnsembleVersion)
        mv.unload()
        mv.reason = reason
        if entry is not None:
            with self._lock:
                if entry.unloading.get(mv.version) is mv:
                    del entry.unloading[mv.version]
        if was_loaded:
            self.backends.release(mv.spec.backend)
        self._finishers.pop(mv, None)
        log.info("successfully unloaded '%s' version %d", mv.name, mv.version)
        self._notify(mv.name, mv.version, UNAVAILABLE, reason)

    def _wait_unloaded(self, finishers: list[threading.Thread]) -> None:
        deadline = time.monotonic() + self.unload_wait
        for finisher in finishers:
            finisher.join(max(deadline - time.monotonic(), 0))
            if finisher.is_alive():
                log.warning("%s: requests still in flight after %.0f s; the version finishes "
                            "unloading when they end", finisher.name, self.unload_wait)

    # --- poll mode -----------------------------------------------------------------------------
    def poll(self) -> None:
        """Load added models, reload changed ones, unload removed ones."""
        with self._locked():
            try:
                self._sync()
            except HostError as exc:  # a repository that cannot be read now unloads nothing
                log.error("poll: %s", exc)
                return
            self._local.synced = True  # the loads below use this sync's copies
            try:
                self._poll_synced()
            finally:
                self._local.synced = False

    def _poll_synced(self) -> None:
        with self._lock:
            locations, duplicated = self._scan()
            self._duplicated = duplicated
            for name, error in duplicated.items():  # as Triton: served from neither repository
                log.error("Poll failed for model directory '%s': %s", name, error)
                locations.pop(name, None)
            for name in list(self._models):
                if name not in locations:
                    self._unload_entry(name)  # finishes in the background: never waited for here
                    gone = self._models.pop(name)
                    if gone.in_lifecycle or gone.known_versions:  # requests' texts (get)
                        self._retired[name] = gone.known_versions.union(gone.versions)
            for name, loc in locations.items():
                entry = self._models.get(name)
                if entry is not None and entry.fingerprint == repository.fingerprint(loc.path):
                    continue
                try:
                    self.load(name)
                except HostError as exc:
                    log.error("poll: failed to load '%s': %s", name, exc)

    def _notify(self, name: str, version: int, state: str, reason: str) -> None:
        try:
            self._on_state(name, version, state, reason)
        except BaseException:  # noqa: BLE001 - a plugin's hook must not break a load or unload
            log.exception("model-state listener failed")

