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
import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import Any

from host import bls as host_bls
from host.backend import InstanceSpec, ModelSpec
from host.backends.python import pb_utils
from host.backends.python.channel import Channel, ChannelClosed
from host.backends.python.shm_arena import Arena
from host.errors import HostError, UnavailableError
from host.inference import InferenceRequest, InferenceResponse, RequestedOutput, Tensor

log = logging.getLogger("host.backends.python.stub")

BLS_REFUSED = ("BLS is not available to a python model that runs in its own process "
               "(EXECUTION_MODE 'process'): run this model in-process (EXECUTION_MODE 'thread')")


def _refuse_bls(*args: Any, **kwargs: Any) -> Any:
    raise pb_utils.TritonModelException(BLS_REFUSED)


def _no_server() -> Any:
    raise UnavailableError(BLS_REFUSED)


async def _refuse_bls_async(*args: Any, **kwargs: Any) -> Any:
    raise pb_utils.TritonModelException(BLS_REFUSED)


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
        self.model.in_stub = True
        self.model.initialize()
        self.instance = PythonInstance(self.model, InstanceSpec(**init["instance"]))
        self.instance.exit_ends_process = True  # sys.exit() in execute ends this stub
        self.live: dict[int, InferenceRequest] = {}  # request key -> request, until its final
        self.live_lock = threading.Lock()
        self.read_lock = threading.Lock()
        self.backlog: collections.deque[tuple[Any, ...]] = collections.deque()

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
        else:
            return False
        return True

    def _next_work(self) -> tuple[Any, ...]:
        while True:
            if self.backlog:
                return self.backlog.popleft()
            with self.read_lock:
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
            self.channel.send(("done", batch_id, encoded))

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
        channel, encode, live, lock, drain = (self.channel, self._encode, self.live,
                                              self.live_lock, self._drain)

        def callback(response: InferenceResponse | None, final: bool) -> None:
            drain()  # take back output blocks before writing more
            if final:
                with lock:
                    live.pop(key, None)
            channel.send(("resp", key, None if response is None else encode(response), final))

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
    # No server in this process: BLS and model control from the model are refused clearly.
    host_bls.server = _no_server
    pb_utils.InferenceRequest.exec = _refuse_bls  # type: ignore[method-assign]
    pb_utils.InferenceRequest.async_exec = _refuse_bls_async  # type: ignore[method-assign]
    try:
        stub = Stub(channel, init)
        stub.instance.initialize()
    except HostError as exc:
        channel.send(("init_error", exc.code.name, exc.message))
        os._exit(1)
    except BaseException as exc:  # noqa: BLE001 - SystemExit in initialize too: the host must hear why
        channel.send(("init_error", "INTERNAL", f"{type(exc).__name__}: {exc}"))
        os._exit(1)
    channel.send(("ready", os.getpid()))
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
