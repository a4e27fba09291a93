"""The control channel between the host and a python model's stub process.

A Unix stream socket (a socketpair, the child's end inherited as a file descriptor). Each message
is a 4-byte little-endian length followed by a pickled tuple whose first item names the message.
Messages are small: tensor bytes travel through the shared-memory arenas (`shm_arena`), and only
their descriptors cross here. Pickle is safe here because both ends are the same program, started
by the host on a private socket.

Messages, host -> child:
- ("init", init_dict)                      once: build and initialize the model instance
- ("exec", batch_id, [request], [free])   run one execute; `free` gives back output blocks
- ("free", [offset])                      output blocks the host no longer views
- ("cancel", [request_key])               requests the client cancelled
- ("fini",)                               finalize and exit

child -> host:
- ("ready", pid) / ("init_error", code, message)
- ("resp", request_key, response, final)   one response sent through a request's sender
- ("done", batch_id, [response] | None)  execute returned (its responses, unless sent already)
- ("fini_done",)
"""

from __future__ import annotations

import pickle
import socket
import struct
import threading
from typing import Any

_HEADER = struct.Struct("<I")


class ChannelClosed(Exception):
    """The other end went away (the socket reached EOF or broke)."""


class Channel:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._send_lock = threading.Lock()

    def send(self, message: tuple[Any, ...]) -> None:
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            with self._send_lock:
                self.sock.sendall(_HEADER.pack(len(payload)) + payload)
        except OSError as exc:
            raise ChannelClosed(str(exc)) from exc

    def recv(self) -> tuple[Any, ...]:
        (size,) = _HEADER.unpack(self._read(_HEADER.size))
        return pickle.loads(self._read(size))

    def ready(self) -> bool:
        """Whether a whole message is waiting (never blocks)."""
        try:
            head = self.sock.recv(_HEADER.size, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            if len(head) < _HEADER.size:
                if not head:
                    raise ChannelClosed("end of stream")
                return False
            (size,) = _HEADER.unpack(head)
            whole = _HEADER.size + size
            return len(self.sock.recv(whole, socket.MSG_PEEK | socket.MSG_DONTWAIT)) == whole
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:
            raise ChannelClosed(str(exc)) from exc

    def _read(self, n: int) -> bytes:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            try:
                k = self.sock.recv_into(view[got:])
            except OSError as exc:
                raise ChannelClosed(str(exc)) from exc
            if k == 0:
                raise ChannelClosed("end of stream")
            got += k
        return bytes(buf)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
