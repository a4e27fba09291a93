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

The decoder: a Hugging Face checkpoint when the version directory holds `config.json` and
`*.safetensors` (or the `checkpoint_dir` parameter names such a directory inside the model's
directory), with its tokenizer (`tokenizer.json`) for text in and out (`text_input`,
`text_output`, the `messages` parameter for chat); otherwise `host.inflight.TinyDecoder`, with
weights from `<version>/model.pt` when the file is there (scripts/make_llm.py --weights), else
generated from the `seed` parameter at load.

If the batch manager's thread dies (a bug), the model version reports itself failed
(`ModelSpec.report_failure`): it becomes UNAVAILABLE and requests fail at once.
"""

from __future__ import annotations

import itertools
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from host.backend import Backend, Instance, InstanceSpec, Model, ModelSpec
from host.errors import CancelledError, InternalError, InvalidArgumentError, UnavailableError
from host.inference import InferenceRequest, InferenceResponse, Tensor

if TYPE_CHECKING:
    from host.backends.inflight.tensors import TextState
    from host.inflight import BatchManager, GenerationRequest
    from host.inflight.text import TextCodec

log = logging.getLogger(__name__)

WEIGHTS_FILE = "model.pt"
DECODER_KEYS = ("vocab_size", "d_model", "heads", "kv_heads", "layers", "d_ff", "max_seq_len", "seed", "dtype")
_TRUE = ("1", "true", "yes", "on")
_DATATYPE = {np.dtype(np.int32): "INT32", np.dtype(np.float32): "FP32", np.dtype(object): "BYTES"}
BATCHING = {"v1": "V1", "inflight_batching": "InflightBatching",
            "inflight_fused_batching": "InflightFusedBatching"}


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

    def __init__(self, name: str, processors: dict[str, Any] | None = None) -> None:
        super().__init__(name)
        # logits post-processors registered by plugins (modelhost_register_logits_processors)
        self.processors = processors if processors is not None else {}

    def create_model(self, spec: ModelSpec) -> InflightModel:
        _import_torch()
        model = InflightModel(spec)
        model.processors = {name: record.factory for name, record in self.processors.items()}
        return model


def _settings(spec: ModelSpec) -> dict[str, str]:
    return {k: v.string_value for k, v in spec.config.parameters.items()}


def checkpoint_dir(spec: ModelSpec) -> Path | None:
    """The Hugging Face checkpoint of the model, if it has one (inside the model's directory)."""
    name = _settings(spec).get("checkpoint_dir", "")
    if not name:
        return spec.version_path if (spec.version_path / "config.json").is_file() else None
    root = spec.path.resolve()
    path = (spec.path / name).resolve()
    if path != root and root not in path.parents:
        raise InvalidArgumentError(f"model '{spec.name}': checkpoint_dir '{name}' is outside the "
                                   f"model's directory")
    if not path.is_dir():
        raise InvalidArgumentError(f"model '{spec.name}': checkpoint_dir '{name}' is not a directory")
    return path


def build_decoder(spec: ModelSpec) -> Any:
    """The model's decoder: its checkpoint or weights file if present, else from the seed."""
    import torch

    from host.inflight import DecoderConfig, TinyDecoder

    settings = _settings(spec)
    hf = checkpoint_dir(spec)
    if hf is not None:
        from host.inflight.hf import CheckpointError, load_checkpoint

        try:
            return load_checkpoint(hf, settings.get("dtype", ""), settings.get("device", "") or "cpu")
        except CheckpointError as exc:
            raise InvalidArgumentError(f"model '{spec.name}': {exc}") from None
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
    from host.inflight.scheduler import BatchingScheme

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
    batching = s.get("gpt_model_type", s.get("batching_strategy", "inflight_fused_batching")).lower()
    if batching not in BATCHING:
        raise InvalidArgumentError(
            f"model '{spec.name}': gpt_model_type must be one of {', '.join(BATCHING)}; got '{batching}'")
    scheduler.batching = BatchingScheme(BATCHING[batching])
    return {"scheduler_config": scheduler, "kv_cache_config": kv,
            "max_queue_size": number("max_queue_size"), "max_beam_width": number("max_beam_width") or 1,
            "max_attention_window": number("max_attention_window")}


class InflightModel(Model):
    processors: dict[str, Any] = {}

    def initialize(self) -> None:
        import torch

        from host.inflight import BatchManager

        settings = _settings(self.spec)
        threads = settings.get("intra_op_thread_count", "")
        if threads:
            torch.set_num_threads(int(threads))  # process-wide, as the PyTorch backend's parameter
        self.exclude_input = settings.get("exclude_input_in_output", "").lower() in _TRUE
        self.decoder = build_decoder(self.spec)
        self.text: TextCodec | None = None
        self.eos_ids: list[int] = list(getattr(self.decoder, "eos_token_ids", []))
        hf = checkpoint_dir(self.spec)
        if hf is not None and (hf / "tokenizer.json").is_file():
            from host.inflight.text import TextCodec, TextError

            try:
                self.text = TextCodec.from_dir(hf)
            except TextError as exc:
                raise InvalidArgumentError(f"model '{self.spec.name}': {exc}") from None
            eos = self.text.eos_token_id
            if eos is not None and eos not in self.eos_ids:
                self.eos_ids.append(eos)
        self.post_processor = settings.get("logits_post_processor", "")
        if self.post_processor and self.post_processor not in self.processors:
            raise InvalidArgumentError(
                f"model '{self.spec.name}': logits_post_processor '{self.post_processor}' is not "
                f"registered by any plugin (registered: {', '.join(sorted(self.processors)) or 'none'})")
        self._lock = threading.Lock()
        self._queue: list[GenerationRequest] = []
        self._requests: dict[int, InferenceRequest] = {}  # manager id -> host request
        self._texts: dict[int, TextState] = {}
        self._ids = itertools.count(1)
        self._stats_text = ""  # the latest statistics JSON, parsed when metrics are read
        self.manager: BatchManager = BatchManager(
            self.decoder, get_new_requests=self._get_new_requests, send_response=self._send_response,
            poll_stop_signal=self._poll_stop_signal, return_stats=self._return_stats,
            on_failure=self._on_failure, **manager_options(self.spec))

    def create_instance(self, spec: InstanceSpec) -> InflightInstance:
        return InflightInstance(self)

    def finalize(self) -> None:
        self.manager.shutdown(wait=True, timeout=60)

    def metrics(self) -> list[Any]:
        from host.backends.inflight.metrics import families

        return families(self.spec.name, str(self.spec.version), self.stats, self.manager)

    # --- from the instances ----------------------------------------------------------------------
    def enqueue(self, requests: Sequence[InferenceRequest]) -> None:
        from host.backends.inflight.tensors import generation_request

        accepted = []
        for request in requests:
            try:
                if self.manager.error is not None:
                    raise UnavailableError(f"model '{self.spec.name}' is unavailable: its batch "
                                           f"manager failed ({self.manager.error})")
                rid = next(self._ids)
                generation, text = generation_request(rid, request, self.exclude_input, self.text,
                                                      self.eos_ids, self.processors, self.post_processor,
                                                      self.decoder.max_seq_len)
                problem = self.manager.check(generation)
                if problem:
                    raise InvalidArgumentError(problem)
                accepted.append((rid, request, generation, text))
            except (InvalidArgumentError, UnavailableError) as exc:
                request.respond(InferenceResponse(error=exc), True)
        with self._lock:
            for rid, request, generation, text in accepted:
                self._requests[rid] = request
                if text is not None:
                    self._texts[rid] = text
                self._queue.append(generation)
        self.manager.notify()

    def _on_failure(self, exc: BaseException) -> None:
        """The manager's thread died: refuse what is queued, and report the model failed."""
        with self._lock:
            queued, self._queue = self._queue, []
        for generation in queued:
            self._send_response(generation.request_id, {}, True, f"batch manager failed: {exc}")
        if self.spec.report_failure is not None:
            self.spec.report_failure(f"the batch manager failed: {type(exc).__name__}: {exc}")

    # --- the manager's callbacks (its worker thread) ---------------------------------------------
    def _get_new_requests(self, n: int) -> list[GenerationRequest]:
        if not self._queue:  # every iteration asks: an empty queue is seen without the lock
            return []
        with self._lock:
            count = len(self._queue) if n < 0 else min(n, len(self._queue))
            taken, self._queue = self._queue[:count], self._queue[count:]
            return taken

    def _send_response(self, rid: int, tensors: dict[str, np.ndarray], final: bool, error: str) -> None:
        if final:
            with self._lock:
                request = self._requests.pop(rid, None)
                text = self._texts.pop(rid, None)
        else:
            request = self._requests.get(rid)
            text = self._texts.get(rid)
        if request is None:
            return
        if request.is_cancelled() and final:
            response = InferenceResponse(error=CancelledError("request was cancelled"))
        elif error:
            code = UnavailableError if error.startswith("batch manager failed") else InternalError
            response = InferenceResponse(error=code(error))
        else:
            parameters: dict[str, Any] = {}
            if text is not None:
                tensors = dict(tensors)
                self._text_outputs(text, tensors, final, parameters)
            wanted = set(request.requested_output_names)
            response = InferenceResponse(outputs=[
                Tensor(name, _DATATYPE[a.dtype], list(a.shape), a)
                for name, a in tensors.items() if not wanted or name in wanted],
                parameters=parameters)
        try:
            request.respond(response, final)
        except Exception:  # one client's failure must not stop the generation loop
            log.exception("sending a response of model '%s' failed", self.spec.name)

    def _text_outputs(self, state: TextState, tensors: dict[str, np.ndarray], final: bool,
                      parameters: dict[str, Any]) -> None:
        """text_output (and token texts) from the response's output_ids; counts and the finish
        reason in the final response's parameters."""
        ids = tensors.get("output_ids")
        if ids is None:
            return
        codec = self.text
        assert codec is not None
        if ids.shape[1] > 1:  # beams: one text per beam, the whole of it
            lengths = tensors["sequence_length"].reshape(-1)
            texts = [codec.decode(ids[0, b, :lengths[b]].tolist()) for b in range(ids.shape[1])]
            tensors["text_output"] = np.array([t.encode() for t in texts], dtype=object)
            state.generated = ids[0, 0, :lengths[0]].tolist()
        else:
            new = ids.reshape(-1).tolist()
            state.generated = state.generated + new if state.streaming else new
            stream = state.stream
            stream.update(state.generated)
            piece = stream.take(final)
            if state.with_prompt:
                piece, state.with_prompt = state.prompt + piece, False
            tensors["text_output"] = np.array([piece.encode()], dtype=object)
            if state.want_tokens:
                tensors["output_tokens"] = np.array([t.encode() for t in codec.token_texts(new)],
                                                    dtype=object)
                if "top_token_ids" in tensors:
                    top = tensors["top_token_ids"].reshape(-1, tensors["top_token_ids"].shape[-1])
                    tensors["top_tokens"] = np.array(
                        [[t.encode() for t in codec.token_texts(row.tolist())] for row in top],
                        dtype=object)
        if final:
            stopped = state.stream.stopped
            parameters["finish_reason"] = ("length" if len(state.generated) >= state.max_new_tokens
                                           and not stopped else "stop")
            parameters["prompt_tokens"] = state.prompt_tokens
            parameters["completion_tokens"] = len(state.generated)

    def _poll_stop_signal(self) -> list[int]:
        with self._lock:
            return [rid for rid, r in self._requests.items() if r.cancelled]

    def _return_stats(self, text: str) -> None:
        self._stats_text = text  # every iteration: kept as it is, parsed only when read

    @property
    def stats(self) -> dict[str, Any]:
        """The batch manager's latest statistics (the last iteration's), {} before the first."""
        import json

        text = self._stats_text
        return json.loads(text) if text else {}


class InflightInstance(Instance):
    def __init__(self, model: InflightModel) -> None:
        self.model = model

    def execute(self, requests: Sequence[InferenceRequest]) -> None:
        self.model.enqueue(requests)
        return None
