"""One trace: the activities of a sampled request, Triton's JSON form of it, and the trace file."""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from host.trace.config import TENSORS, TIMESTAMPS

if TYPE_CHECKING:
    from host.inference import InferenceResponse, InferenceRequest, Tensor
    from host.trace.manager import TraceSetting

log = logging.getLogger(__name__)


_ids = itertools.count(1)  # trace ids, as Triton's: 1, 2, ... for the server's life


class Trace:
    """The record of one sampled request: its activities in order, then written or exported."""

    __slots__ = ("id", "setting", "model_name", "model_version", "request_id", "stamps",
                 "tensors", "wall_offset", "compute_open", "parent", "executing", "answered_ns", "end_ns",
                 "_pending", "_lock", "_sent")

    def __init__(self, setting: TraceSetting, request: InferenceRequest, version: int) -> None:
        self.id = next(_ids)
        self.setting = setting
        self.model_name = request.model_name
        self.model_version = version  # the version that serves it, as Triton reports
        self.request_id = request.id
        self.stamps: list[tuple[str, int]] = []
        self.tensors: list[tuple[str, Tensor]] = []
        # steady clock -> wall clock, taken once (OpenTelemetry wants wall-clock times, as Triton's
        # time_offset_ does)
        self.wall_offset = time.time_ns() - time.perf_counter_ns()
        self.compute_open = False
        self.parent: Any = None  # a propagated OpenTelemetry context, if the request had one
        # Set while its execute runs: a final response sent from inside the execute (a native
        # backend's) ends the trace only once the execute's compute stamps are in (`compute`),
        # as Triton writes a trace when the backend releases the request.
        self.executing = False
        self.answered_ns = self.end_ns = 0
        # What is still to come before the trace is written: the request's end, and the front
        # end's send activities when it stamped its receive ones (request.frontend_trace).
        self._pending = 1
        self._lock: threading.Lock | None = None
        self._sent: tuple[str, ...] = ()
        if request.frontend_trace:
            self.stamps += request.frontend_trace
            self._pending, self._lock = 2, threading.Lock()

    def compute(self, start: int, input_end: int, output_start: int) -> None:
        """The execute that served the request (called by the scheduler after the execute)."""
        self.executing = False
        if self.end_ns:  # answered during the execute: the stamps go before the response's
            answered = self.answered_ns or output_start
            names = [name for name, _ in self.stamps]
            at = names.index("INFER_RESPONSE_COMPLETE") if "INFER_RESPONSE_COMPLETE" in names \
                else len(names)
            self.stamps[at:at] = [("COMPUTE_START", min(start, answered)),
                                  ("COMPUTE_INPUT_END", min(input_end, answered)),
                                  ("COMPUTE_OUTPUT_START", min(output_start, answered)),
                                  ("COMPUTE_END", answered)]
            self.stamps.append(("REQUEST_END", self.end_ns))
            self._one_done()
            return
        self.stamps += (("COMPUTE_START", start), ("COMPUTE_INPUT_END", input_end),
                        ("COMPUTE_OUTPUT_START", output_start))
        self.compute_open = True

    def respond(self, response: InferenceResponse | None, final: bool) -> None:
        if response is not None and self.setting.level & TENSORS and response.error is None:
            self.tensors += (("TENSOR_BACKEND_OUTPUT", t) for t in response.outputs)
        if final:
            now = time.perf_counter_ns()
            if self.executing:
                self.answered_ns = now
            if self.compute_open:
                self.stamps.append(("COMPUTE_END", now))
                self.compute_open = False

    def end(self) -> None:
        if self.executing:
            self.end_ns = time.perf_counter_ns()
            return
        self.stamps.append(("REQUEST_END", time.perf_counter_ns()))
        self._one_done()

    def frontend_done(self, names: tuple[str, ...]) -> None:
        """The front end answered (`names`: HTTP_SEND_START/END or GRPC_SEND_START/END): called
        once, by a front end that gave the request its `frontend_trace`. They are stamped when
        the request has also ended, after REQUEST_END as in Triton."""
        self._sent = names
        self._one_done()

    def _one_done(self) -> None:
        if self._lock is not None:
            with self._lock:
                self._pending -= 1
                if self._pending:
                    return
            now = time.perf_counter_ns()
            self.stamps += ((name, now) for name in self._sent)
        self.setting.finish(self)

    # triton mode: Triton's JSON trace objects, one per activity
    def to_json(self) -> str:
        head: dict[str, Any] = {"id": self.id, "model_name": self.model_name,
                                "model_version": self.model_version}
        if self.request_id:
            head["request_id"] = self.request_id
        parts = [json.dumps(head, separators=(",", ":"))]
        level = self.setting.level
        tensors = iter(self.tensors)
        for name, ns in self.stamps:
            if name == "QUEUE_START" and level & TENSORS:
                parts += (_tensor_json(self.id, a, t) for a, t in tensors
                          if a == "TENSOR_QUEUE_INPUT")
            if level & TIMESTAMPS:
                parts.append(f'{{"id":{self.id},"timestamps":[{{"name":"{name}","ns":{ns}}}]}}')
        if level & TENSORS:
            parts += (_tensor_json(self.id, a, t) for a, t in self.tensors
                      if a == "TENSOR_BACKEND_OUTPUT")
        return ",".join(parts)


def _tensor_json(trace_id: int, activity: str, tensor: Tensor) -> str:
    return json.dumps({"id": trace_id, "activity": activity,
                       "tensor": {"name": tensor.name, "data": _tensor_data(tensor),
                                  "shape": ",".join(str(d) for d in tensor.shape),
                                  "dtype": tensor.datatype}}, separators=(",", ":"))


def _tensor_data(tensor: Tensor) -> str:
    """Elements comma-separated as Triton writes them (FP16/BF16: empty, BYTES: quoted)."""
    import numpy as np

    data = tensor.data
    if data is None or tensor.datatype in ("FP16", "BF16"):
        return ""
    flat = np.asarray(data).reshape(-1)
    if tensor.datatype == "BYTES":
        return ",".join('"' + (v if isinstance(v, bytes) else str(v).encode()).decode("utf-8", "replace")
                        + '"' for v in flat)
    if tensor.datatype == "BOOL":
        return ",".join("1" if v else "0" for v in flat)
    if tensor.datatype in ("FP32", "FP64"):
        return ",".join(f"{v:g}" for v in flat.tolist())  # C++ ostream's default: 0, 0.5, 1e+06
    # Integers as numbers (Triton's ostream writes INT8/UINT8 elements as characters)
    return ",".join(str(v) for v in flat.tolist())


class TraceFile:
    """A trace file as Triton's TraceFile: one JSON array written across saves, or indexed files."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.index = itertools.count()
        self._lock = threading.Lock()
        self._stream: Any = None

    def save(self, data: str, to_index: bool) -> None:
        try:
            if to_index:
                with open(f"{self.name}.{next(self.index)}", "w") as f:
                    f.write("[" + data + "]")
                return
            with self._lock:
                if self._stream is None:
                    self._stream = open(self.name, "w")
                    self._stream.write("[")
                else:
                    self._stream.write(",")
                self._stream.write(data)
                self._stream.flush()
        except OSError as exc:
            log.error("failed creating trace file: %s", exc)

    def close(self) -> None:
        with self._lock:
            if self._stream is not None:
                self._stream.write("]")
                self._stream.close()
                self._stream = None
