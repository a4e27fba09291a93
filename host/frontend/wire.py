"""Messages between a front-end process and the engine: framing and the request/response form.

A frame is a pickle (protocol 5) of a tuple; numpy arrays of at least OUT_OF_BAND bytes travel
out of band, after the pickle, so that neither side copies them into or out of the pickle
stream (the receiver's arrays are views of the frame it read). Pickle is fine here: both ends
are this program, on a Unix socket in a folder only the server's user can open.

Frame: "<IQ" (count of out-of-band buffers, pickle length), a "<Q" length per buffer, the
pickle, the buffers.
"""

from __future__ import annotations

import pickle
import socket
import struct
from typing import Any

from host.inference import InferenceRequest, InferenceResponse, RequestedOutput, Tensor

OUT_OF_BAND = 64 * 1024
_HEAD = struct.Struct("<IQ")
_LEN = struct.Struct("<Q")


class Closed(Exception):
    """The other side closed the connection."""


def _dumps(message: tuple) -> tuple[bytes, list[memoryview]]:
    """The pickle, and the views of the arrays that travel out of band."""
    buffers: list[memoryview] = []

    def keep(buffer: pickle.PickleBuffer) -> bool:
        view = buffer.raw()
        if view.nbytes < OUT_OF_BAND:
            return True  # in band: cheaper than another piece for a small array
        buffers.append(view)
        return False

    return pickle.dumps(message, protocol=5, buffer_callback=keep), buffers


def send(sock: socket.socket, message: tuple) -> None:
    send_many(sock, [message])


def send_many(sock: socket.socket, messages: list[tuple]) -> None:
    """Messages in one write."""
    pieces: list[Any] = []
    for message in messages:
        data, views = _dumps(message)
        pieces.append(_HEAD.pack(len(views), len(data)) + b"".join(_LEN.pack(v.nbytes) for v in views))
        pieces.append(data)
        pieces.extend(views)
    if len(pieces) == 2:  # one small message: one buffer
        sock.sendall(pieces[0] + pieces[1])
    else:
        _send_all(sock, pieces)


def _send_all(sock: socket.socket, pieces: list[Any]) -> None:
    pending = [memoryview(p).cast("B") for p in pieces]
    while pending:
        sent = sock.sendmsg(pending[:512])  # IOV_MAX is 1024 on Linux
        while sent:
            first = pending[0]
            if sent >= first.nbytes:
                sent -= first.nbytes
                pending.pop(0)
            else:
                pending[0] = first[sent:]
                sent = 0


class Reader:
    """Reads frames from one socket; `messages()` returns every frame that one read brought (it
    blocks only when none is buffered), so that a busy peer's messages cost one wake-up together.
    Out-of-band buffers are views of the block they were read into: no copy."""

    CHUNK = 256 * 1024

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.block = bytearray(self.CHUNK)
        self.view = memoryview(self.block)
        self.start = 0  # first unparsed byte
        self.end = 0  # end of the data read

    def _fill(self, need: int) -> None:
        """Read until at least `need` bytes are buffered from `start` (one read if some are)."""
        have = self.end - self.start
        if self.start + need > len(self.block):  # move what is left to a new block (arrays may
            size = max(self.CHUNK, need)  # still view the old one: never overwrite it)
            block = bytearray(size)
            block[:have] = self.view[self.start:self.end]
            self.block, self.view, self.start, self.end = block, memoryview(block), 0, have
        while self.end - self.start < need:
            n = self.sock.recv_into(self.view[self.end:])
            if not n:
                raise Closed()
            self.end += n

    def _head(self) -> tuple[int, int, tuple[int, ...]]:
        """(bytes the next frame needs from `start`, as far as the buffer tells, its pickle's
        length, its out-of-band buffers' lengths)."""
        have = self.end - self.start
        if have < _HEAD.size:
            return _HEAD.size, 0, ()
        count, size = _HEAD.unpack_from(self.view, self.start)
        head = _HEAD.size + 8 * count
        if have < head:
            return head, 0, ()
        lengths = struct.unpack_from(f"<{count}Q", self.view, self.start + _HEAD.size) if count else ()
        return head + size + sum(lengths), size, lengths

    def _frame(self) -> tuple | None:
        """The next complete frame in the buffer, or None."""
        total, size, lengths = self._head()
        if self.end - self.start < total or not size:
            return None
        pos = self.start + total - size - sum(lengths)
        data = self.view[pos:pos + size]
        pos += size
        buffers = []
        for n in lengths:
            buffers.append(self.view[pos:pos + n])
            pos += n
        self.start += total
        return pickle.loads(data, buffers=buffers) if lengths else pickle.loads(data)

    def messages(self) -> list[tuple]:
        out = []
        frame = self._frame()
        while frame is None:
            self._fill(self._head()[0])
            frame = self._frame()
        while frame is not None:
            out.append(frame)
            frame = self._frame()
        if self.start == self.end and self.end > len(self.block) // 2:
            # all parsed: start over in a fresh block (arrays may still view this one)
            self.block = bytearray(self.CHUNK)
            self.view = memoryview(self.block)
            self.start = self.end = 0
        return out


# --- the request and response, as tuples ------------------------------------------------------
# Only what a front end sets on a request travels (host.http.codec, host.grpc.codec,
# host.headers, host.http.generate, host.http.openai); everything else is the engine's to fill.

def pack_request(r: InferenceRequest) -> tuple:
    return (r.model_name, r.model_version, r.id,
            [(t.name, t.datatype, t.shape, t.data, t.parameters) for t in r.inputs.values()],
            [(o.name, o.parameters) for o in r.outputs],
            r.parameters, r.protocol, r.uses_shm, r.raw_input, r.trace_context,
            r.sequence_id, r.sequence_start, r.sequence_end, r.priority, r.timeout_us,
            r.enable_empty_final_response)


def unpack_request(p: tuple) -> InferenceRequest:
    (name, version, rid, inputs, outputs, parameters, protocol, uses_shm, raw_input,
     trace_context, seq_id, seq_start, seq_end, priority, timeout_us, empty_final) = p
    return InferenceRequest(
        model_name=name, model_version=version, id=rid,
        inputs={t[0]: Tensor(*t) for t in inputs},
        outputs=[RequestedOutput(n, params) for n, params in outputs],
        parameters=parameters, protocol=protocol, uses_shm=uses_shm, raw_input=raw_input,
        trace_context=trace_context, sequence_id=seq_id, sequence_start=seq_start,
        sequence_end=seq_end, priority=priority, timeout_us=timeout_us,
        enable_empty_final_response=empty_final)


def pack_response(r: InferenceResponse | None) -> tuple | None:
    if r is None:
        return None
    return (r.model_name, r.model_version, r.id,
            [(t.name, t.datatype, t.shape, t.data, t.parameters) for t in r.outputs],
            r.parameters, r.error)


def unpack_response(p: tuple | None) -> InferenceResponse | None:
    if p is None:
        return None
    name, version, rid, outputs, parameters, error = p
    return InferenceResponse(model_name=name, model_version=version, id=rid,
                             outputs=[Tensor(*t) for t in outputs], parameters=parameters,
                             error=error)
