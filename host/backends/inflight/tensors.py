"""A host request's input tensors -> a `GenerationRequest` (TensorRT-LLM backend tensor names).

Only `input_ids` and `request_output_len` are required. Every input holds one request: a batch
dimension, when the model has one, must be 1. `input_lengths`, when given, cuts `input_ids`
(clients that pad several prompts to one length send it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from host.errors import InvalidArgumentError
from host.inference import InferenceRequest
from host.inflight import GenerationRequest, SamplingParams


def _value(request: InferenceRequest, name: str, default: Any = None) -> Any:
    tensor = request.inputs.get(name)
    if tensor is None:
        return default
    data = np.asarray(tensor.data).reshape(-1)
    if data.size != 1:
        raise InvalidArgumentError(f"input '{name}' must hold one value, got {data.size}")
    return data[0].item()


def _input_ids(request: InferenceRequest) -> list[int]:
    tensor = request.inputs.get("input_ids")
    if tensor is None:
        raise InvalidArgumentError("input 'input_ids' is required")
    data = np.asarray(tensor.data)
    if data.ndim == 2:
        if data.shape[0] != 1:
            raise InvalidArgumentError(
                f"one prompt per request: 'input_ids' has a batch of {data.shape[0]}")
        data = data[0]
    ids = data.reshape(-1).tolist()
    length = _value(request, "input_lengths")
    if length is not None:
        if not 0 < length <= len(ids):
            raise InvalidArgumentError(
                f"input_lengths {length} is outside 1..{len(ids)} (the length of input_ids)")
        ids = ids[:length]
    return ids


def generation_request(rid: int, request: InferenceRequest, exclude_input: bool) -> GenerationRequest:
    output_len = _value(request, "request_output_len")
    if output_len is None:
        raise InvalidArgumentError("input 'request_output_len' is required")
    return GenerationRequest(
        request_id=rid,
        input_ids=_input_ids(request),
        max_new_tokens=int(output_len),
        end_id=_value(request, "end_id"),
        pad_id=_value(request, "pad_id"),
        streaming=bool(_value(request, "streaming", False)),
        sampling=SamplingParams(
            temperature=float(_value(request, "temperature", 1.0)),
            top_k=int(_value(request, "runtime_top_k", 0)),
            top_p=float(_value(request, "runtime_top_p", 0.0)),
            seed=int(_value(request, "random_seed", 0))),
        beam_width=int(_value(request, "beam_width", 1)),
        return_log_probs=bool(_value(request, "return_log_probs", False)),
        return_context_logits=bool(_value(request, "return_context_logits", False)),
        return_generation_logits=bool(_value(request, "return_generation_logits", False)),
        exclude_input_in_output=exclude_input,
    )
