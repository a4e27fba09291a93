"""What a client hands the batch manager (`GenerationRequest`) and what the manager keeps per
request while it runs (`Sequence`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import torch

# (request id, logits [vocab] of this step, tokens so far per beam, client id) -> logits.
# The seed's LogitsPostProcessor, without the stream argument: the call runs on the worker
# thread, in order with the forward pass.
LogitsPostProcessor = Callable[[int, "torch.Tensor", list[list[int]], int | None], "torch.Tensor"]


@dataclass
class SamplingParams:
    """Greedy unless asked otherwise (TensorRT-LLM's defaults: top_k 0 and top_p 0 mean greedy).

    temperature <= 0, top_k == 1, or top_k == 0 with top_p == 0 is greedy; otherwise the logits are
    divided by the temperature, cut to the top_k most likely tokens (top_k > 0) and to the smallest
    set whose probability reaches top_p (0 < top_p < 1), and sampled with a generator seeded by
    `seed` (per request, so a request's tokens do not depend on what else is in the batch).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 0.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0 or self.top_k == 1 or (self.top_k == 0 and self.top_p <= 0)


@dataclass
class GenerationRequest:
    """One request, as `get_new_requests` returns it (the seed's InferenceRequest)."""

    request_id: int
    input_ids: list[int]
    max_new_tokens: int
    end_id: int | None = None  # stop when this token is generated (it is kept in the output)
    pad_id: int | None = None  # fills output_ids of beams that ended early (beam width 1: unused)
    streaming: bool = False
    sampling: SamplingParams = field(default_factory=SamplingParams)
    beam_width: int = 1
    return_log_probs: bool = False
    return_context_logits: bool = False
    return_generation_logits: bool = False
    logits_post_processor: LogitsPostProcessor | None = None
    client_id: int | None = None
    exclude_input_in_output: bool = False  # non-streaming output_ids: generated tokens only


class Phase(enum.Enum):
    WAITING = "waiting"  # received, not admitted (or paused: admitted before, blocks given back)
    CONTEXT = "context"  # admitted, prompt (or recomputation) not fully in the KV cache yet
    GENERATION = "generation"


class Sequence:
    """The manager's state of one request. `tokens` is prompt + generated; the first
    `num_cached` of them have keys/values in the cache (in the blocks of `block_table`)."""

    __slots__ = ("request", "tokens", "prompt_len", "phase", "block_table", "block_hashes",
                 "num_cached", "generator", "log_probs", "context_logits", "generation_logits",
                 "sent", "paused_times", "admitted_at", "reserved_blocks", "extra")

    def __init__(self, request: GenerationRequest) -> None:
        self.request = request
        self.tokens: list[int] = list(request.input_ids)
        self.prompt_len = len(self.tokens)
        self.phase = Phase.WAITING
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # of the leading full blocks registered for reuse
        self.num_cached = 0
        self.generator: Any = None
        self.log_probs: list[float] = []
        self.context_logits: Any = None
        self.generation_logits: list[Any] = []
        self.sent = 0  # generated tokens already streamed
        self.paused_times = 0
        self.admitted_at = -1  # iteration
        self.reserved_blocks = 0  # worst case, for GUARANTEED_NO_EVICT / STATIC_BATCH
        self.extra: dict[str, Any] = {}

    @property
    def request_id(self) -> int:
        return self.request.request_id

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def max_total(self) -> int:
        return self.prompt_len + self.request.max_new_tokens

    @property
    def to_compute(self) -> int:
        """Tokens whose keys/values are still to be computed before the next sample."""
        return len(self.tokens) - self.num_cached

    def finished(self) -> bool:
        if self.generated >= self.request.max_new_tokens:
            return True
        end = self.request.end_id
        return end is not None and self.generated > 0 and self.tokens[-1] == end
