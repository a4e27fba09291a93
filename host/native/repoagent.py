"""Repository agents: a model's `model_repository_agents { agents [...] }` (Triton's TRITONREPOAGENT
API, host/native/src/repoagent.c).

Each named agent is the library `<--repoagent-directory>/<name>/libtritonrepoagent_<name>.so`,
loaded once and shared by the models that name it (unloaded with the last of them). When a model
loads, each of its agents in order gets an agent model for it (the model's folder, its
configuration, the agent's parameters) and the LOAD action, whose error fails the load as a poll
failure (Triton's "Poll failed for model directory '<model>': <message>"); an agent may point
the load at other files (ModelRepositoryUpdate), and the next agent and the versions load from
there. Then LOAD_COMPLETE or LOAD_FAIL, and at unload UNLOAD and UNLOAD_COMPLETE, after which
the agent models are finalized (and the folders they acquired removed).
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

from host.errors import InvalidArgumentError

log = logging.getLogger(__name__)

DEFAULT_DIRECTORY = Path("/opt/tritonserver/repoagents")
LOAD, LOAD_COMPLETE, LOAD_FAIL, UNLOAD, UNLOAD_COMPLETE = range(5)  # TRITONREPOAGENT_ActionType


class AgentModels:
    """The agent models of one load of one model, in the configuration's order."""

    def __init__(self, registry: AgentRegistry, models: list[tuple[str, Any]], location: Path) -> None:
        self._registry, self._models, self.location = registry, models, location

    def act(self, action: int) -> None:
        """Send `action` to every agent; errors are logged (only LOAD's fail a load)."""
        from host.native.bridge import call

        for name, model in self._models:
            try:
                call(self._registry.lib.agent_model_action, model, action)
            except Exception as exc:  # noqa: BLE001 - logged as Triton logs it
                log.error("repository agent '%s' failed action %d: %s", name, action, exc)

    def close(self) -> None:
        """Finalize the agent models (UNLOAD and UNLOAD_COMPLETE sent before, by the caller)."""
        models, self._models = self._models, []
        for name, model in reversed(models):
            try:
                self._registry.lib.agent_model_free(model)
            except Exception as exc:  # noqa: BLE001
                log.error("repository agent '%s' failed to finalize its model: %s", name, exc)
            self._registry.release(name)

    def unload(self) -> None:
        self.act(UNLOAD)
        self.act(UNLOAD_COMPLETE)
        self.close()


class AgentRegistry:
    """The agent libraries of one server (--repoagent-directory)."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = Path(directory) if directory is not None else DEFAULT_DIRECTORY
        self._agents: dict[str, tuple[Any, int]] = {}  # name -> (agent capsule, users)
        self._lock = threading.Lock()
        self._lib: Any = None

    @property
    def lib(self) -> Any:
        if self._lib is None:
            from host.native.bridge import lib

            self._lib = lib()
        return self._lib

    def _acquire(self, name: str) -> Any:
        from host.native.bridge import call

        with self._lock:
            held = self._agents.get(name)
            if held is not None:
                self._agents[name] = (held[0], held[1] + 1)
                return held[0]
            library = f"libtritonrepoagent_{name}.so"
            path = self.directory / name / library
            if "/" in name or name in ("", ".", "..") or not path.is_file():
                raise InvalidArgumentError(f"unable to find '{library}' for repo agent '{name}', "
                                           f"searched: {self.directory}")
            agent = call(self.lib.agent_load, str(path), name)
            self._agents[name] = (agent, 1)
            return agent

    def release(self, name: str) -> None:
        with self._lock:
            agent, users = self._agents[name]
            if users > 1:
                self._agents[name] = (agent, users - 1)
                return
            del self._agents[name]
        try:
            self.lib.agent_unload(agent)
        except Exception as exc:  # noqa: BLE001
            log.error("repository agent '%s' failed to finalize: %s", name, exc)

    def load(self, config: Any, config_json: dict, location: Path) -> AgentModels | None:
        """Run LOAD for each agent the configuration names; None when it names none. Raises
        the first agent's error (the model fails to load) after undoing what was done."""
        from host.native.bridge import call

        agents = config.model_repository_agents.agents
        if not agents:
            return None
        done = AgentModels(self, [], location)
        text = json.dumps(config_json)
        try:
            for spec in agents:
                agent = self._acquire(spec.name)
                try:
                    model = call(self.lib.agent_model_new, agent, str(done.location), text,
                                 list(spec.parameters.items()))
                except BaseException:
                    self.release(spec.name)
                    raise
                done._models.append((spec.name, model))
                moved, _ = call(self.lib.agent_model_action, model, LOAD)
                done.location = Path(moved)
        except BaseException:
            done.act(LOAD_FAIL)
            done.close()
            raise
        return done
