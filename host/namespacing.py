"""Triton's model namespacing (`--model-namespacing=true`): models of the same name in several
repositories, each in the namespace of its repository (core's model_repository_manager.cc).

The model manager is unchanged but for its keys: every model is keyed by
`host.repository.ModelKey` (its name, with its repository as namespace), so its loads, unloads,
ensemble links and index work per (namespace, name). What differs is how a bare name is found:

- a request (inference, metadata, config, readiness, statistics, BLS) names a model by name
  only: it is served if exactly one namespace has that model in Triton's "global map" (polled
  by a load and not unloaded since); with more, it is refused with Triton's ambiguity error
  ("There are 2 identifiers of model ... ambiguity."); with none, with Triton's texts for a
  name it never knew, or knew once;
- an ensemble's step uses the model of that name in the ensemble's own repository, else the
  only one there is (Triton's fuzzy match); the namespace it was linked to is written into the
  step's `model_namespace`, as Triton does, and the step is served from that model. An
  ensemble is linked again when a repository gains or loses a model of a step's name;
- an explicit load or unload of a name acts on that name in every repository, and loading an
  ensemble also loads its steps' models of those names in every repository (Triton's polling
  chain); `--load-model` and polling likewise.

Without namespacing (the default) none of this exists: `host.manager.ModelManager` is used as
it is, keyed by plain names.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from host import config as config_mod
from host import repository
from host.ensemble import EnsembleVersion
from host.ensemble.control import Dependencies
from host.errors import HostError, InvalidArgumentError, NotFoundError
from host.manager import ModelEntry, ModelManager
from host.model import ModelVersion
from host.proto import model_config_pb2
from host.repository import ModelKey

log = logging.getLogger(__name__)

# The namespace of a model loaded from override files (Triton: no repository, "").
OVERRIDE_NAMESPACE = ""


class NamespacedModelManager(ModelManager):
    namespaced = True  # host.metrics labels the models' metrics with their namespace

    def __init__(self, roots: list[Path], *args: Any, **kwargs: Any) -> None:
        super().__init__(roots, *args, **kwargs)
        self._deps = NamespacedDependencies(self)

    @property
    def _namespaces(self) -> list[str]:
        """Override files' namespace, then each repository's: those given at start and those
        registered since (SageMaker's multi-model endpoint, `register_repository`)."""
        return [OVERRIDE_NAMESPACE] + [repository.label(r, self.labels) for r in self.roots]

    def _scan(self) -> tuple[dict[str, repository.ModelLocation], dict[str, str]]:
        return repository.scan_namespaced(self.roots, self.mappings, self.labels)

    # --- finding a model by name -----------------------------------------------------------------
    def _in_global_map(self, entry: ModelEntry) -> bool:
        """Triton keeps a model in its global map from the load that polled it to its unload."""
        return entry.in_lifecycle and not entry.unloaded and not entry.poll_failed

    def resolve(self, name: str) -> ModelKey:
        """The one model a request naming `name` means, or Triton's error
        (ModelRepositoryManager::FindModelIdentifier)."""
        if isinstance(name, ModelKey):
            return name
        found, known = [], False
        for namespace in self._namespaces:
            key = ModelKey(name, namespace)
            entry = self._models.get(key)
            if entry is not None and self._in_global_map(entry):
                found.append(key)
            known = known or key in self._retired or (entry is not None and entry.in_lifecycle)
        if len(found) == 1:
            return found[0]
        if found:
            raise InvalidArgumentError(
                f"There are {len(found)} identifiers of model '{name}' in global map, model "
                "namespace must be provided to resolve ambiguity.")
        if known:  # Triton keeps the name in its map with no identifier left
            raise NotFoundError(f"Identifier of model '{name}' is not found in global map")
        raise InvalidArgumentError(f"Request for unknown model: '{name}' is not found")

    def get(self, name: str, version: int = -1) -> ModelVersion:
        return super().get(self.resolve(name), version)

    def entry(self, name: str) -> ModelEntry | None:
        try:
            return self._models.get(self.resolve(name))
        except HostError:
            return None

    def _request_error(self, name: str, version: int, entry: ModelEntry | None) -> HostError:
        # Triton's lifecycle names the model by its identifier: '<namespace>::<name>'.
        error = super()._request_error(name, version, entry)
        if isinstance(name, ModelKey) and name.namespace:
            error = type(error)(error.message.replace(f"'{name}'", f"'{name.qualified}'", 1))
        return error

    def _on_disk(self, name: str) -> list[ModelKey]:
        """The repositories' models of that name (after `_refresh_locations`)."""
        return [key for key in self._models if isinstance(key, ModelKey) and str(key) == name
                and (entry := self._models[key]).location is not None
                and entry.override_dir is None and entry.location.path.is_dir()]

    def step_target(self, ensemble: ModelKey, name: str) -> ModelKey | None:
        """The model a step of `ensemble` naming `name` uses: the one in the ensemble's own
        namespace, else the only one of that name (Triton's DependencyGraph::FindNode)."""
        preferred = ModelKey(name, getattr(ensemble, "namespace", OVERRIDE_NAMESPACE))
        entry = self._models.get(preferred)
        if entry is not None and entry.location is not None and entry.location.path.is_dir():
            return preferred
        candidates = [key for key in self._models
                      if isinstance(key, ModelKey) and str(key) == name
                      and (e := self._models[key]).location is not None and not e.poll_failed
                      and e.location.path.is_dir()]
        return candidates[0] if len(candidates) == 1 else None

    # --- control ---------------------------------------------------------------------------------
    def load(self, name: str, config_json: str | dict | None = None,
             override_dir: Path | None = None, explicit: bool = True) -> None:
        if isinstance(name, ModelKey):
            super().load(name, config_json, override_dir, explicit)
            return
        if override_dir is not None:  # Triton loads override files with no namespace
            super().load(ModelKey(name, OVERRIDE_NAMESPACE), config_json, override_dir, explicit)
            return
        with self._locked():
            self._refresh_locations()
            keys = self._on_disk(name)
            if not keys:  # the manager's own answer for a model in no repository
                self._load_locked(ModelKey(name, self._namespaces[-1]), config_json, None, explicit)
                return
            self._load_chain(keys)
            error: HostError | None = None
            for key in keys:  # as Triton: every repository's model of that name
                try:
                    self._load_locked(key, config_json, None, explicit)
                except HostError as exc:
                    error = error or exc
            self._relink()
            if error is not None:
                raise error

    def _load_chain(self, keys: list[ModelKey]) -> None:
        """Triton's polling chain: an ensemble's steps' models, of those names in every
        repository, are loaded with it (not explicitly); failures are the ensemble's to report."""
        seen, todo, chain = set(keys), list(keys), []
        while todo:
            cfg = self._config_of(todo.pop())
            if cfg is None:
                continue
            for step in cfg.ensemble_scheduling.step:
                for key in self._on_disk(step.model_name):
                    if key not in seen:
                        seen.add(key)
                        todo.append(key)
                        chain.append(key)
        for key in chain:
            entry = self._models[key]
            if entry.default_version() is None and not self._is_ensemble(key):
                try:
                    self._load(key, None, None, explicit=False)
                except HostError as exc:
                    log.error("failed to load '%s': %s", key.qualified, exc)

    def _config_of(self, key: ModelKey) -> model_config_pb2.ModelConfig | None:
        entry = self._models.get(key)
        if entry is None or entry.location is None:
            return None
        try:
            cfg = config_mod.load_config_file(entry.location.path, self.config_name)
        except HostError:
            return None
        return cfg if cfg is not None and cfg.platform == config_mod.ENSEMBLE_PLATFORM else None

    def unload(self, name: str, unload_dependents: bool = False) -> None:
        if isinstance(name, ModelKey):
            super().unload(name, unload_dependents)
            return
        for key in [k for k in list(self._models) if str(k) == name]:
            super().unload(key, unload_dependents)

    def load_all(self, names: list[str] | None = None) -> dict[str, str]:
        if names is None or "*" in names:
            errors = super().load_all(names)
        else:
            with self._locked():
                self._refresh_locations()
                wanted: list[str] = []
                for name in names:  # a name in no repository: the manager's own error
                    wanted.extend(self._on_disk(name) or [name])
                errors = super().load_all(wanted)
        with self._locked():
            self._relink()
        return errors

    def poll(self) -> None:
        super().poll()
        with self._locked():
            self._relink()

    def _relink(self) -> None:
        """Ensembles whose steps would now be linked to another repository's model (one of a
        step's name was added or removed) load again, as Triton re-checks them."""
        for key, entry in list(self._models.items()):
            if entry.unloaded or not entry.in_lifecycle or not isinstance(key, ModelKey):
                continue
            stale = False
            for mv in entry.versions.values():
                if isinstance(mv, EnsembleVersion):
                    stale = stale or any(
                        self.step_target(key, s.model_name) not in (None, ModelKey(
                            s.model_name, s.model_namespace))
                        for s in mv.config.ensemble_scheduling.step)
            for gone in entry.waiting_on:  # went down with a composing model
                target = self.step_target(key, str(gone))
                stale = stale or (target is not None and target != gone)
            if stale:
                try:
                    self._load(key, None, None, explicit=False)
                except HostError as exc:
                    log.error("ensemble '%s' did not load again: %s", key.qualified, exc)


class NamespacedDependencies(Dependencies):
    manager: NamespacedModelManager

    def step_key(self, ensemble: str, step: model_config_pb2.ModelEnsembling.Step) -> str:
        target = self.manager.step_target(ensemble, step.model_name)  # type: ignore[arg-type]
        if target is None:  # not available or ambiguous: the ensemble fails to load
            step.ClearField("model_namespace")
            return step.model_name
        step.model_namespace = target.namespace
        return target
