"""Triton's GRPCInferenceService over a `Host`: one method per rpc.

Thin by design: each unary method takes the request message, turns it into core types
(`host.grpc.codec`; ModelInfer's comes decoded by the transport), makes one call into the host
and returns the response message; errors are the host's `HostError`s, which the transport
(`host.grpc.server`) turns into a gRPC status with the one table in `host.grpc.status`.
ModelStreamInfer returns a `host.grpc.stream.Stream`.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Protocol

from host.grpc import codec
from host.grpc.stream import Stream, Writer
from host.inference import InferenceRequest
from host.proto import grpc_service_pb2 as pb

log = logging.getLogger("host.grpc")

INFER_ENDPOINT = "ModelInfer RPC"
# Returned by a unary method that answers later through `call.finish` (from another thread).
DEFERRED = object()


# grpc.health.v1.HealthCheckResponse.ServingStatus
SERVING, NOT_SERVING = 1, 2


class HealthCheckResponse:
    """grpc.health.v1.HealthCheckResponse (its one field, `status`), without the grpc-health
    package: the rpc is two bytes."""

    __slots__ = ("status",)

    def __init__(self, status: int) -> None:
        self.status = status

    def SerializeToString(self) -> bytes:
        return bytes((0x08, self.status))  # field 1, varint


class Call(Protocol):
    """What a unary method may ask of its call."""

    def add_cancel_callback(self, callback: Callable[[], None]) -> None:
        """Run `callback` if the call is cancelled (by the client, a deadline, a disconnect)."""

    def finish(self, response: Any) -> None:
        """Answer a call whose method returned DEFERRED: a message, or an exception."""

    # The client's metadata: (key, value) pairs (header forwarding reads it).
    metadata: Any


def _debug_delay_ms(variable: str) -> int:
    """One of Triton's gRPC testing hooks (an environment variable in milliseconds), 0 if unset."""
    try:
        return max(int(os.environ.get(variable, "0")), 0)
    except ValueError:
        return 0


class Servicer:
    def __init__(self, host: Any) -> None:
        self.host = host
        self.forward = getattr(host, "grpc_header_forwarder", None)  # or None: nothing to do
        # Triton's testing hooks that hold a ModelInfer response before it is sent (its QA
        # cancels calls in that window): (milliseconds, the line Triton logs).
        self._response_delays = [
            (ms, f"{text} {ms} ms...") for ms, text in (
                (_debug_delay_ms("TRITONSERVER_DELAY_RESPONSE_COMPLETE_EXEC"),
                 "Delaying InferResponseComplete execution by"),
                (_debug_delay_ms("TRITONSERVER_DELAY_RESPONSE_COMPLETION"),
                 "Delaying InferResponseComplete by")) if ms]

    # --- health ----------------------------------------------------------------------------
    def ServerLive(self, request: Any, call: Call) -> Any:
        return pb.ServerLiveResponse(live=self.host.live())

    def ServerReady(self, request: Any, call: Call) -> Any:
        return pb.ServerReadyResponse(ready=self.host.ready())

    def Check(self, request: Any, call: Call) -> Any:
        """grpc.health.v1.Health/Check, as Triton answers it: SERVING when the server is ready,
        NOT_SERVING otherwise, whatever service the request names."""
        return HealthCheckResponse(SERVING if self.host.ready() else NOT_SERVING)

    def ModelReady(self, request: Any, call: Call) -> Any:
        codec.model_version(request.version)
        return pb.ModelReadyResponse(ready=self.host.model_ready(request.name, request.version))

    # --- metadata, configuration, statistics -----------------------------------------------
    def ServerMetadata(self, request: Any, call: Call) -> Any:
        return codec.server_metadata(self.host.server_metadata())

    def ModelMetadata(self, request: Any, call: Call) -> Any:
        codec.model_version(request.version)
        return codec.model_metadata(self.host.model_metadata(request.name, request.version))

    def ModelConfig(self, request: Any, call: Call) -> Any:
        codec.model_version(request.version)
        response = pb.ModelConfigResponse()
        response.config.CopyFrom(self.host.model_config(request.name, request.version))
        return response

    def ModelStatistics(self, request: Any, call: Call) -> Any:
        codec.model_version(request.version)
        return codec.statistics(self.host.statistics(request.name, request.version))

    # --- inference -------------------------------------------------------------------------
    def ModelInfer(self, infer_request: InferenceRequest, call: Call) -> Any:
        """`infer_request`: the call's message already decoded (codec.parse_infer_request)."""
        read_ns = getattr(call, "read_ns", None)
        # Triton's gRPC activities, for a trace (host.trace): only while a setting can sample
        if read_ns is not None and getattr(self.host, "tracing", True):
            infer_request.frontend_trace = [("GRPC_WAITREAD_START", read_ns[0]),
                                            ("GRPC_WAITREAD_END", read_ns[1])]
        if self.forward is not None:
            self.forward.apply(infer_request, call.metadata)
        call.add_cancel_callback(infer_request.cancel)
        request_id = infer_request.id

        def done(response: Any) -> None:
            # On the thread that finished the request: the caller's for a model that runs in
            # place, a batcher thread for a batched one (the polling thread was not kept
            # waiting, so it could read the other requests of the batch meanwhile).
            for ms, line in self._response_delays:
                log.info(line)
                time.sleep(ms / 1000)
            try:
                try:
                    answer = response if isinstance(response, BaseException) \
                        else codec.encode_unary_response(response, request_id)
                except Exception as exc:  # noqa: BLE001 - e.g. a name that is not UTF-8
                    answer = exc  # the call's status (as a stream reports it), never a call left open
                call.finish(answer)
            finally:
                if infer_request.frontend_trace:
                    _sent(infer_request)

        try:
            self.host.infer_async(infer_request, done, endpoint=INFER_ENDPOINT)
        except BaseException:
            if infer_request.frontend_trace:
                _sent(infer_request)
            raise
        return DEFERRED

    def ModelStreamInfer(self, writer: Writer) -> Stream:
        return Stream(self.host, writer, self.forward)

    # --- repository ------------------------------------------------------------------------
    def RepositoryIndex(self, request: Any, call: Call) -> Any:
        codec.check_repository_name(request.repository_name)
        return codec.repository_index(self.host.repository_index(ready_only=request.ready))

    def RepositoryModelLoad(self, request: Any, call: Call) -> Any:
        codec.check_repository_name(request.repository_name)
        config, files = codec.load_parameters(request.parameters)
        self.host.load_model(request.model_name, config=config, files=files)
        return pb.RepositoryModelLoadResponse()

    def RepositoryModelUnload(self, request: Any, call: Call) -> Any:
        codec.check_repository_name(request.repository_name)
        dependents = codec.unload_dependents(request.parameters)
        self.host.unload_model(request.model_name, unload_dependents=dependents)
        return pb.RepositoryModelUnloadResponse()

    # --- shared memory ---------------------------------------------------------------------
    def SystemSharedMemoryStatus(self, request: Any, call: Call) -> Any:
        response = pb.SystemSharedMemoryStatusResponse()
        for region in self.host.shm.status("system", request.name):
            response.regions[region["name"]].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(**region))
        return response

    def SystemSharedMemoryRegister(self, request: Any, call: Call) -> Any:
        self.host.shm.register_system(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    def SystemSharedMemoryUnregister(self, request: Any, call: Call) -> Any:
        self.host.shm.unregister(request.name, "system")
        return pb.SystemSharedMemoryUnregisterResponse()

    def CudaSharedMemoryStatus(self, request: Any, call: Call) -> Any:
        response = pb.CudaSharedMemoryStatusResponse()
        for region in self.host.shm.status("cuda", request.name):
            response.regions[region["name"]].CopyFrom(
                pb.CudaSharedMemoryStatusResponse.RegionStatus(**region))
        return response

    def CudaSharedMemoryRegister(self, request: Any, call: Call) -> Any:
        self.host.shm.register_cuda(request.name, request.raw_handle, request.device_id,
                                    request.byte_size)
        return pb.CudaSharedMemoryRegisterResponse()

    def CudaSharedMemoryUnregister(self, request: Any, call: Call) -> Any:
        self.host.shm.unregister(request.name, "cuda")
        return pb.CudaSharedMemoryUnregisterResponse()

    # --- trace and logging extensions ------------------------------------------------------
    def TraceSetting(self, request: Any, call: Call) -> Any:
        changes = codec.trace_changes(request.settings)
        return codec.trace_setting(self.host.trace_setting(request.model_name, changes))

    def LogSettings(self, request: Any, call: Call) -> Any:
        return codec.log_settings(self.host.log_settings(codec.log_changes(request.settings)))


def _sent(infer_request: Any) -> None:
    """The gRPC send activities of a traced request, stamped once its answer is sent."""
    if infer_request.trace is not None and infer_request.frontend_trace:
        infer_request.trace.frontend_done(("GRPC_SEND_START", "GRPC_SEND_END"))
        infer_request.frontend_trace = None  # once
