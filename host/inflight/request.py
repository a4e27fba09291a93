"""What a client hands the batch manager (`GenerationRequest`) and what the manager keeps per
request while it runs (`Sequence`)."""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import torch

# (request id, logits [vocab] of this step, tokens so far per beam, client id) -> logits.
# The seed's LogitsPostProcessor, without the stream argument: the call runs on the worker
# thread, in order with the forward pass.
LogitsPostProcessor = Callable[[int, "torch.Tensor", list[list[int]], int | None], "torch.Tensor"]


# Below this a temperature is greedy (as vLLM's _SAMPLING_EPS): dividing logits by it would
# overflow to inf and make the distribution NaN.
MIN_TEMPERATURE = 1e-5


def _finite(value: float) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


@dataclass
class SamplingParams:
    """Greedy unless asked otherwise (TensorRT-LLM's defaults: top_k 0 and top_p 0 mean greedy).

    temperature < MIN_TEMPERATURE, top_k == 1, or top_k == 0 with top_p == 0 is greedy; otherwise
    the logits are divided by the temperature, cut to the top_k most likely tokens (top_k > 0) and
    to the smallest set whose probability reaches top_p (0 < top_p < 1), and sampled with a
    generator seeded by `seed` (per request, so a request's tokens do not depend on what else is
    in the batch). OpenAI's convention (temperature alone samples) is top_p 1.0: the front end
    that speaks it sets that.

    Penalties act on the logits before anything else (vLLM's definitions): `repetition_penalty`
    divides positive / multiplies negative logits of every token seen (prompt and output);
    `frequency_penalty` subtracts itself times each token's count in the output,
    `presence_penalty` itself from every token present in the output. `min_tokens`: the end
    tokens cannot be chosen before that many tokens were generated.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 0.0
    seed: int = 0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0

    @property
    def greedy(self) -> bool:
        return (self.temperature < MIN_TEMPERATURE or self.top_k == 1
                or (self.top_k == 0 and self.top_p <= 0))

    @property
    def penalized(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)

    def problem(self) -> str:
        """Why these parameters cannot run ('' if they can), naming the parameter."""
        if not _finite(self.temperature) or self.temperature < 0:
            return f"temperature must be a finite number >= 0, got {self.temperature}"
        if not isinstance(self.top_k, int) or self.top_k < 0:
            return f"top_k must be an integer >= 0, got {self.top_k}"
        if not _finite(self.top_p) or not 0 <= self.top_p <= 1:
            return f"top_p must be a number in [0, 1], got {self.top_p}"
        if not isinstance(self.seed, int) or not 0 <= self.seed < 2 ** 64:
            return f"seed must be an integer in [0, 2**64), got {self.seed}"
        if not _finite(self.repetition_penalty) or self.repetition_penalty <= 0:
            return f"repetition_penalty must be a finite number > 0, got {self.repetition_penalty}"
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _finite(value) or not -2 <= value <= 2:
                return f"{name} must be a number in [-2, 2], got {value}"
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            return f"min_tokens must be an integer >= 0, got {self.min_tokens}"
        return ""


@dataclass
class GenerationRequest:
    """One request, as `get_new_requests` returns it (the seed's InferenceRequest)."""

    request_id: int
    input_ids: list[int]
    max_new_tokens: int
    end_id: int | None = None  # stop when this token is generated (it is kept in the output)
    pad_id: int | None = None  # fills output_ids of beams that ended early, and padded outputs
    streaming: bool = False
    sampling: SamplingParams = field(default_factory=SamplingParams)
    beam_width: int = 1
    length_penalty: float = 1.0  # beam search: a beam's score is cum_log_prob / length**this
    return_log_probs: bool = False
    top_log_probs: int = 0  # per token, the log probs of the k most likely tokens (k <= 20)
    return_context_logits: bool = False
    return_generation_logits: bool = False
    logits_post_processor: LogitsPostProcessor | None = None
    client_id: int | None = None
    exclude_input_in_output: bool = False  # non-streaming output_ids: generated tokens only
    stop_token_ids: list[int] = field(default_factory=list)  # more end tokens (kept in the output)
    # token sequences (TensorRT-LLM's stop_words / bad_words): generation ends once the output
    # ends with a stop sequence (kept in the output); a bad sequence's last token is never chosen
    # right after the rest of it
    stop_words: list[list[int]] = field(default_factory=list)
    bad_words: list[list[int]] = field(default_factory=list)
    # text-level stop (a front end's stop strings): called on the worker thread with the tokens
    # generated so far after each one; True ends the request there
    stop_check: Callable[[list[int]], bool] | None = None
    # output_ids padded with pad_id to [1, beam, max_seq_len] (the seed's response shape)
    pad_to_max_length: bool = False
    arrival_ns: int = field(default_factory=time.monotonic_ns)  # for queue time and latency

    def problem(self) -> str:
        """Why the request's own values cannot run ('' if they can), naming the parameter."""
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            return (f"the number of tokens to generate (max_tokens, request_output_len) must be at "
                    f"least 1, got {self.max_new_tokens}")
        if not isinstance(self.beam_width, int) or self.beam_width < 1:
            return f"beam_width must be an integer >= 1, got {self.beam_width}"
        if not _finite(self.length_penalty):
            return f"length_penalty must be a finite number, got {self.length_penalty}"
        if not isinstance(self.top_log_probs, int) or not 0 <= self.top_log_probs <= 20:
            return f"top_logprobs must be an integer in [0, 20], got {self.top_log_probs}"
        if self.sampling.min_tokens > self.max_new_tokens:
            return (f"min_tokens ({self.sampling.min_tokens}) must not exceed the number of tokens "
                    f"to generate ({self.max_new_tokens})")
        for name in ("stop_words", "bad_words"):
            for words in getattr(self, name):
                if not words:
                    return f"{name} holds an empty sequence"
        return self.sampling.problem()


class Phase(enum.Enum):
    WAITING = "waiting"  # received, not admitted (or paused: admitted before, blocks given back)
    CONTEXT = "context"  # admitted, prompt (or recomputation) not fully in the KV cache yet
    GENERATION = "generation"


class Sequence:
    """The manager's state of one request. `tokens` is prompt + generated; the first
    `num_cached` of them have keys/values in the cache (in the blocks of `block_table`)."""

    __slots__ = ("request", "tokens", "prompt_len", "phase", "block_table", "block_hashes",
                 "num_cached", "generator", "log_probs", "context_logits", "generation_logits",
                 "sent", "paused_times", "admitted_at", "reserved_blocks", "extra", "counts",
                 "first_scheduled_ns", "first_token_ns", "last_token_ns", "top", "stopped",
                 "beam", "plain", "quick")

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
        self.counts: Any = None  # output token counts (penalties), a tensor made when needed
        self.first_scheduled_ns = 0
        self.first_token_ns = 0
        self.last_token_ns = 0
        self.top: list[tuple[list[int], list[float]]] = []  # per token: top ids, their log probs
        self.stopped = False  # a stop sequence or stop_check ended it
        self.beam: Any = None  # host.inflight.beam.BeamGroup of a beam-search request
        # greedy, nothing to adjust, nothing to report beside the token: the sampler's fast path
        s = request.sampling
        self.plain = (s.greedy and not s.penalized and not s.min_tokens and not request.bad_words
                      and request.logits_post_processor is None and not request.return_log_probs
                      and not request.top_log_probs and not request.return_generation_logits)
        self.quick = self.plain and request.stop_check is None  # and nothing to check per token

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
        r, tokens = self.request, self.tokens
        generated = len(tokens) - self.prompt_len
        if generated >= r.max_new_tokens or self.stopped:
            return True
        if generated == 0:
            return False
        last = tokens[-1]
        if last == r.end_id or last in r.stop_token_ids:
            return True
        for words in r.stop_words:
            if len(words) <= generated and tokens[-len(words):] == words:
                return True
        return False
