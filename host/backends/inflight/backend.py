"""The "inflight" backend: a generation model served through the batch manager, decoupled.

Each model version runs one `host.inflight.BatchManager` around its decoder. `execute` only
turns each request into a `GenerationRequest` and queues it; the manager's worker thread picks
it up at its next iteration and answers through the request's sender: one response per token
when the request streams, else one response; the final one carries the flag. A request the
client cancelled (stream closed, client gone) is in the manager's poll-stop set at the end of the
next iteration: it stops there, its KV blocks are freed, and it ends with a cancellation error.

Tensor names follow Triton's TensorRT-LLM backend (inputs input_ids, input_lengths,
request_output_len, end_id, pad_id, streaming, temperature, runtime_top_k, runtime_top_p,
random_seed, beam_width, return_log_probs, return_context_logits, return_generation_logits;
outputs output_ids, sequence_length, cum_log_probs, output_log_probs, context_logits,
generation_logits), and so do the names of its config parameters; see docs/inflight.md.

The decoder is `host.inflight.TinyDecoder`: weights from `<version>/model.pt` when the file is
there (written by scripts/make_llm.py --weights), otherwise generated from the `seed` parameter
at load (deterministic, a fraction of a second for the example).
"""

from __future__ import annotations

import itertools
import logging
import threading
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from host.backend import Backend, Instance, InstanceSpec, Model, ModelSpec
from host.errors import CancelledError, InternalError, InvalidArgumentError, UnavailableError
from host.inference import InferenceRequest, InferenceResponse, Tensor

if TYPE_CHECKING:
    from host.inflight import BatchManager, GenerationRequest

log = logging.getLogger(__name__)

WEIGHTS_FILE = "model.pt"
DECODER_KEYS = ("vocab_size", "d_model", "heads", "kv_heads", "layers", "d_ff", "max_seq_len", "seed", "dtype")
_TRUE = ("1", "true", "yes", "on")
_DATATYPE = {np.dtype(np.int32): "INT32", np.dtype(np.float32): "FP32"}


def _import_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise UnavailableError(
            "the 'inflight' backend needs PyTorch, which is not installed: "
            "pip install torch (a CPU build is enough)") from exc


class InflightBackend(Backend):
    """Registered under the name "inflight"; one batch manager per model version."""

    supported_instance_kinds = ("CPU", "GPU", "MODEL")

    def create_model(self, spec: ModelSpec) -> InflightModel:
        _import_torch()
        return InflightModel(spec)


def _settings(spec: ModelSpec) -> dict[str, str]:
    return {k: v.string_value for k, v in spec.config.parameters.items()}


def build_decoder(spec: ModelSpec) -> Any:
    """The model's decoder: its weights file if present, else from the seed."""
    import torch

    from host.inflight import DecoderConfig, TinyDecoder

    settings = _settings(spec)
    try:
        config = DecoderConfig.from_dict({k: settings[k] for k in DECODER_KEYS if k in settings})
        decoder = TinyDecoder(config)
    except (ValueError, KeyError) as exc:
        raise InvalidArgumentError(f"model '{spec.name}': bad decoder parameters: {exc}") from exc
    weights = spec.version_path / WEIGHTS_FILE
    if weights.is_file():
        state = torch.load(weights, map_location="cpu", weights_only=True)
        try:
            decoder.load_state_dict(state)
        except RuntimeError as exc:
            raise InvalidArgumentError(
                f"model '{spec.name}': '{weights}' does not match the config's decoder "
                f"parameters: {exc}") from exc
    device = settings.get("device", "")
    if device:
        decoder.to_device(device)
    return decoder


def manager_options(spec: ModelSpec) -> dict[str, Any]:
    """BatchManager options from the config (TensorRT-LLM backend parameter names)."""
    from host.inflight import CapacityPolicy, KVCacheConfig, SchedulerConfig

    s = _settings(spec)

    def number(key: str, kind: type = int) -> Any:
        text = s.get(key, "")
        if not text:
            return None
        try:
            return kind(text)
        except ValueError:
            raise InvalidArgumentError(
                f"model '{spec.name}': parameter '{key}' must be a number, got '{text}'") from None

    policy_name = s.get("batch_scheduler_policy", "guaranteed_no_evict").upper()
    try:
        policy = CapacityPolicy(policy_name)
    except ValueError:
        raise InvalidArgumentError(
            f"model '{spec.name}': batch_scheduler_policy must be one of max_utilization, "
            f"guaranteed_no_evict, static_batch; got '{s['batch_scheduler_policy']}'") from None
    max_batch = spec.config.max_batch_size or 1
    try:
        scheduler = SchedulerConfig(policy=policy, max_batch_size=max_batch,
                                    max_num_tokens=number("max_num_tokens"),
                                    enable_chunked_context=s.get("enable_chunked_context", "").lower() in _TRUE)
        fraction = number("kv_cache_free_gpu_mem_fraction", float)
        kv = KVCacheConfig(max_tokens=number("max_tokens_in_paged_kv_cache"),
                           free_memory_fraction=0.9 if fraction is None else fraction,
                           tokens_per_block=number("tokens_per_block") or 16,
                           enable_block_reuse=s.get("enable_kv_cache_reuse", "").lower() in _TRUE)
    except ValueError as exc:
        raise InvalidArgumentError(f"model '{spec.name}': {exc}") from exc
    return {"scheduler_config": scheduler, "kv_cache_config": kv,
            "max_queue_size": number("max_queue_size")}


class InflightModel(Model):
    def initialize(self) -> None:
        import torch

        from host.inflight import BatchManager

        settings = _settings(self.spec)
        threads = settings.get("intra_op_thread_count", "")
        if threads:
            torch.set_num_threads(int(threads))  # process-wide, as the PyTorch backend's parameter
        self.exclude_input = settings.get("exclude_input_in_output", "").lower() in _TRUE
        self.decoder = build_decoder(self.spec)
        self._lock = threading.Lock()
        self._queue: list[GenerationRequest] = []
        self._requests: dict[int, InferenceRequest] = {}  # manager id -> host request
        self._ids = itertools.count(1)
        self.stats: dict[str, Any] = {}
        self.manager: BatchManager = BatchManager(
            self.decoder, get_new_requests=self._get_new_requests, send_response=self._send_response,
            poll_stop_signal=self._poll_stop_signal, return_stats=self._return_stats,
            **manager_options(self.spec))

    def create_instance(self, spec: InstanceSpec) -> InflightInstance:
        return InflightInstance(self)

    def finalize(self) -> None:
        self.manager.shutdown(wait=True, timeout=60)

    def metrics(self) -> list[Any]:
        from host.backends.inflight.metrics import families

        return families(self.spec.name, str(self.spec.version), self.stats)

    # --- from the instances ----------------------------------------------------------------------
    def enqueue(self, requests: Sequence[InferenceRequest]) -> None:
        from host.backends.inflight.tensors import generation_request

        accepted = []
        for request in requests:
            try:
                rid = next(self._ids)
                generation = generation_request(rid, request, self.exclude_input)
                problem = self.manager.check(generation)
                if problem:
                    raise InvalidArgumentError(problem)
                accepted.append((rid, request, generation))
            except InvalidArgumentError as exc:
                request.respond(InferenceResponse(error=exc), True)
        with self._lock:
            for rid, request, generation in accepted:
                self._requests[rid] = request
                self._queue.append(generation)
        self.manager.notify()

    # --- the manager's callbacks (its worker thread) ---------------------------------------------
    def _get_new_requests(self, n: int) -> list[GenerationRequest]:
        with self._lock:
            count = len(self._queue) if n < 0 else min(n, len(self._queue))
            taken, self._queue = self._queue[:count], self._queue[count:]
            return taken

    def _send_response(self, rid: int, tensors: dict[str, np.ndarray], final: bool, error: str) -> None:
        if final:
            with self._lock:
                request = self._requests.pop(rid, None)
        else:
            request = self._requests.get(rid)
        if request is None:
            return
        if request.is_cancelled() and final:
            response = InferenceResponse(error=CancelledError("request was cancelled"))
        elif error:
            response = InferenceResponse(error=InternalError(error))
        else:
            wanted = set(request.requested_output_names)
            response = InferenceResponse(outputs=[
                Tensor(name, _DATATYPE[a.dtype], list(a.shape), a)
                for name, a in tensors.items() if not wanted or name in wanted])
        try:
            request.respond(response, final)
        except Exception:  # one client's failure must not stop the generation loop
            log.exception("sending a response of model '%s' failed", self.spec.name)

    def _poll_stop_signal(self) -> list[int]:
        with self._lock:
            return [rid for rid, r in self._requests.items() if r.cancelled]

    def _return_stats(self, text: str) -> None:
        import json

        self.stats = json.loads(text)


class InflightInstance(Instance):
    def __init__(self, model: InflightModel) -> None:
        self.model = model

    def execute(self, requests: Sequence[InferenceRequest]) -> None:
        self.model.enqueue(requests)
        return None
