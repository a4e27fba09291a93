"""A host request -> a `GenerationRequest`: input tensors and request parameters, by the names of
Triton's TensorRT-LLM and vLLM backends.

Every generation parameter may come as an input tensor (one value) or as a request parameter
(the generate extension turns unknown top-level keys into those), or inside vLLM's
`sampling_parameters` JSON string. Each is checked here (type, range), so a bad value is a 400
naming it and never reaches the batch manager's thread.

Prompt: `input_ids` (token ids; `input_lengths` cuts it), or for a model with a tokenizer
`text_input` (text, the tokenizer's special tokens added) or the `messages` parameter (a JSON list
of chat messages, rendered with the checkpoint's chat template).

Sampling convention: TensorRT-LLM's (top_k 0 and top_p 0 are greedy, so a temperature alone does
not sample) unless the parameters come as vLLM's `sampling_parameters`, where a temperature
alone samples (top_p defaults to 1.0), as vLLM and OpenAI users expect.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from host.errors import InvalidArgumentError
from host.inference import InferenceRequest
from host.inflight import GenerationRequest, SamplingParams

if TYPE_CHECKING:
    from host.inflight.text import TextCodec, TextStream

# request field, kind, accepted names (first found wins), where it goes
_FIELDS: list[tuple[str, type, tuple[str, ...]]] = [
    ("max_new_tokens", int, ("request_output_len", "max_tokens")),
    ("end_id", int, ("end_id",)),
    ("pad_id", int, ("pad_id",)),
    ("streaming", bool, ("streaming", "stream")),
    ("beam_width", int, ("beam_width",)),
    ("length_penalty", float, ("length_penalty",)),
    ("return_log_probs", bool, ("return_log_probs",)),
    ("top_log_probs", int, ("top_logprobs", "top_log_probs")),
    ("return_context_logits", bool, ("return_context_logits",)),
    ("return_generation_logits", bool, ("return_generation_logits",)),
    ("exclude_input_in_output", bool, ("exclude_input_in_output",)),
    ("pad_to_max_length", bool, ("return_padded_output_ids",)),
]
_SAMPLING: list[tuple[str, type, tuple[str, ...]]] = [
    ("temperature", float, ("temperature",)),
    ("top_k", int, ("runtime_top_k", "top_k")),
    ("top_p", float, ("runtime_top_p", "top_p")),
    ("seed", int, ("random_seed", "seed")),
    ("repetition_penalty", float, ("repetition_penalty",)),
    ("presence_penalty", float, ("presence_penalty",)),
    ("frequency_penalty", float, ("frequency_penalty",)),
    ("min_tokens", int, ("min_tokens", "min_length")),
]


def _convert(name: str, kind: type, value: Any) -> Any:
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise InvalidArgumentError(f"parameter '{name}' must be a boolean, got {value!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentError(f"parameter '{name}' must be a number, got {value!r}")
    if kind is int:
        if isinstance(value, float):
            if not math.isfinite(value) or value != int(value):
                raise InvalidArgumentError(f"parameter '{name}' must be an integer, got {value!r}")
            value = int(value)
        return value
    value = float(value)
    if not math.isfinite(value):
        raise InvalidArgumentError(f"parameter '{name}' must be a finite number, got {value!r}")
    return value


@dataclass
class _Source:
    request: InferenceRequest
    vllm: dict[str, Any]

    def get(self, name: str) -> Any:
        tensor = self.request.inputs.get(name)
        if tensor is not None:
            data = np.asarray(tensor.data).reshape(-1)
            if data.size != 1:
                raise InvalidArgumentError(f"input '{name}' must hold one value, got {data.size}")
            return data[0]
        if name in self.request.parameters:
            return self.request.parameters[name]
        return self.vllm.get(name)

    def find(self, names: tuple[str, ...], kind: type) -> Any:
        for name in names:
            value = self.get(name)
            if value is not None:
                return _convert(name, kind, value)
        return None

    def strings(self, name: str) -> list[str]:
        tensor = self.request.inputs.get(name)
        values: Any
        if tensor is not None:
            values = np.asarray(tensor.data).reshape(-1).tolist()
        else:
            values = self.request.parameters.get(name, self.vllm.get(name))
            if values is None:
                return []
            if isinstance(values, str):
                if values.startswith("["):
                    try:
                        values = json.loads(values)
                    except ValueError:
                        raise InvalidArgumentError(
                            f"parameter '{name}' must be a string or a JSON list of strings, got "
                            f"{values[:64]!r}") from None
                else:
                    values = [values] if values else []
        out = []
        for v in values if isinstance(values, list) else [values]:
            if isinstance(v, bytes):
                v = v.decode("utf-8", "replace")
            if not isinstance(v, str):
                raise InvalidArgumentError(f"parameter '{name}' must be a list of strings, got {v!r}")
            if v:
                out.append(v)
        return out


def _sampling_parameters(request: InferenceRequest) -> dict[str, Any]:
    """vLLM backend's `sampling_parameters` (a JSON object as a string)."""
    src = request.inputs.get("sampling_parameters")
    text = request.parameters.get("sampling_parameters")
    if src is not None:
        text = np.asarray(src.data).reshape(-1)[0]
    if text is None:
        return {}
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    try:
        doc = json.loads(text) if isinstance(text, str) else text
    except ValueError:
        raise InvalidArgumentError("parameter 'sampling_parameters' must be a JSON object") from None
    if not isinstance(doc, dict):
        raise InvalidArgumentError("parameter 'sampling_parameters' must be a JSON object")
    if doc.get("top_k") == -1:
        doc["top_k"] = 0  # vLLM's "no limit"
    doc.setdefault("top_p", 1.0)  # vLLM's convention: a temperature alone samples
    return doc


def _token_lists(src: _Source, name: str) -> list[list[int]]:
    """TensorRT-LLM's [1, 2, N] / [2, N] words list (ids, then end offsets padded with -1), or a
    JSON list of token-id lists as a parameter."""
    tensor = src.request.inputs.get(name)
    if tensor is None:
        value = src.request.parameters.get(name)
        if value is None:
            return []
        try:
            lists = json.loads(value) if isinstance(value, str) else value
            return [[int(t) for t in words] for words in lists]
        except (ValueError, TypeError):
            raise InvalidArgumentError(f"parameter '{name}' must be a list of token-id lists") from None
    data = np.asarray(tensor.data)
    if not data.size or data.size % 2:
        raise InvalidArgumentError(f"input '{name}' must have shape [1, 2, N] (ids, offsets)")
    data = data.reshape(2, -1)
    ids, offsets = data[0].tolist(), [o for o in data[1].tolist() if o >= 0]
    out, start = [], 0
    for end in offsets:
        if not start <= end <= len(ids):
            raise InvalidArgumentError(f"input '{name}': offset {end} is out of range")
        if end > start:
            out.append(ids[start:end])
        start = end
    return out


def _input_ids(request: InferenceRequest, src: _Source, text: TextCodec | None) -> list[int]:
    tensor = request.inputs.get("input_ids")
    if tensor is None:
        if text is None:
            raise InvalidArgumentError("input 'input_ids' is required")
        return prompt_ids(request, text)
    data = np.asarray(tensor.data)
    if data.ndim == 2:
        if data.shape[0] != 1:
            raise InvalidArgumentError(
                f"one prompt per request: 'input_ids' has a batch of {data.shape[0]}")
        data = data[0]
    ids = data.reshape(-1).tolist()
    length = src.find(("input_lengths",), int)
    if length is not None:
        if not 0 < length <= len(ids):
            raise InvalidArgumentError(
                f"input_lengths {length} is outside 1..{len(ids)} (the length of input_ids)")
        ids = ids[:length]
    return ids


def prompt_text(request: InferenceRequest) -> str | None:
    tensor = request.inputs.get("text_input")
    value = request.parameters.get("text_input") if tensor is None else np.asarray(tensor.data).reshape(-1)
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        if value.size != 1:
            raise InvalidArgumentError(f"input 'text_input' must hold one prompt, got {value.size}")
        value = value[0]
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        raise InvalidArgumentError("input 'text_input' must be text")
    return value


def prompt_ids(request: InferenceRequest, text: TextCodec) -> list[int]:
    from host.inflight.text import TextError

    messages = request.parameters.get("messages")
    try:
        if messages is not None:
            doc = json.loads(messages) if isinstance(messages, str) else messages
            if not isinstance(doc, list) or not all(isinstance(m, dict) for m in doc):
                raise InvalidArgumentError("parameter 'messages' must be a list of message objects")
            return text.chat_ids(doc)
        prompt = prompt_text(request)
        if prompt is None:
            raise InvalidArgumentError("input 'text_input' (or 'input_ids') is required")
        return text.encode(prompt)
    except TextError as exc:
        raise InvalidArgumentError(str(exc)) from None
    except ValueError as exc:
        raise InvalidArgumentError(f"parameter 'messages' is not valid JSON: {exc}") from None


@dataclass
class TextState:
    """What the backend keeps per text request: the stream of its text, its counts."""

    stream: TextStream
    prompt: str
    prompt_tokens: int
    max_new_tokens: int
    generated: list[int]
    with_prompt: bool
    want_tokens: bool  # token texts for log probs (OpenAI logprobs)
    streaming: bool = False


def generation_request(rid: int, request: InferenceRequest, exclude_input: bool,
                       text: TextCodec | None = None, eos_ids: list[int] | None = None,
                       post_processors: dict[str, Callable] | None = None,
                       default_processor: str = "", max_seq_len: int = 0
                       ) -> tuple[GenerationRequest, TextState | None]:
    vllm = _sampling_parameters(request)
    src = _Source(request, vllm)
    values: dict[str, Any] = {}
    for field_name, kind, names in _FIELDS:
        value = src.find(names, kind)
        if value is not None:
            values[field_name] = value
    sampling = SamplingParams(**{f: v for f, kind, names in _SAMPLING
                                 if (v := src.find(names, kind)) is not None})
    exclude = values.pop("exclude_input_in_output", exclude_input)
    ids = _input_ids(request, src, text)
    if "max_new_tokens" not in values:
        if not (max_seq_len and request.parameters.get("max_tokens_auto") is True):
            raise InvalidArgumentError("input 'request_output_len' (or 'max_tokens') is required")
        values["max_new_tokens"] = max(1, max_seq_len - len(ids))  # as far as the context goes
    r = GenerationRequest(request_id=rid, input_ids=ids, sampling=sampling,
                          exclude_input_in_output=True if text is not None else exclude, **values)
    r.stop_words = _token_lists(src, "stop_words_list")
    r.bad_words = _token_lists(src, "bad_words_list")
    name = request.parameters.get("logits_post_processor", default_processor)
    if name:
        processor = (post_processors or {}).get(name)
        if processor is None:
            raise InvalidArgumentError(f"parameter 'logits_post_processor': no processor named "
                                       f"'{name}' is registered")
        r.logits_post_processor = processor
    state = None
    if text is not None:
        if r.end_id is None and eos_ids:
            r.end_id, r.stop_token_ids = eos_ids[0], list(eos_ids[1:])
        if src.find(("ignore_eos",), bool):
            r.end_id, r.stop_token_ids = None, []
        stops = src.strings("stop_words") + src.strings("stop")
        for words in src.strings("bad_words"):
            r.bad_words.append(text.encode(words, add_special_tokens=False))
        stream = text.stream(stops)
        prompt = prompt_text(request) or ""
        state = TextState(stream, prompt, len(ids), r.max_new_tokens, [], not exclude and bool(prompt),
                          r.return_log_probs or r.top_log_probs > 0, r.streaming)
        if stops:
            r.stop_check = stream.update
    return r, state
