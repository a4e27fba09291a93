"""Triton's `model_warmup`: samples run on each model instance as it loads, before it serves.

For each sample of the configuration (in order), `count` times (at least once): `batch_size`
requests of one row each (no batch dimension when the model does not batch), with every input
the sample names: zeros (`zero_data`), random bytes (`random_data`; empty strings for BYTES) or
the file `<model>/warmup/<input_data_file>`. They run as one execute on the instance, directly
(no scheduler: a sequence model's control inputs are given by the sample, as in Triton); a
sample with `batch_size: 0` is skipped. An error response fails the load with Triton's text
(`failed to run warmup sample '<name>': <error>; `). Warmup executions count in the model's
statistics, as in Triton.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from host import datatypes
from host.errors import HostError, InvalidArgumentError
from host.inference import InferenceRequest, InferenceResponse, Tensor

if TYPE_CHECKING:
    from host.model import ModelVersion
    from host.proto import model_config_pb2
    from host.scheduler import InstanceSlot

log = logging.getLogger(__name__)

WARMUP_FOLDER = "warmup"


def run(mv: ModelVersion, slot: InstanceSlot) -> None:
    """Run the model's warmup samples on one instance; raises Triton's error if one fails."""
    from host.scheduler import execute_batch

    for sample in mv.config.model_warmup:
        if sample.batch_size == 0:
            log.debug("Skipping batch 0 warmup sample '%s'", sample.name)
            continue
        log.debug("Generating warmup sample data for '%s'", sample.name)
        inputs = _inputs(mv, sample)
        for iteration in range(1, max(sample.count, 1) + 1):
            log.debug("model '%s' instance %s is running warmup sample '%s' for iteration %d",
                      mv.name, slot.spec.name, sample.name, iteration)
            errors: list[str] = []
            done: list[threading.Event] = []
            requests = []
            for _ in range(sample.batch_size):
                request = InferenceRequest(model_name=mv.name, model_version=mv.version,
                                           inputs=dict(inputs), enqueue_ns=time.perf_counter_ns())
                finished = threading.Event()
                request.callback = _collector(mv, request, errors, finished)
                requests.append(request)
                done.append(finished)
            execute_batch(mv, slot, requests)
            for finished in done:  # a decoupled model may answer after execute returns
                finished.wait()
            if errors:
                log.debug("model '%s' instance %s failed to run warmup sample '%s'",
                          mv.name, slot.spec.name, sample.name)
                raise InvalidArgumentError(
                    f"failed to run warmup sample '{sample.name}': "
                    + "".join(f"{e}; " for e in errors))


def _collector(mv: ModelVersion, request: InferenceRequest, errors: list[str],
               finished: threading.Event):
    """The request's response callback: errors collected, the request counted in the model's
    statistics once final (as Triton counts warmup requests)."""
    lock = threading.Lock()
    failure: list[HostError] = []

    def callback(response: InferenceResponse | None, final: bool) -> None:
        with lock:
            if response is not None and response.error is not None:
                errors.append(str(response.error))
                failure.append(response.error)
            if final:
                request.completed = True
                now = time.perf_counter_ns()
                started = request.exec_start_ns or now
                mv.stats.request_done(not failure, now - request.enqueue_ns,
                                      started - request.enqueue_ns, request.batch_size,
                                      failure[0] if failure else None)
                finished.set()
    return callback


def _inputs(mv: ModelVersion, sample: model_config_pb2.ModelWarmup) -> dict[str, Tensor]:
    """One request's inputs (every request of a sample gets the same ones, as in Triton)."""
    batching = mv.config.max_batch_size > 0
    tensors = {}
    for name, spec in sample.inputs.items():
        datatype = datatypes.from_config_enum(spec.data_type)
        dims = list(spec.dims)
        if any(d < 0 for d in dims):
            raise InvalidArgumentError(
                "warmup setting expects all variable-size dimensions are specified for input "
                f"'{name}'")
        shape = ([1] if batching else []) + dims
        count = datatypes.element_count(dims)
        kind = spec.WhichOneof("input_data_type")
        if kind == "zero_data" or (kind == "random_data" and datatype == "BYTES"):
            data = (datatypes.bytes_array([b""] * count, shape) if datatype == "BYTES"
                    else np.zeros(shape, dtype=datatypes.to_numpy(datatype)))
        elif kind == "random_data":
            size = datatypes.byte_size(datatype, dims)
            data = np.frombuffer(os.urandom(size), dtype=datatypes.to_numpy(datatype)).reshape(shape)
        elif kind == "input_data_file":
            data = _from_file(mv, name, spec.input_data_file, datatype, dims, shape)
        else:
            raise InvalidArgumentError(
                f"warmup setting expects input '{name}' to have input_data_type set")
        tensors[name] = Tensor(name, datatype, shape, data)
    return tensors


def _from_file(mv: ModelVersion, name: str, filename: str, datatype: str, dims: list[int],
               shape: list[int]) -> np.ndarray:
    path = Path(mv.spec.path) / WARMUP_FOLDER / filename
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InvalidArgumentError(f"unable to open file {path}: {exc.strerror}") from None
    count = datatypes.element_count(dims)
    if datatype == "BYTES":
        try:
            return datatypes.bytes_array(datatypes.deserialize_bytes(raw, count), shape)
        except HostError as exc:
            raise InvalidArgumentError(
                f"warmup data for input '{name}' from {filename}: {exc}") from None
    size = datatypes.byte_size(datatype, dims)
    if size > len(raw):
        raise InvalidArgumentError(
            f"warmup setting expects {size} bytes, but the data provided from {filename}only has "
            f"{len(raw)} bytes")
    return np.frombuffer(raw[:size], dtype=datatypes.to_numpy(datatype)).reshape(shape).copy()
