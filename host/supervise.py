"""Worker supervision: no crash loops, and a worker that crashes comes back as it was.

gunicorn's master restarts a worker that dies. That is right for a worker that crashed while
serving (a native model that segfaults on one request), and wrong for one that dies while
booting (a native backend that aborts in its load): restarting that one only repeats the abort,
for ever. The master and its worker share one small page (`Board`, an anonymous shared mapping
made before the fork) on which the worker writes what it is doing:

- `booted` once its models are loaded and it serves. A worker that dies before `booted` makes
  the master exit with one message naming the model(s) it was loading.
- what each busy thread does (one slot per thread: "loading model 'm' version 1", "executing
  model 'm'"). A worker that dies while serving is logged with that, then restarted; more than
  CRASH_LIMIT crashes within CRASH_WINDOW seconds is a crash loop after all, and the master exits.
- `exiting` once it leaves on purpose (shutdown, a front end that died): not a crash.

What the new worker must restore is kept in a journal file (`Journal`): the models loaded
through the repository API (explicit mode) with their configuration overrides, and the clients'
shared-memory registrations. The worker rewrites it on each change; a new worker reads it.
"""

from __future__ import annotations

import base64
import json
import logging
import mmap
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("host.supervise")

# More crashes than this within CRASH_WINDOW seconds is a crash loop: the master exits.
CRASH_LIMIT = int(os.environ.get("MODELHOST_WORKER_CRASH_LIMIT", "5"))
CRASH_WINDOW = 60.0

_SLOT = 96  # bytes per text slot
_SLOTS = 64  # executing-model slots
_BOOTED, _EXITING, _TIMED_OUT = 0, 1, 2  # flag bytes
_EXECUTING = 8  # offset of the activity slots
_SIZE = _EXECUTING + _SLOT * _SLOTS


class Board:
    """The page the master and its worker share (see the module docstring)."""

    def __init__(self) -> None:
        self.page = mmap.mmap(-1, _SIZE)  # anonymous and shared: the forked worker writes here
        self._free = list(range(_SLOTS))

    def reset(self) -> None:  # master, before each fork
        self.page[:] = bytes(_SIZE)

    # --- worker side ---------------------------------------------------------------------------
    def mark_booted(self) -> None:
        self.page[_BOOTED] = 1

    def mark_exiting(self) -> None:
        self.page[_EXITING] = 1

    def mark_timed_out(self) -> None:
        """Its shutdown ran out of --exit-timeout-secs: the server exits with status 1."""
        self.page[_TIMED_OUT] = 1

    def begin(self, activity: bytes) -> int:
        """A thread starts `activity` (see `_text`); returns its slot (-1 when all are taken).
        On every execute: list.pop/append are atomic, so no lock is taken."""
        try:
            slot = self._free.pop()
        except IndexError:
            return -1
        offset = _EXECUTING + slot * _SLOT
        self.page[offset:offset + len(activity)] = activity
        return slot

    def end(self, slot: int) -> None:
        if slot < 0:
            return
        self.page[_EXECUTING + slot * _SLOT] = 0
        self._free.append(slot)

    # --- master side ---------------------------------------------------------------------------
    @property
    def booted(self) -> bool:
        return bool(self.page[_BOOTED])

    @property
    def exiting(self) -> bool:
        return bool(self.page[_EXITING])

    @property
    def timed_out(self) -> bool:
        return bool(self.page[_TIMED_OUT])

    def activities(self) -> list[str]:
        names = (self._read(_EXECUTING + i * _SLOT) for i in range(_SLOTS))
        return sorted({n for n in names if n})

    def _read(self, offset: int) -> str:
        raw = self.page[offset:offset + _SLOT]
        return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


# The worker's board (None outside a supervised worker): the request path asks `executing()`,
# and reads this first (no call per execute where there is none).
board: Board | None = None


_executing: dict[str, bytes] = {}  # model name -> its "executing model '<name>'" slot text


def _text(text: str) -> bytes:
    return text.encode("utf-8", "replace")[:_SLOT - 1] + b"\0"


def executing(model: str) -> int:
    """Note that this thread runs `model` (returns a token for `done`); free without a board."""
    if board is None:
        return -1
    text = _executing.get(model)
    if text is None:
        text = _executing[model] = _text(f"executing model '{model}'")
    return board.begin(text)


def loading(model: str, version: int) -> int:
    """Note that this thread loads a model version (returns a token for `done`)."""
    return board.begin(_text(f"loading model '{model}' version {version}")) if board is not None else -1


def done(token: int) -> None:
    if token >= 0 and board is not None:
        board.end(token)


class Journal:
    """Models loaded through the API and shared-memory registrations, kept for a new worker."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self.models: dict[str, str | None] = {}  # name -> configuration override (JSON) or None
        self.regions: dict[str, dict[str, Any]] = {}
        self.restored = False  # read from a previous worker's journal

    def read(self) -> None:
        try:
            doc = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return
        self.models = dict(doc.get("models", {}))
        self.regions = dict(doc.get("regions", {}))
        self.restored = True

    def model_loaded(self, name: str, config: str | None) -> None:
        with self._lock:
            self.models[name] = config
            self._save()

    def model_unloaded(self, name: str) -> None:
        with self._lock:
            self.models.pop(name, None)
            self._save()

    def region_registered(self, name: str, record: dict[str, Any]) -> None:
        with self._lock:
            self.regions[name] = record
            self._save()

    def regions_unregistered(self, names: list[str]) -> None:
        with self._lock:
            for name in names:
                self.regions.pop(name, None)
            self._save()

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"models": self.models, "regions": self.regions}))
        os.replace(tmp, self.path)  # a crash never leaves half a journal


def crashed(crashes: list[float]) -> list[float]:
    """The crash times within CRASH_WINDOW, a new one added: more than CRASH_LIMIT is a loop."""
    now = time.monotonic()
    return [t for t in crashes if now - t < CRASH_WINDOW] + [now]


class Supervisor:
    """Made in the master before the fork; its hooks go into gunicorn's settings."""

    def __init__(self) -> None:
        self.board = Board()
        self.folder = Path(tempfile.mkdtemp(prefix="modelhost-supervise-"))
        self.journal_path = self.folder / "journal.json"
        self._crashes: list[float] = []
        self._master = os.getpid()

    # --- master hooks --------------------------------------------------------------------------
    def pre_fork(self, server: Any, worker: Any) -> None:
        self.board.reset()

    def child_exit(self, server: Any, worker: Any) -> None:
        """After the master reaped a worker: decide between restarting it and leaving."""
        from gunicorn.errors import HaltServer

        board = self.board
        if board.exiting:
            return  # it left on purpose
        if not board.booted:
            doing = board.activities()
            what = f" while {', '.join(doing)}" if doing else ""
            message = (f"the worker process died while starting{what}; not restarting it (a "
                       "native backend that crashes in its load would crash again). Fix or remove "
                       "that model, or start with --model-control-mode=explicit without it")
            log.critical(message)
            raise HaltServer(message, 1)
        doing = board.activities()
        running = ", ".join(doing) if doing else "executing no model"
        self._crashes = crashed(self._crashes)
        if len(self._crashes) > CRASH_LIMIT:
            message = (f"the worker process crashed {len(self._crashes)} times within "
                       f"{CRASH_WINDOW:.0f} s, the last time {running}; not restarting it again")
            log.critical(message)
            raise HaltServer(message, 1)
        log.error("the worker process crashed while %s; restarting it with its models and "
                  "shared-memory registrations", running)

    def on_exit(self, server: Any) -> None:
        if os.getpid() == self._master:
            shutil.rmtree(self.folder, ignore_errors=True)

    # --- worker side ---------------------------------------------------------------------------
    def worker_started(self) -> Journal:
        """In the worker, before its models load: the board becomes the process's board, and
        the journal of the previous worker (if one crashed) is read."""
        global board
        board = self.board
        journal = Journal(self.journal_path)
        journal.read()
        return journal

    def worker_booted(self) -> None:
        self.board.mark_booted()

    def worker_exiting(self) -> None:
        self.board.mark_exiting()

    def worker_timed_out(self) -> None:
        self.board.mark_timed_out()


def start_host(options: Any, journal: Journal) -> Any:
    """A started Host that comes back as the journal's previous process left it (models loaded
    through the API, shared-memory registrations), and records its changes from now on: the one
    worker of a server, or its engine process (host.frontend)."""
    from dataclasses import replace

    from host.core import Host

    explicit = options.model_control_mode == "explicit"
    if journal.restored and explicit:
        options = replace(options, load_models=[])  # the journal knows what was loaded
    host = Host(options)
    host.start()
    if not journal.restored and explicit:
        for mv in host.manager.loaded():
            journal.models.setdefault(mv.name, None)
    restore(host, journal)
    return host


def restore(host: Any, journal: Journal) -> None:
    """In a new worker after a crash: load the models the crashed one had loaded through the API
    and register its clients' shared-memory regions again; then record changes from now on."""
    if journal.restored and host.options.model_control_mode == "explicit":
        for name, config in journal.models.items():
            try:
                host.load_model(name, config=config)
            except Exception as exc:  # noqa: BLE001 - one model's failure is that model's
                log.error("could not reload model '%s' after the restart: %s", name, exc)
    if journal.restored:
        for name, record in journal.regions.items():
            try:
                if record["kind"] == "system":
                    host.shm.register_system(name, record["key"], record["offset"], record["byte_size"])
                else:
                    host.shm.register_cuda(name, base64.b64decode(record["raw_handle"]),
                                           record["device_id"], record["byte_size"])
            except Exception as exc:  # noqa: BLE001 - the client may have removed its region
                log.error("could not restore shared-memory region '%s': %s", name, exc)
    host.journal = journal
    host.shm.on_change = _shm_recorder(journal)


def _shm_recorder(journal: Journal):
    def record(action: str, names: list[str], details: dict[str, Any] | None) -> None:
        if action == "register" and details is not None:
            journal.region_registered(names[0], details)
        elif action == "unregister":
            journal.regions_unregistered(names)

    return record
