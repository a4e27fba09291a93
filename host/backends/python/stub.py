"""The stub process of a python model instance in process mode (`python -m host.backends.python.stub FD`).

Started by `host.backends.python.process` with its end of the control socket as file descriptor
FD. It runs the model with the same code as the in-process backend (`PythonModel` and
`PythonInstance` of `host.backends.python.backend`), so both modes behave alike; only the way
requests arrive and responses leave differs:

- inputs are numpy views of the host's input arena (no copy), BYTES rebuilt from the arena;
- each response's outputs are written once into this process's output arena, and the host views
  them there; the host tells us when a block is free again;
- a request's responses are sent as they come (decoupled models stream), the responses returned by
  a non-decoupled execute travel with the "done" message of the batch.

The main thread reads the control socket while it waits for work and runs each execute itself,
so a request costs no thread hand-off here. The stub exits when the control socket closes (the
host died or dropped it), when its parent process changes (the server died during a long execute),
after "fini", or when the model calls sys.exit / os._exit: the host notices the closed socket
either way.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import queue
import signal
import socket
import sys
import threading
import time
from typing import Any

from host import bls as host_bls
from host.backend import InstanceSpec, ModelSpec
from host.backends.python import bls as python_bls
from host.backends.python import pb_utils
from host.backends.python.channel import Channel, ChannelClosed
from host.backends.python.shm_arena import Arena
from host.errors import Code, HostError, error_for
from host.inference import InferenceRequest, InferenceResponse, RequestedOutput, Tensor

log = logging.getLogger("host.backends.python.stub")

class _RemoteQueue:
    """A BLS call's responses in the stub. Waiting for one reads the control socket when no
    other thread does (the main thread may be the one waiting, inside execute)."""

    def __init__(self, stub: Stub) -> None:
        self.stub = stub
        self.items: queue.SimpleQueue = queue.SimpleQueue()

    def put(self, item: tuple[Any, bool]) -> None:
        self.items.put(item)

    def get(self) -> tuple[Any, bool]:
        stub = self.stub
        while True:
            try:
                return self.items.get_nowait()
            except queue.Empty:
                pass
            if stub.read_lock.acquire(blocking=False):
                msg = None
                try:
                    # Nobody else reads while we hold the lock: an empty queue stays empty
                    # until this thread reads the message that fills it.
                    if self.items.empty():
                        msg = stub.channel.recv()
                        if stub._handle(msg):
                            msg = None
                except ChannelClosed:
                    os._exit(0)
                finally:
                    stub.read_lock.release()
                if msg is not None:
                    if msg[0] == "exec" and threading.current_thread() is threading.main_thread():
                        # The server runs a call back into this instance on it (the recursion
                        # rule of host.bls): the caller waits in this call, so run it here.
                        stub.execute(msg)
                    else:
                        stub.backlog.append(msg)
            else:
                try:  # another thread reads the socket: it hands our responses over
                    return self.items.get(timeout=0.005)
                except queue.Empty:
                    pass


class _RemoteCall:
    """A BLS call sent to the server; what `host.backends.python.bls` expects of a call."""

    def __init__(self, stub: Stub, call_id: int) -> None:
        self.responses = _RemoteQueue(stub)
        self.request = self  # `.request.cancel()` stops the callee
        self.stub, self.call_id = stub, call_id

    def cancel(self) -> None:
        self.stub.channel.send(("bls_cancel", self.call_id))


class _RemoteBLS:
    """BLS and model control from a model in this stub: each call is a message to the server
    process (host.backends.python.process runs it there and streams the responses back). Input
    tensors go through this stub's output arena and response tensors come in its input arena,
    so neither is copied through the socket."""

    def __init__(self, stub: Stub) -> None:
        self.stub = stub
        self.ids = itertools.count(1)
        self.calls: dict[int, _RemoteQueue] = {}
        self.lock = threading.Lock()

    def install(self) -> None:
        python_bls.starter = self.start
        host_bls.model_ready = lambda name, version=-1: self.control("model_ready", name, version)
        host_bls.load_model = lambda name, config=None, files=None: self.control(
            "load_model", name, config, files)
        host_bls.unload_model = lambda name, unload_dependents=False: self.control(
            "unload_model", name, unload_dependents)

    def start(self, call: Any, decoupled: bool) -> _RemoteCall:
        stub = self.stub
        inputs = []
        for t in call._inputs:
            if not isinstance(t, pb_utils.Tensor):
                raise pb_utils.TritonModelException(
                    f"InferenceRequest inputs must be pb_utils.Tensor objects, found type {type(t)}")
            data = t._array if t._datatype != "BYTES" else pb_utils._as_bytes_object_array(t._array)
            ref, _ = stub.out_arena.write(t._datatype, data)  # given back by the server's "free"
            inputs.append((t._name, ref))
        call_id = next(self.ids)
        remote = _RemoteCall(stub, call_id)
        with self.lock:
            self.calls[call_id] = remote.responses
        stub.send(("bls", call_id, {
            "model_name": call._model_name, "model_version": int(call._model_version),
            "id": call._request_id, "inputs": inputs,
            "outputs": list(call._requested_output_names), "parameters": call._parameters,
            "correlation_id": call._correlation_id, "flags": int(call._flags),
            "timeout": int(call._timeout)}, decoupled))
        return remote

    def deliver(self, call_id: int, wire: tuple[Any, ...] | None, final: bool) -> None:
        """A response of call `call_id` (from `_handle`, on whichever thread reads)."""
        with self.lock:
            responses = self.calls.pop(call_id, None) if final else self.calls.get(call_id)
        if responses is None:
            return
        response = None
        if wire is not None:
            parameters, error, outputs = wire
            response = InferenceResponse(parameters=parameters or {})
            if error is not None:
                response.error = error_for(Code[error[0]], error[1])
            arena, release = self.stub.in_arena, self.stub.in_frees.append
            for name, ref in outputs:
                response.outputs.append(Tensor(name=name, datatype=ref[0], shape=list(ref[1]),
                                               data=arena.view(ref, release)))
        responses.put((response, final))

    def control(self, op: str, *args: Any) -> Any:
        """Model control on the server (is_model_ready, load_model, unload_model)."""
        call_id = next(self.ids)
        responses = _RemoteQueue(self.stub)
        with self.lock:
            self.calls[call_id] = responses
        self.stub.send(("ctl", call_id, op, args))
        answer, _ = responses.get()
        if answer[0] == "error":
            raise error_for(Code[answer[1]], answer[2])
        return answer[1]

    def answered(self, call_id: int, answer: tuple[Any, ...]) -> None:
        with self.lock:
            responses = self.calls.pop(call_id, None)
        if responses is not None:
            responses.put((answer, True))


class _StateOutputs:
    """What the python backend needs of a sequence's implicit state here: the output names that
    carry the state's next value (the host's sequence batcher takes them from the response)."""

    def __init__(self, by_output: frozenset[str]) -> None:
        self.by_output = by_output


class _StubRequest(InferenceRequest):
    """A request in the stub: asking whether it is cancelled reads what the host sent meanwhile."""

    key = 0
    drain: Any = None

    def is_cancelled(self) -> bool:
        if not self.cancelled and self.drain is not None:
            self.drain()
        return self.cancelled


def _exit_with_parent(parent: int) -> None:
    """A watchdog: the stub ends when the server process is gone, even inside a long execute
    (when nobody reads the socket). Re-parenting is the sign: no signal, no race with threads."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


class Stub:
    def __init__(self, channel: Channel, init: dict[str, Any]) -> None:
        from host.backends.python.backend import PythonInstance, PythonModel
        from host.proto import model_config_pb2

        self.channel = channel
        self.in_arena = Arena.attach(*init["in_arena"])
        self.out_arena = Arena.attach(*init["out_arena"])
        config = model_config_pb2.ModelConfig.FromString(init["config"])
        spec = ModelSpec(name=init["name"], version=init["version"], repository=init["repository"],
                         path=init["path"], config=config, backend="python")
        self.model = PythonModel(spec)
        self.model.backend_model = init.get("backend_model")  # a python-based backend's model.py
        self.model.in_stub = True
        self.model.initialize()
        self.instance = PythonInstance(self.model, InstanceSpec(**init["instance"]))
        self.instance.exit_ends_process = True  # sys.exit() in execute ends this stub
        self.live: dict[int, InferenceRequest] = {}  # request key -> request, until its final
        self.live_lock = threading.Lock()
        self.read_lock = threading.Lock()
        self.backlog: collections.deque[tuple[Any, ...]] = collections.deque()
        # input-arena blocks of BLS responses no longer viewed, for the server to take back
        self.in_frees: collections.deque[int] = collections.deque()
        self.remote = _RemoteBLS(self)
        self.metrics_sent: list[Any] = []  # the custom metrics as the server last heard them

    # --- receiving ---
    # The main thread reads the socket while it waits for work (no thread hand-off per request).
    # While it executes, whoever asks whether a request is cancelled or sends a response drains
    # what has arrived meanwhile (`_drain`): cancels, and output blocks the host gave back.

    def _handle(self, msg: tuple[Any, ...]) -> bool:
        """Apply a free or cancel message; False for work (exec, fini) left to the main loop."""
        kind = msg[0]
        if kind == "free":
            for offset in msg[1]:
                self.out_arena.free(offset)
        elif kind == "cancel":
            with self.live_lock:
                for key in msg[1]:
                    request = self.live.get(key)
                    if request is not None:
                        request.cancel()
        elif kind == "bls_resp":
            self.remote.deliver(msg[1], msg[2], msg[3])
        elif kind == "ctl_done":
            self.remote.answered(msg[1], msg[2])
        else:
            return False
        return True

    def send(self, msg: tuple[Any, ...]) -> None:
        """Send `msg`, after the input-arena blocks of BLS responses the model let go of and
        the model's custom metrics when they changed (so a client that has its response sees
        them on /metrics)."""
        if pb_utils._FAMILIES:
            metrics = pb_utils._custom_metric_families()
            if metrics != self.metrics_sent:
                self.channel.send(("metrics", metrics))
                self.metrics_sent = metrics
        if self.in_frees:
            frees = []
            while self.in_frees:
                frees.append(self.in_frees.popleft())
            self.channel.send(("free_in", frees))
        self.channel.send(msg)

    def _next_work(self) -> tuple[Any, ...]:
        while True:
            if self.backlog:
                return self.backlog.popleft()
            with self.read_lock:
                # Looked at again under the lock: another reader (a response callback draining,
                # a BLS call waiting) may have put work there while this thread waited for it.
                if self.backlog:
                    return self.backlog.popleft()
                msg = self.channel.recv()  # the host gone: ChannelClosed ends the process
                if not self._handle(msg):
                    return msg

    def _drain(self) -> None:
        if not self.read_lock.acquire(blocking=False):
            return  # the main thread is reading: it applies what comes
        try:
            while self.channel.ready():
                msg = self.channel.recv()
                if not self._handle(msg):
                    self.backlog.append(msg)
        except ChannelClosed:
            os._exit(0)
        finally:
            self.read_lock.release()

    # --- executing (main thread) ---

    def serve(self) -> None:
        while True:
            msg = self._next_work()
            if msg[0] == "fini":
                self.instance.finalize()
                self.channel.send(("fini_done",))
                return
            self.execute(msg)

    def execute(self, msg: tuple[Any, ...]) -> None:
        """Run one "exec" message: the batch's requests, then "done"."""
        _, batch_id, wire_requests, frees = msg
        for offset in frees:
            self.out_arena.free(offset)
        requests = [self._request(w) for w in wire_requests]  # _StubRequest each
        result = self.instance.execute(requests)  # SystemExit ends the process: intended
        encoded = None
        if result is not None:
            encoded = [self._encode(r) for r in result]
            with self.live_lock:
                for r in requests:
                    self.live.pop(r.key, None)
        self.send(("done", batch_id, encoded))

    def _request(self, w: dict[str, Any]) -> _StubRequest:
        key = w["key"]
        inputs = {name: Tensor(name=name, datatype=ref[0], shape=list(ref[1]),
                               data=self.in_arena.view(ref))
                  for name, ref in w["inputs"]}
        request = _StubRequest(
            model_name=self.model.spec.name, model_version=self.model.spec.version, id=w["id"],
            inputs=inputs, outputs=[RequestedOutput(n) for n in w["outputs"]],
            parameters=w["parameters"], sequence_id=w["sequence_id"],
            sequence_start=w["sequence_start"], sequence_end=w["sequence_end"],
            timeout_us=w["timeout_us"], cancelled=w["cancelled"])
        request.key, request.drain = key, self._drain
        if w["states"]:  # the state outputs the model produces: kept, not pruned (host.sequence)
            request.sequence_states = _StateOutputs(frozenset(w["states"]))
        send, encode, live, lock, drain = (self.send, self._encode, self.live,
                                           self.live_lock, self._drain)

        def callback(response: InferenceResponse | None, final: bool) -> None:
            drain()  # take back output blocks before writing more
            if final:
                with lock:
                    live.pop(key, None)
            send(("resp", key, None if response is None else encode(response), final))

        request.callback = callback
        with lock:
            live[key] = request
        return request

    def _encode(self, response: InferenceResponse) -> tuple[Any, ...]:
        error = None
        if response.error is not None:
            error = (response.error.code.name, response.error.message)
        outputs = []
        for t in response.outputs:
            ref, _ = self.out_arena.write(t.datatype, t.data)
            outputs.append((t.name, ref))
        return (response.id, response.parameters or None, error, outputs)


def main(argv: list[str]) -> None:
    # Ctrl-C or SIGTERM sent to the server's process group is for the server: it drains its
    # requests, then finalizes this stub through the control channel.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True,
                     name="stub-watchdog").start()
    channel = Channel(socket.socket(fileno=int(argv[0])))
    from host.backends.python.backend import triton_stub_argv

    triton_stub_argv()
    try:
        _, init = channel.recv()
    except ChannelClosed:
        os._exit(0)
    logging.basicConfig(level=init.get("log_level", logging.INFO), stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s [stub {init['instance']['name']} "
                               "pid %(process)d] %(name)s: %(message)s")
    try:
        stub = Stub(channel, init)
        # No server in this process: BLS calls and model control go to the server's.
        stub.remote.install()
        stub.instance.initialize()
    except HostError as exc:
        channel.send(("init_error", exc.code.name, exc.message))
        os._exit(1)
    except BaseException as exc:  # noqa: BLE001 - SystemExit in initialize too: the host must hear why
        channel.send(("init_error", "INTERNAL", f"{type(exc).__name__}: {exc}"))
        os._exit(1)
    stub.send(("ready", os.getpid()))
    try:
        stub.serve()
    except SystemExit as exc:
        log.error("python model '%s' called sys.exit(%s) in execute", init["name"], exc.code)
        os._exit(exc.code if isinstance(exc.code, int) else 1)
    except ChannelClosed:
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
