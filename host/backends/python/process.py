"""Process mode of the python backend: each instance runs in a stub process of its own.

Chosen per model (`parameters { key: "EXECUTION_MODE" value { string_value: "process" } }`) or
for every python model (`--backend-config=python,execution-mode=process`); see
docs/process_model.md for the design and why.

`ProcessInstance` is the host side of one instance. It starts `python -m
host.backends.python.stub` (from the worker process that loads the model, never the gunicorn
master), hands it the model, and forwards each execute:

- input tensors are written once into the instance's input arena (`shm_arena`); the child reads
  them as numpy views. A request's input blocks are freed at its final response.
- the child writes outputs into its output arena; the host's response tensors are numpy views of
  it, and a block goes back to the child when the last view of it is garbage-collected.
- one reader thread per child takes its messages: responses (streamed by decoupled models), the
  end of each execute, and the end of the socket when the child dies.

A child that dies (a crash, os._exit, sys.exit in execute) fails the requests it had with
Triton's message ("Stub process '<instance>' is not healthy."), and is started again at the next
execute; a restart that fails fails that execute's requests and is tried again at the next one.
Statistics, metrics, the response cache and model control stay in the host: the scheduler times
`execute` here as for any backend.
"""

from __future__ import annotations

import collections
import json
import itertools
import logging
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from host import affinity
from host import bls as host_bls
from host.backend import Instance, InstanceSpec
from host.backends.python import bls as python_bls
from host.backends.python import custom_metrics, pb_utils, settings
from host.backends.python.backend import _on_host
from host.backends.python.envs import Environment
from host.backends.python.channel import Channel, ChannelClosed
from host.backends.python.shm_arena import Arena
from host.errors import Code, HostError, InternalError, UnavailableError, error_for
from host.inference import InferenceRequest as HostRequest
from host.inference import InferenceResponse as HostResponse
from host.inference import RequestedOutput
from host.inference import Tensor as HostTensor

log = logging.getLogger(__name__)

STUB_MODULE = "host.backends.python.stub"


FINALIZE_TIMEOUT_S = 30.0
_POLL_S = 0.1  # how often the reader looks for cancelled requests and blocks to give back


def _code_name(code: int) -> str:
    """The host's error code named by a pb_utils.TritonError code."""
    try:
        return Code[pb_utils._ErrorCode(code).name].name
    except (KeyError, ValueError):
        return Code.INTERNAL.name


class _Pending:
    """One request in the child: its host request and its input blocks."""

    __slots__ = ("blocks", "cancel_sent", "request")

    def __init__(self, request: HostRequest, blocks: list[int]) -> None:
        self.request = request
        self.blocks = blocks
        self.cancel_sent = False


class _Batch:
    """An execute waiting for the child's "done"."""

    __slots__ = ("event", "failed", "keys", "responses")

    def __init__(self, keys: list[int]) -> None:
        self.keys = keys  # its requests' keys
        self.event = threading.Event()
        self.responses: list[Any] | None = None
        self.failed = False


class _Child:
    """One stub process and what is in flight with it (a restart makes a new one)."""

    def __init__(self, owner: ProcessInstance, proc: subprocess.Popen, channel: Channel,
                 in_arena: Arena, out_arena: Arena, pid: int) -> None:
        self.owner = owner
        self.proc = proc
        self.channel = channel
        self.in_arena = in_arena
        self.out_arena = out_arena
        self.pid = pid
        self.lock = threading.Lock()
        self.pending: dict[int, _Pending] = {}
        self.batches: dict[int, _Batch] = {}
        self.to_free: collections.deque[int] = collections.deque()  # output blocks to give back
        self.held: tuple[Any, ...] = ()  # the instances the caller of the current execute holds
        self.bls_calls: dict[int, Any] = {}  # the child's BLS calls in flight, by its id
        self.metrics: list[Any] = []  # its custom metrics (pb_utils._custom_metric_families)
        custom_metrics.sources.add(self)
        self.dead = False
        self.finishing = False
        self.fini_done = threading.Event()
        self.reader = threading.Thread(target=self._read_loop, daemon=True,
                                       name=f"python-stub-{owner.name}")

    # --- reader thread ---

    def _read_loop(self) -> None:
        affinity.pin()  # it hands responses (and the GIL) to the front end's threads: same CPU
        sock = self.channel.sock
        next_chores = time.monotonic() + _POLL_S
        try:
            while True:
                ready, _, _ = select.select([sock], [], [], _POLL_S)
                if ready:
                    self._dispatch(self.channel.recv())
                now = time.monotonic()
                if now >= next_chores:  # also when messages never stop (a long stream)
                    next_chores = now + _POLL_S
                    self._housekeeping()
        except ChannelClosed:
            pass
        except Exception:
            log.exception("python stub '%s': control channel failed", self.owner.name)
        self._died()

    def _housekeeping(self) -> None:
        frees = self._take_frees()
        cancels = []
        with self.lock:
            for key, p in self.pending.items():
                if not p.cancel_sent and p.request.cancelled:
                    p.cancel_sent = True
                    cancels.append(key)
        if frees:
            self.channel.send(("free", frees))
        if cancels:
            self.channel.send(("cancel", cancels))

    def _take_frees(self) -> list[int]:
        frees = []
        while self.to_free:
            frees.append(self.to_free.popleft())
        return frees

    def _dispatch(self, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "resp":
            _, key, wire, final = msg
            with self.lock:
                p = self.pending.pop(key, None) if final else self.pending.get(key)
            if p is None:
                return
            if final:
                self._free_inputs(p)
            p.request.respond(None if wire is None else self.response(wire, p.request), final)
        elif kind == "done":
            _, batch_id, responses = msg
            with self.lock:
                batch = self.batches.pop(batch_id, None)
                if batch is not None and responses is not None:
                    # Answered by this message: a death of the child from now on is not theirs.
                    for key in batch.keys:
                        self.pending.pop(key, None)
            if batch is not None:
                batch.responses = responses
                batch.event.set()
        elif kind == "fini_done":
            self.fini_done.set()
        else:
            self.dispatch_call(msg)

    # --- BLS and model control from the child (host.backends.python.stub._RemoteBLS) ---

    CALL_KINDS = frozenset({"bls", "bls_cancel", "ctl", "free_in", "metrics"})

    def dispatch_call(self, msg: tuple[Any, ...], inline: bool = False) -> None:
        """A call from the model. It runs on a pool thread (the callee may run on the submitting
        thread, and this reader must keep reading), or on this thread when `inline`: during the
        child's initialize, on the thread that loads the model, which holds the repository
        lock that a model control call needs."""
        kind = msg[0]
        if kind == "metrics":  # the model's custom metrics, exported with the server's
            self.metrics = msg[1]
        elif kind == "free_in":
            for offset in msg[1]:
                self.in_arena.free(offset)
        elif kind == "bls_cancel":
            call = self.bls_calls.get(msg[1])
            if call is not None:
                call.request.cancel()
        elif kind in ("bls", "ctl"):
            run = self._run_bls if kind == "bls" else self._run_control
            if inline:
                run(*msg[1:])
            else:
                python_bls._executor.submit(run, *msg[1:])

    def _run_bls(self, call_id: int, wire: dict[str, Any], decoupled: bool) -> None:
        inputs = wire["inputs"]
        views: dict[str, HostTensor] = {}

        def make_request() -> HostRequest:
            release = self.to_free.append  # the child's blocks go back once the host lets go
            for name, ref in inputs:
                views[name] = HostTensor(name=name, datatype=ref[0], shape=list(ref[1]),
                                         data=self.out_arena.view(ref, release))
            flags, parameters = wire["flags"], wire["parameters"]
            return HostRequest(
                model_name=wire["model_name"], model_version=wire["model_version"],
                id=wire["id"], inputs=views, outputs=[RequestedOutput(n) for n in wire["outputs"]],
                parameters=json.loads(parameters) if parameters not in ("", "{}") else {},
                sequence_id=wire["correlation_id"],
                sequence_start=bool(flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START),
                sequence_end=bool(flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END),
                timeout_us=wire["timeout"], held=self.held)

        token = host_bls.HELD.set(self.held)
        try:
            started = python_bls.start(wire["model_name"], wire["model_version"], make_request,
                                       decoupled)
        except Exception as exc:  # noqa: BLE001 - the model waits for an answer: it gets one
            started = python_bls._error_response(f"BLS request failed: {exc}")
        finally:
            host_bls.HELD.reset(token)
        if not views:  # refused before the request was made: its input blocks are free now
            self.to_free.extend(ref[2][1] for _, ref in inputs if ref[2][0] != "i")
        if isinstance(started, pb_utils.InferenceResponse):  # refused: an error response
            error = started.error()
            why = ((_code_name(error.code()), error.message()) if error is not None
                   else (Code.INTERNAL.name, "BLS request failed"))
            self._send_call(("bls_resp", call_id, (None, why, []), True))
            return
        self.bls_calls[call_id] = started
        try:
            final = False
            while not final:
                response, final = started.responses.get()
                wire_response = None
                if response is not None:
                    error = response.error
                    outputs = []
                    if error is None:
                        for t in response.outputs:
                            ref, _ = self.in_arena.write(t.datatype, _on_host(t.data))
                            outputs.append((t.name, ref))
                    wire_response = (response.parameters or None, None if error is None
                                     else (error.code.name, error.message), outputs)
                if not self._send_call(("bls_resp", call_id, wire_response, final)):
                    started.request.cancel()  # the caller is gone
                    return
        finally:
            self.bls_calls.pop(call_id, None)

    def _run_control(self, call_id: int, op: str, args: tuple[Any, ...]) -> None:
        if op not in ("model_ready", "load_model", "unload_model"):
            answer: tuple[Any, ...] = ("error", "INVALID_ARG", f"unknown model control '{op}'")
        else:
            token = host_bls.HELD.set(self.held)
            try:
                answer = ("ok", getattr(host_bls, op)(*args))
            except HostError as exc:
                answer = ("error", exc.code.name, exc.message)
            except Exception as exc:  # noqa: BLE001 - the model waits for an answer
                answer = ("error", "INTERNAL", str(exc))
            finally:
                host_bls.HELD.reset(token)
        self._send_call(("ctl_done", call_id, answer))

    def _send_call(self, msg: tuple[Any, ...]) -> bool:
        try:
            self.channel.send(msg)
            return True
        except ChannelClosed:
            return False

    def metric_families(self) -> list[Any]:
        return self.metrics

    def _died(self) -> None:
        """The socket closed: fail everything in flight, wake every waiting execute."""
        custom_metrics.sources.discard(self)  # its metrics go with it, as a stub's in Triton
        with self.lock:
            self.dead = True
            pending = list(self.pending.values())
            self.pending.clear()
            batches = list(self.batches.values())
            self.batches.clear()
        name = self.owner.name
        if not self.finishing:
            try:
                code = self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                code = self.proc.wait()
            log.error("Stub process '%s' (pid %d) is not healthy: it exited with status %s; "
                      "%d request(s) failed; it is started again at the next request",
                      name, self.pid, code, len(pending))
        message = (f"Failed to process the request(s) for model instance '{name}', message: "
                   f"Stub process '{name}' is not healthy.")
        for p in pending:
            self._free_inputs(p)
            if not p.request.completed:
                p.request.respond(self.owner.error_response(InternalError(message), p.request), True)
        for b in batches:
            b.failed = True
            b.event.set()
        self.fini_done.set()

    # --- conversions ---

    def _free_inputs(self, p: _Pending) -> None:
        for offset in p.blocks:
            self.in_arena.free(offset)
        p.blocks = []

    def response(self, wire: tuple[Any, ...], request: HostRequest) -> HostResponse:
        rid, parameters, error, outputs = wire
        spec = self.owner.model.spec
        response = HostResponse(model_name=spec.name, model_version=str(spec.version), id=rid)
        if parameters:
            response.parameters = parameters
        if error is not None:
            try:
                code = Code[error[0]]
            except KeyError:
                code = Code.INTERNAL
            response.error = error_for(code, error[1])
            return response
        release = self.to_free.append
        for name, ref in outputs:
            data = self.out_arena.view(ref, release)
            response.outputs.append(HostTensor(name=name, datatype=ref[0], shape=list(ref[1]),
                                               data=data))
        return response


class ProcessInstance(Instance):
    """A python model instance whose model runs in a stub process."""

    _keys = itertools.count(1)

    def __init__(self, model: Any, spec: InstanceSpec, arena_bytes: int = settings.DEFAULT_ARENA_BYTES,
                 environment: Environment | None = None) -> None:
        self.model = model
        self.environment = environment  # EXECUTION_ENV_PATH: the stub runs in it (host.backends.python.envs)
        self.spec = spec
        self.name = spec.name
        self.arena_bytes = arena_bytes
        self.child: _Child | None = None
        self._start_lock = threading.Lock()
        self._finalized = False

    # --- lifecycle ---

    def initialize(self) -> None:
        self.child = self._start()

    def ready_check(self) -> str:
        """Asked on every model-readiness request (host.core): a stub that died is not ready
        until a request starts it again (the model's own is_ready() is not asked in this mode)."""
        child = getattr(self, "child", None)
        if child is None or child.dead or child.proc.poll() is not None:
            return f"Stub process '{self.name}' is not healthy."
        return ""

    def _start(self) -> _Child:
        mspec = self.model.spec
        in_arena = Arena.create(self.arena_bytes, "in")
        out_arena = Arena.create(self.arena_bytes, "out")
        host_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # A restart runs on an execute's thread, which may be on the Python CPU: the stub must
        # not inherit that (host.affinity), it is there to use another core.
        widened = affinity.widen()
        try:
            # The stub's command line names Triton's stub binary and the instance, so that
            # tools that find Triton's stubs by name (`pgrep -f triton_python_backend_stub`,
            # as Triton's QA scripts do) find these (the stub reads only its first argument).
            args = (str(child_end.fileno()), "triton_python_backend_stub", self.name)
            env = self.environment
            proc = subprocess.Popen(
                [sys.executable, "-m", STUB_MODULE, *args] if env is None
                else env.command(STUB_MODULE, *args),
                env=None if env is None else env.variables(),
                pass_fds=[child_end.fileno()], stdin=subprocess.DEVNULL)
        except BaseException:
            for a in (in_arena, out_arena):
                a.unlink()
            host_end.close()
            raise
        finally:
            if widened:
                affinity.pin()
            child_end.close()
        channel = Channel(host_end)
        child = _Child(self, proc, channel, in_arena, out_arena, proc.pid)
        try:
            channel.send(("init", {
                "in_arena": (in_arena.name, in_arena.size),
                "out_arena": (out_arena.name, out_arena.size),
                "name": mspec.name, "version": mspec.version,
                "repository": mspec.repository, "path": mspec.path,
                "config": mspec.config.SerializeToString(),
                "backend_model": self.model.backend_model,  # a python-based backend's model.py
                "instance": {"name": self.spec.name, "kind": self.spec.kind,
                             "device_id": self.spec.device_id, "group": self.spec.group},
                "log_level": logging.getLogger().getEffectiveLevel(),
            }))
            reply = channel.recv()  # the model's initialize may take long: no deadline
            while reply[0] in _Child.CALL_KINDS:  # BLS or model control from its initialize
                child.dispatch_call(reply, inline=True)
                reply = channel.recv()
        except ChannelClosed:
            reply = ("init_error", "INTERNAL", f"Stub process '{self.name}' is not healthy.")
        finally:
            # Both sides have mapped the arenas (or the child is gone): drop the names now so
            # that nothing is left in /dev/shm whatever happens later.
            in_arena.unlink()
            out_arena.unlink()
        if reply[0] != "ready":
            channel.close()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            in_arena.close()
            out_arena.close()
            try:
                code = Code[reply[1]]
            except KeyError:
                code = Code.INTERNAL
            raise error_for(code, reply[2])
        child.pid = reply[1]
        child.reader.start()
        log.info("python model '%s' instance '%s' runs in process %d", mspec.name, self.name, child.pid)
        return child

    def _live_child(self) -> _Child:
        """The running child, started again if it died (raises when that fails)."""
        with self._start_lock:
            child = self.child
            if child is not None and not child.dead:
                return child
            if self._finalized:
                raise UnavailableError(f"model instance '{self.name}' is unloading")
            if child is not None:
                self._close_child(child)
            self.child = None
            try:
                self.child = self._start()
            except HostError as exc:
                raise InternalError(f"Stub process '{self.name}' failed to restart: {exc}") from exc
            log.warning("Stub process '%s' was started again (pid %d)", self.name, self.child.pid)
            return self.child

    def finalize(self) -> None:
        with self._start_lock:
            self._finalized = True
            child, self.child = self.child, None
        if child is None:
            return
        if not child.dead:
            child.finishing = True
            try:
                child.channel.send(("fini",))
            except ChannelClosed:
                pass
            if not child.fini_done.wait(FINALIZE_TIMEOUT_S):
                log.error("Stub process '%s' did not finalize within %.0f s: killed",
                          self.name, FINALIZE_TIMEOUT_S)
        self._close_child(child)

    @staticmethod
    def _close_child(child: _Child) -> None:
        """Wait for (or kill) the process; its socket's end then ends the reader thread, and
        only then is the socket closed (never under the reader's feet)."""
        try:
            child.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            child.proc.kill()
            child.proc.wait()
        if child.reader.is_alive() and child.reader is not threading.current_thread():
            child.reader.join(timeout=5)
        child.channel.close()
        child.in_arena.close()
        child.out_arena.close()

    @property
    def pid(self) -> int | None:
        child = self.child
        return None if child is None else child.pid

    # --- execute ---

    def execute(self, requests: Sequence[HostRequest]) -> Sequence[HostResponse] | None:
        try:
            child = self._live_child()
        except HostError as exc:
            message = (f"Failed to process the request(s) for model instance '{self.name}', "
                       f"message: {exc.message}")
            log.error("%s", message)
            return [self.error_response(InternalError(message), r) for r in requests]
        wire = []
        entries = []
        key_of = self._keys
        arena = child.in_arena
        requested_default = self.model.output_names
        for r in requests:
            blocks = []
            inputs = []
            for name, t in r.inputs.items():
                ref, offset = arena.write(t.datatype, _on_host(t.data))
                if offset is not None:
                    blocks.append(offset)
                inputs.append((name, ref))
            key = next(key_of)
            entries.append((key, _Pending(r, blocks)))
            wire.append({
                "key": key, "id": r.id, "inputs": inputs,
                "outputs": r.requested_output_names or requested_default,
                "parameters": r.parameters, "sequence_id": r.sequence_id,
                "sequence_start": r.sequence_start, "sequence_end": r.sequence_end,
                "timeout_us": r.timeout_us, "cancelled": r.cancelled,
                # Implicit state: outputs named after a state go back to the sequence batcher.
                "states": list(r.sequence_states.by_output) if r.sequence_states is not None else []})
        batch = _Batch([key for key, _ in entries])
        batch_id = next(key_of)
        with child.lock:
            dead = child.dead
            if not dead:
                child.pending.update(entries)
                child.batches[batch_id] = batch
        if dead:
            for _, p in entries:
                child._free_inputs(p)
            return self._unhealthy(requests)
        child.held = host_bls.HELD.get()  # for the BLS calls this execute makes (deadlock rule)
        try:
            child.channel.send(("exec", batch_id, wire, child._take_frees()))
        except ChannelClosed:
            pass  # the reader sees the end of the socket and fails these requests
        batch.event.wait()
        if batch.failed or batch.responses is None:
            return None  # the requests were answered (failed) already
        responses = []
        for (_, entry), wire_response in zip(entries, batch.responses):
            child._free_inputs(entry)
            responses.append(child.response(wire_response, entry.request))
        return responses

    def _unhealthy(self, requests: Sequence[HostRequest]) -> list[HostResponse]:
        message = (f"Failed to process the request(s) for model instance '{self.name}', message: "
                   f"Stub process '{self.name}' is not healthy.")
        return [self.error_response(InternalError(message), r) for r in requests]

    def error_response(self, error: HostError, request: HostRequest) -> HostResponse:
        spec = self.model.spec
        response = HostResponse(model_name=spec.name, model_version=str(spec.version), id=request.id)
        response.error = error
        return response
