#!/usr/bin/env python3
"""Write a generation model for the "inflight" backend into a model repository.

    python scripts/make_llm.py model_repository/tiny_llm            # config.pbtxt (+ version dir)
    python scripts/make_llm.py /tmp/repo/llm --layers 4 --d-model 256 --weights

The decoder is `host.inflight.TinyDecoder` with random weights from `--seed`: the config alone
is enough (the backend generates the weights at load, the same on every machine); `--weights`
also writes them to `<dir>/1/model.pt` (needs torch here), which the backend then loads instead.
The example `model_repository/tiny_llm/config.pbtxt` is this script's output with the defaults.
"""

from __future__ import annotations

import argparse
from pathlib import Path

CONFIG = """\
# {name}: a small decoder-only transformer (random weights from seed {seed}, no downloads),
# served through the in-flight batch manager (backend "inflight", docs/inflight.md).
# Written by scripts/make_llm.py. Tensor and parameter names are those of Triton's
# TensorRT-LLM backend. Decoupled: stream tokens with gRPC ModelStreamInfer or HTTP
# generate_stream (streaming: true); without streaming one response carries them all.
name: "{name}"
backend: "inflight"
max_batch_size: {max_batch_size}
model_transaction_policy {{
  decoupled: true
}}
input [
  {{ name: "input_ids" data_type: TYPE_INT32 dims: [ -1 ] }},
  {{ name: "input_lengths" data_type: TYPE_INT32 dims: [ 1 ] optional: true }},
  {{ name: "request_output_len" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "end_id" data_type: TYPE_INT32 dims: [ 1 ] optional: true }},
  {{ name: "pad_id" data_type: TYPE_INT32 dims: [ 1 ] optional: true }},
  {{ name: "streaming" data_type: TYPE_BOOL dims: [ 1 ] optional: true }},
  {{ name: "beam_width" data_type: TYPE_INT32 dims: [ 1 ] optional: true }},
  {{ name: "temperature" data_type: TYPE_FP32 dims: [ 1 ] optional: true }},
  {{ name: "runtime_top_k" data_type: TYPE_INT32 dims: [ 1 ] optional: true }},
  {{ name: "runtime_top_p" data_type: TYPE_FP32 dims: [ 1 ] optional: true }},
  {{ name: "random_seed" data_type: TYPE_UINT64 dims: [ 1 ] optional: true }},
  {{ name: "return_log_probs" data_type: TYPE_BOOL dims: [ 1 ] optional: true }},
  {{ name: "return_context_logits" data_type: TYPE_BOOL dims: [ 1 ] optional: true }},
  {{ name: "return_generation_logits" data_type: TYPE_BOOL dims: [ 1 ] optional: true }}
]
output [
  {{ name: "output_ids" data_type: TYPE_INT32 dims: [ -1, -1 ] }},
  {{ name: "sequence_length" data_type: TYPE_INT32 dims: [ -1 ] }},
  {{ name: "cum_log_probs" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "output_log_probs" data_type: TYPE_FP32 dims: [ -1, -1 ] }},
  {{ name: "context_logits" data_type: TYPE_FP32 dims: [ -1, -1 ] }},
  {{ name: "generation_logits" data_type: TYPE_FP32 dims: [ -1, -1, -1 ] }}
]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
parameters [
{parameters}
]
"""


def parameters(args: argparse.Namespace) -> dict[str, str]:
    return {
        # the decoder (host.inflight.DecoderConfig)
        "vocab_size": str(args.vocab_size), "d_model": str(args.d_model), "heads": str(args.heads),
        "kv_heads": str(args.kv_heads),
        "layers": str(args.layers), "d_ff": str(args.d_ff), "max_seq_len": str(args.max_seq_len),
        "seed": str(args.seed), "dtype": args.dtype,
        # the batch manager
        "batch_scheduler_policy": args.policy,
        "max_num_tokens": str(args.max_num_tokens),
        "enable_chunked_context": "true",
        "max_tokens_in_paged_kv_cache": str(args.kv_tokens),
        "tokens_per_block": "16",
        "enable_kv_cache_reuse": "true",
        "exclude_input_in_output": "true",
    }


def render(args: argparse.Namespace) -> str:
    params = ",\n".join(f'  {{ key: "{k}" value: {{ string_value: "{v}" }} }}'
                        for k, v in parameters(args).items())
    return CONFIG.format(name=args.out.name, seed=args.seed, max_batch_size=args.max_batch_size,
                         parameters=params)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="the model directory (its name is the model's name)")
    p.add_argument("--vocab-size", type=int, default=512)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=0, help="grouped-query attention (0: = heads)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-ff", type=int, default=512)
    p.add_argument("--max-seq-len", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--max-batch-size", type=int, default=8)
    p.add_argument("--max-num-tokens", type=int, default=512)
    p.add_argument("--kv-tokens", type=int, default=8192, help="max_tokens_in_paged_kv_cache")
    p.add_argument("--policy", default="max_utilization",
                   choices=["max_utilization", "guaranteed_no_evict", "static_batch"])
    p.add_argument("--weights", action="store_true", help="also write <out>/1/model.pt")
    args = p.parse_args(argv)
    (args.out / "1").mkdir(parents=True, exist_ok=True)
    (args.out / "config.pbtxt").write_text(render(args))
    keep = args.out / "1" / ".gitkeep"
    if not args.weights:
        keep.touch()
    else:
        import torch

        from host.inflight import DecoderConfig, TinyDecoder

        keys = ("vocab_size", "d_model", "heads", "kv_heads", "layers", "d_ff", "max_seq_len", "seed", "dtype")
        config = DecoderConfig.from_dict({k: getattr(args, k) for k in keys})
        torch.save(TinyDecoder(config).state_dict(), args.out / "1" / "model.pt")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
