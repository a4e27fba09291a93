"""Hugging Face checkpoints (config.json + *.safetensors) as paged-KV decoders for the batch manager.

    model = load_checkpoint("path/to/dir", dtype="bfloat16", device="cpu")

Architectures (`model_type` of config.json):
- the Llama family, `llama`, `mistral`, `qwen2`: RoPE (default, linear and llama3 scaling),
  RMSNorm, SwiGLU, grouped-query attention; Qwen2's q/k/v biases; Mistral's `sliding_window`;
- `gpt2`: learned positions, LayerNorm, GELU (tanh), fused qkv in Conv1D layout.

Weights are memory-mapped with `safetensors` (every `*.safetensors` file of the directory) and
checked against the config before anything runs: a missing tensor, an unexpected one, or a
shape that does not follow from the config is a `CheckpointError` naming the tensor and both
shapes. The computation follows the `transformers` modeling code (same operations, same order,
norms in float32), so greedy tokens are those of `transformers`' `generate` on the same files.
On a CPU, float32 weights are laid out once for the matrix library (`host.inflight.linear`):
its products sum in another order than `F.linear`'s, which moves logits by rounding only.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn import functional as F

from host.inflight.attention import paged_attention
from host.inflight.linear import Dense
from host.inflight.model import inference

if TYPE_CHECKING:
    from host.inflight.kv_cache import KVCache
    from host.inflight.step import StepBatch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64}
LLAMA_TYPES = ("llama", "mistral", "qwen2")
SUPPORTED = LLAMA_TYPES + ("gpt2",)


class CheckpointError(ValueError):
    """The checkpoint cannot be served (unsupported, or its weights do not match its config)."""


def read_config(path: Path) -> dict[str, Any]:
    file = path / "config.json"
    if not file.is_file():
        raise CheckpointError(f"'{path}' holds no config.json (not a Hugging Face checkpoint)")
    try:
        config = json.loads(file.read_text())
    except ValueError as exc:
        raise CheckpointError(f"'{file}' is not valid JSON: {exc}") from None
    kind = config.get("model_type")
    if kind not in SUPPORTED:
        raise CheckpointError(f"model_type '{kind}' of '{file}' is not supported "
                              f"(supported: {', '.join(SUPPORTED)})")
    return config


def open_weights(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the directory's safetensors files, memory-mapped (nothing is read yet)."""
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"'{path}' holds no *.safetensors file")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                tensors[key] = f.get_tensor(key)  # a view of the mapped file
    return tensors


def load_checkpoint(path: str | Path, dtype: str = "", device: str = "cpu",
                    max_attention_window: int | None = None, pack: bool = True) -> nn.Module:
    """The decoder of the checkpoint in `path` (dtype: the config's `torch_dtype`/`dtype` if '';
    pack: float32 weights on a CPU laid out for its matrix library, `host.inflight.linear`)."""
    path = Path(path)
    config = read_config(path)
    name = dtype or config.get("dtype") or config.get("torch_dtype") or "float32"
    if name not in DTYPES:
        raise CheckpointError(f"dtype '{name}' is not supported (one of {', '.join(DTYPES)})")
    cls = GPT2Decoder if config["model_type"] == "gpt2" else LlamaDecoder
    model = cls(config, open_weights(path), DTYPES[name], torch.device(device), pack)
    if max_attention_window is not None:
        model.window = max_attention_window if model.window is None else min(model.window,
                                                                             max_attention_window)
    return model


class _Weights:
    """Takes tensors out of the file map by name, checking each shape; lists what is left over."""

    def __init__(self, tensors: dict[str, torch.Tensor], prefixes: tuple[str, ...], dtype: torch.dtype,
                 device: torch.device) -> None:
        self.tensors, self.dtype, self.device = dict(tensors), dtype, device
        self.prefix = next((p for p in prefixes if any(k.startswith(p) for k in tensors)), "")

    def take(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        t = self.maybe(name, shape)
        if t is None:
            raise CheckpointError(f"tensor '{self.prefix + name}' is missing from the checkpoint")
        return t

    def maybe(self, name: str, shape: tuple[int, ...], optional: bool = True) -> torch.Tensor | None:
        """The tensor, or None when it is absent (and `optional`; else it is an error)."""
        key = self.prefix + name if self.prefix + name in self.tensors else name
        t = self.tensors.pop(key, None)
        if t is None:
            if not optional:
                raise CheckpointError(f"tensor '{self.prefix + name}' is missing from the checkpoint")
            return None
        if tuple(t.shape) != shape:
            raise CheckpointError(f"tensor '{key}' has shape {list(t.shape)}; the config implies "
                                  f"{list(shape)}")
        return t.to(device=self.device, dtype=self.dtype).contiguous()

    def finish(self, ignore: tuple[str, ...] = ()) -> None:
        left = sorted(k for k in self.tensors if not any(s in k for s in ignore))
        if left:
            more = f" (and {len(left) - 5} more)" if len(left) > 5 else ""
            raise CheckpointError(f"the checkpoint has tensors the config does not explain: "
                                  f"{', '.join(left[:5])}{more}")


class _Decoder(nn.Module):
    """What the batch manager reads: layers, heads, kv_heads, head_dim, vocab_size, max_seq_len,
    dtype, device, window; plus the checkpoint's config and token ids."""

    def __init__(self, config: dict[str, Any], dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.hf_config = config
        self.dtype, self.device = dtype, device
        self.window: int | None = None
        eos = config.get("eos_token_id")
        self.eos_token_ids: list[int] = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        self.bos_token_id: int | None = config.get("bos_token_id")
        self.pad_token_id: int | None = config.get("pad_token_id")

    def _positive(self, key: str) -> int:
        value = self.hf_config.get(key)
        if not isinstance(value, int) or value < 1:
            raise CheckpointError(f"config.json: '{key}' must be a positive integer, got {value!r}")
        return value


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # as transformers' LlamaRMSNorm: in float32, weight applied in the input dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope_inv_freq(config: dict[str, Any], head_dim: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and the position scale (transformers' rope initialization)."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if kind == "default":
        return inv, 1.0
    if kind == "linear":
        return inv / float(params["factor"]), 1.0
    if kind == "llama3":
        factor, low, high = float(params["factor"]), float(params["low_freq_factor"]), float(params["high_freq_factor"])
        old = float(params["original_max_position_embeddings"])
        low_wl, high_wl = old / low, old / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wl, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wl) & ~(wavelen > low_wl)
        return torch.where(medium, smoothed, scaled), 1.0
    raise CheckpointError(f"rope type '{kind}' is not supported (default, linear, llama3)")


class LlamaDecoder(_Decoder):
    """Llama, Mistral, Qwen2 (pre-norm RMSNorm blocks, RoPE, GQA, SwiGLU)."""

    def __init__(self, config: dict[str, Any], tensors: dict[str, torch.Tensor], dtype: torch.dtype,
                 device: torch.device, pack: bool = True) -> None:
        super().__init__(config, dtype, device)
        kind = config["model_type"]
        hidden, self.layers = self._positive("hidden_size"), self._positive("num_hidden_layers")
        self.heads = self._positive("num_attention_heads")
        self.kv_heads = config.get("num_key_value_heads") or self.heads
        if self.heads % self.kv_heads:
            raise CheckpointError(f"config.json: num_attention_heads {self.heads} is not a multiple "
                                  f"of num_key_value_heads {self.kv_heads}")
        self.head_dim = config.get("head_dim") or hidden // self.heads
        self.vocab_size = self._positive("vocab_size")
        self.max_seq_len = self._positive("max_position_embeddings")
        inter = self._positive("intermediate_size")
        act = config.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise CheckpointError(f"config.json: hidden_act '{act}' is not supported (silu)")
        self.eps = float(config.get("rms_norm_eps", 1e-6))
        if kind == "mistral" and config.get("sliding_window"):
            self.window = int(config["sliding_window"])
        if kind == "qwen2" and config.get("use_sliding_window") and config.get("sliding_window"):
            raise CheckpointError("config.json: Qwen2 with use_sliding_window is not supported")
        bias = kind == "qwen2" or bool(config.get("attention_bias"))
        mlp_bias = bool(config.get("mlp_bias"))
        w = _Weights(tensors, ("model.",), dtype, device)
        q_out, kv_out = self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.embed = w.take("embed_tokens.weight", (self.vocab_size, hidden))
        self.blocks: list[dict[str, Any]] = []
        for i in range(self.layers):
            p = f"layers.{i}."
            self.blocks.append({
                "ln1": w.take(p + "input_layernorm.weight", (hidden,)),
                "q": w.take(p + "self_attn.q_proj.weight", (q_out, hidden)),
                "k": w.take(p + "self_attn.k_proj.weight", (kv_out, hidden)),
                "v": w.take(p + "self_attn.v_proj.weight", (kv_out, hidden)),
                "qb": w.maybe(p + "self_attn.q_proj.bias", (q_out,), optional=not bias),
                "kb": w.maybe(p + "self_attn.k_proj.bias", (kv_out,), optional=not bias),
                "vb": w.maybe(p + "self_attn.v_proj.bias", (kv_out,), optional=not bias),
                "o": w.take(p + "self_attn.o_proj.weight", (hidden, q_out)),
                "ob": w.maybe(p + "self_attn.o_proj.bias", (hidden,), optional=True),
                "ln2": w.take(p + "post_attention_layernorm.weight", (hidden,)),
                "gate": w.take(p + "mlp.gate_proj.weight", (inter, hidden)),
                "up": w.take(p + "mlp.up_proj.weight", (inter, hidden)),
                "down": w.take(p + "mlp.down_proj.weight", (hidden, inter)),
                "gate_b": w.maybe(p + "mlp.gate_proj.bias", (inter,), optional=not mlp_bias),
                "up_b": w.maybe(p + "mlp.up_proj.bias", (inter,), optional=not mlp_bias),
                "down_b": w.maybe(p + "mlp.down_proj.bias", (hidden,), optional=not mlp_bias),
            })
        for b in self.blocks:  # one matrix product for q, k, v and one for gate, up: fewer, larger
            biases = [b.pop("qb"), b.pop("kb"), b.pop("vb")]
            b["qkv"] = Dense(torch.cat([b.pop("q"), b.pop("k"), b.pop("v")]),
                             None if biases[0] is None else torch.cat(biases), pack)
            b["o"] = Dense(b["o"], b.pop("ob"), pack)
            biases = [b.pop("gate_b"), b.pop("up_b")]
            b["gate_up"] = Dense(torch.cat([b.pop("gate"), b.pop("up")]),
                                 None if biases[0] is None else torch.cat(biases), pack)
            b["down"] = Dense(b["down"], b.pop("down_b"), pack)
        self.norm = w.take("norm.weight", (hidden,))
        w.prefix = ""
        head = w.maybe("lm_head.weight", (self.vocab_size, hidden),
                       optional=bool(config.get("tie_word_embeddings", False)))
        self.lm_head = Dense(self.embed if head is None else head, None, pack)
        w.finish(ignore=("rotary_emb.inv_freq",))
        self._qkv_split = [q_out, kv_out, kv_out]
        inv_freq, _ = _rope_inv_freq(config, self.head_dim)
        self.inv_freq = inv_freq.to(device)

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(self.dtype)[:, None, :], emb.sin().to(self.dtype)[:, None, :]

    @inference
    def forward(self, batch: StepBatch, cache: KVCache) -> torch.Tensor:
        x = F.embedding(batch.input_ids, self.embed)
        t = x.shape[0]
        cos, sin = self._rope(batch.positions)
        for i, b in enumerate(self.blocks):
            h = _rms_norm(x, b["ln1"], self.eps)
            q, k, v = b["qkv"](h).split(self._qkv_split, dim=-1)
            q = q.reshape(t, self.heads, self.head_dim)
            k = k.reshape(t, self.kv_heads, self.head_dim)
            v = v.reshape(t, self.kv_heads, self.head_dim)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            keys, values = cache.keys[i], cache.values[i]
            keys.index_copy_(0, batch.slots, k)
            values.index_copy_(0, batch.slots, v)
            attn = paged_attention(q, keys, values, batch, self.window)
            x = x + b["o"](attn.reshape(t, -1))
            h = _rms_norm(x, b["ln2"], self.eps)
            gate, up = b["gate_up"](h).chunk(2, dim=-1)
            x = x + b["down"](F.silu(gate) * up)
        return self.lm_head(_rms_norm(x[batch.logits_index], self.norm, self.eps))


class GPT2Decoder(_Decoder):
    """GPT-2 (pre-norm LayerNorm blocks, learned positions, GELU tanh, tied output)."""

    def __init__(self, config: dict[str, Any], tensors: dict[str, torch.Tensor], dtype: torch.dtype,
                 device: torch.device, pack: bool = True) -> None:
        super().__init__(config, dtype, device)
        hidden, self.layers = self._positive("n_embd"), self._positive("n_layer")
        self.heads = self.kv_heads = self._positive("n_head")
        if hidden % self.heads:
            raise CheckpointError(f"config.json: n_embd {hidden} is not a multiple of n_head {self.heads}")
        self.head_dim = hidden // self.heads
        self.vocab_size = self._positive("vocab_size")
        self.max_seq_len = self._positive("n_positions")
        inner = config.get("n_inner") or 4 * hidden
        act = config.get("activation_function", "gelu_new")
        if act not in ("gelu_new", "gelu_pytorch_tanh", "gelu"):
            raise CheckpointError(f"config.json: activation_function '{act}' is not supported")
        self.approximate = "none" if act == "gelu" else "tanh"
        if config.get("scale_attn_by_inverse_layer_idx") or config.get("reorder_and_upcast_attn"):
            raise CheckpointError("config.json: scale_attn_by_inverse_layer_idx and "
                                  "reorder_and_upcast_attn are not supported")
        self.eps = float(config.get("layer_norm_epsilon", 1e-5))
        w = _Weights(tensors, ("transformer.",), dtype, device)
        self.wte = w.take("wte.weight", (self.vocab_size, hidden))
        self.wpe = w.take("wpe.weight", (self.max_seq_len, hidden))
        self.blocks: list[dict[str, Any]] = []
        for i in range(self.layers):
            p = f"h.{i}."
            self.blocks.append({
                "ln1_w": w.take(p + "ln_1.weight", (hidden,)), "ln1_b": w.take(p + "ln_1.bias", (hidden,)),
                # Conv1D stores [in, out]: transposed once here for F.linear
                "qkv": Dense(w.take(p + "attn.c_attn.weight", (hidden, 3 * hidden)).t().contiguous(),
                             w.take(p + "attn.c_attn.bias", (3 * hidden,)), pack),
                "o": Dense(w.take(p + "attn.c_proj.weight", (hidden, hidden)).t().contiguous(),
                           w.take(p + "attn.c_proj.bias", (hidden,)), pack),
                "ln2_w": w.take(p + "ln_2.weight", (hidden,)), "ln2_b": w.take(p + "ln_2.bias", (hidden,)),
                "fc": Dense(w.take(p + "mlp.c_fc.weight", (hidden, inner)).t().contiguous(),
                            w.take(p + "mlp.c_fc.bias", (inner,)), pack),
                "proj": Dense(w.take(p + "mlp.c_proj.weight", (inner, hidden)).t().contiguous(),
                              w.take(p + "mlp.c_proj.bias", (hidden,)), pack),
            })
        self.ln_f_w, self.ln_f_b = w.take("ln_f.weight", (hidden,)), w.take("ln_f.bias", (hidden,))
        w.prefix = ""
        head = w.maybe("lm_head.weight", (self.vocab_size, hidden), optional=True)
        self.lm_head = Dense(self.wte if head is None else head, None, pack)
        w.finish(ignore=(".attn.bias", ".attn.masked_bias"))
        self.hidden = hidden

    @inference
    def forward(self, batch: StepBatch, cache: KVCache) -> torch.Tensor:
        x = F.embedding(batch.input_ids, self.wte) + F.embedding(batch.positions, self.wpe)
        t, hd = x.shape[0], (self.hidden,)
        for i, b in enumerate(self.blocks):
            h = F.layer_norm(x, hd, b["ln1_w"], b["ln1_b"], self.eps)
            q, k, v = b["qkv"](h).view(t, 3, self.heads, self.head_dim).unbind(1)
            keys, values = cache.keys[i], cache.values[i]
            keys.index_copy_(0, batch.slots, k)
            values.index_copy_(0, batch.slots, v)
            attn = paged_attention(q, keys, values, batch, self.window)
            x = x + b["o"](attn.reshape(t, -1))
            h = F.layer_norm(x, hd, b["ln2_w"], b["ln2_b"], self.eps)
            x = x + b["proj"](F.gelu(b["fc"](h), approximate=self.approximate))
        x = F.layer_norm(x[batch.logits_index], hd, self.ln_f_w, self.ln_f_b, self.eps)
        return self.lm_head(x)
