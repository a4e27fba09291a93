"""A small decoder-only transformer that reads and writes the paged KV cache directly.

Random weights from a fixed seed (no downloads): `TinyDecoder(DecoderConfig(seed=...))` is the
same model on every machine. Pre-norm blocks, learned positions, multi-head attention (grouped-
query when `kv_heads` < `heads`: fewer keys and values to store and read), GELU MLP, an output
projection of its own.

`forward(batch, cache)` runs one iteration's flat batch (`host.inflight.step.StepBatch`): the
projections run once over all tokens of all requests; each token's key and value go into its cache
slot; attention reads each request's own slots only (`host.inflight.attention`).

`reference_logits(tokens)` is the textbook computation (no cache, whole sequence, causal
attention) the tests check the paged path against.

Any model with the same `forward` contract and the attributes `layers`, `heads`, `head_dim`,
`vocab_size`, `max_seq_len`, `dtype`, `device` can run under the batch manager.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import torch
from torch import nn
from torch.nn import functional as F

from host.inflight.attention import paged_attention
if TYPE_CHECKING:
    from host.inflight.kv_cache import KVCache
    from host.inflight.step import StepBatch

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
          "float16": torch.float16}


F_ = TypeVar("F_", bound=Callable[..., Any])


def inference(forward: F_) -> F_:
    """`torch.inference_mode` around a decoder's forward pass, entered only when the caller is not
    in it already. The batch manager's worker thread runs in inference mode for its whole life:
    entering the mode anew for every step was a sixth of the host work of a step (py-spy, offline
    run at batch 16), more than any other single part of it."""
    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        if torch.is_inference_mode_enabled():
            return forward(*args, **kwargs)
        with torch.inference_mode():
            return forward(*args, **kwargs)
    return run  # type: ignore[return-value]


@dataclass
class DecoderConfig:
    vocab_size: int = 512
    d_model: int = 128
    heads: int = 4
    kv_heads: int = 0  # grouped-query attention: heads sharing keys/values (0: as many as heads)
    layers: int = 2
    d_ff: int = 512
    max_seq_len: int = 1024
    seed: int = 0
    dtype: str = "float32"

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> DecoderConfig:
        known = cls.__dataclass_fields__
        unknown = set(values) - set(known)
        if unknown:
            raise ValueError(f"unknown decoder settings: {', '.join(sorted(unknown))}")
        return cls(**{k: type(getattr(cls, k))(v) for k, v in values.items()})

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Block(nn.Module):
    def __init__(self, c: DecoderConfig, kv_width: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(c.d_model)
        self.qkv = nn.Linear(c.d_model, c.d_model + 2 * kv_width)
        self.out = nn.Linear(c.d_model, c.d_model)
        self.ln2 = nn.LayerNorm(c.d_model)
        self.up = nn.Linear(c.d_model, c.d_ff)
        self.down = nn.Linear(c.d_ff, c.d_model)


class TinyDecoder(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        if config.d_model % config.heads:
            raise ValueError(f"d_model {config.d_model} is not a multiple of heads {config.heads}")
        self.config = config
        self.vocab_size, self.max_seq_len = config.vocab_size, config.max_seq_len
        self.layers, self.heads = config.layers, config.heads
        self.kv_heads = config.kv_heads or config.heads
        if config.heads % self.kv_heads:
            raise ValueError(f"heads {config.heads} is not a multiple of kv_heads {self.kv_heads}")
        self.head_dim = config.d_model // config.heads
        self.dtype = DTYPES[config.dtype]
        self.device = torch.device("cpu")
        self.window: int | None = None  # maxAttentionWindow (set by the manager's option)
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.pos = nn.Embedding(config.max_seq_len, config.d_model)
        self.blocks = nn.ModuleList(_Block(config, self.kv_heads * self.head_dim)
                                    for _ in range(config.layers))
        self.ln_f = nn.LayerNorm(config.d_model)
        # Not tied to the embedding: with random weights a tied head predicts the input token
        # itself, and greedy decoding would repeat one token forever.
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self._init_weights(config.seed)
        self.to(self.dtype)
        self.eval()

    def _init_weights(self, seed: int) -> None:
        """Deterministic random weights, scaled so the logits are spread (a sharp, varied
        distribution makes greedy decoding meaningful to compare)."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    p.zero_()
                elif p.dim() == 1:  # layer-norm gains
                    p.fill_(1.0)
                else:
                    std = 1.0 if "embed" in name or name.startswith("pos") else p.shape[1] ** -0.5
                    p.copy_(torch.randn(p.shape, generator=g) * std)

    def to_device(self, device: torch.device | str) -> TinyDecoder:
        self.device = torch.device(device)
        return self.to(self.device)

    # --- the paged path --------------------------------------------------------------------------
    @inference
    def forward(self, batch: StepBatch, cache: KVCache) -> torch.Tensor:
        """Logits [rows of batch.logits_index, vocab] for one flat iteration batch."""
        x = self.embed(batch.input_ids) + self.pos(batch.positions)
        t = x.shape[0]
        for i, blk in enumerate(self.blocks):
            q, k, v = self._qkv(blk, x)
            keys, values = cache.keys[i], cache.values[i]
            keys.index_copy_(0, batch.slots, k)
            values.index_copy_(0, batch.slots, v)
            attn = paged_attention(q, keys, values, batch, self.window)
            x = x + blk.out(attn.reshape(t, -1))
            x = x + blk.down(F.gelu(blk.up(blk.ln2(x))))
        x = self.ln_f(x[batch.logits_index])
        return self.head(x)

    def _qkv(self, blk: _Block, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        t, kv = x.shape[0], self.kv_heads * self.head_dim
        q, k, v = blk.qkv(blk.ln1(x)).split([self.heads * self.head_dim, kv, kv], dim=-1)
        return (q.view(t, self.heads, self.head_dim), k.view(t, self.kv_heads, self.head_dim),
                v.view(t, self.kv_heads, self.head_dim))

    # --- the reference path ----------------------------------------------------------------------
    @torch.inference_mode()
    def reference_logits(self, tokens: list[int]) -> torch.Tensor:
        """Logits [len(tokens), vocab] by plain causal attention over the whole sequence."""
        ids = torch.tensor(tokens, dtype=torch.int64, device=self.device)
        x = self.embed(ids) + self.pos(torch.arange(len(tokens), device=self.device))
        t = x.shape[0]
        for blk in self.blocks:
            q, k, v = (a.transpose(0, 1) for a in self._qkv(blk, x))
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + blk.out(o.transpose(0, 1).reshape(t, -1))
            x = x + blk.down(F.gelu(blk.up(blk.ln2(x))))
        return self.head(self.ln_f(x))
