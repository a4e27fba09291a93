#!/usr/bin/env python3
"""Write a tiny Hugging Face checkpoint (random weights, a small trained tokenizer) as a model of
the "inflight" backend: `<out>/config.pbtxt` and `<out>/1/` holding config.json,
model.safetensors, tokenizer.json, tokenizer_config.json (with a ChatML chat template) and
generation_config.json. Nothing is downloaded: `transformers` builds the model from a config.

    python scripts/make_hf_llm.py model_repository/tiny_chat                 # the example
    python scripts/make_hf_llm.py /tmp/repo/m --arch gpt2 --hidden 32 --layers 2

The tokenizer is a byte-level BPE trained here on a few lines of text (so any text encodes);
the weights are random (seeded), so the model writes fluent nonsense: it exists to exercise the
real checkpoint path, the tokenizer and the chat template end to end.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
          " + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\\n' }}{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = """modelhost serves Triton model repositories over HTTP and gRPC.
The batch manager runs requests in flight: new requests join at the next iteration.
Hello, how are you today? I am fine, thank you. What is the weather like?
The quick brown fox jumps over the lazy dog. 0123456789 + - * / = ( ) [ ] { } < > ! ? . , ; :
A paged KV cache keeps keys and values in blocks; requests that share a prefix share blocks.
"""

CONFIG = """\
# {name}: a tiny {arch} checkpoint in Hugging Face format (random weights, written by
# scripts/make_hf_llm.py), served through the in-flight batch manager with its tokenizer and
# chat template. Text in and out: Triton's generate extension (text_input / text_output) and the
# OpenAI-compatible API (/v1/completions, /v1/chat/completions). See docs/llm.md.
name: "{name}"
backend: "inflight"
max_batch_size: 8
model_transaction_policy {{
  decoupled: true
}}
input [
  {{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] optional: true }},
  {{ name: "input_ids" data_type: TYPE_INT32 dims: [ -1 ] optional: true }},
  {{ name: "input_lengths" data_type: TYPE_INT32 dims: [ 1 ] optional: true }},
  {{ name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] optional: true }},
  {{ name: "request_output_len" data_type: TYPE_INT32 dims: [ 1 ] optional: true }},
  {{ name: "end_id" data_type: TYPE_INT32 dims: [ 1 ] optional: true }},
  {{ name: "pad_id" data_type: TYPE_INT32 dims: [ 1 ] optional: true }},
  {{ name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true }},
  {{ name: "streaming" data_type: TYPE_BOOL dims: [ 1 ] optional: true }},
  {{ name: "beam_width" data_type: TYPE_INT32 dims: [ 1 ] optional: true }},
  {{ name: "temperature" data_type: TYPE_FP32 dims: [ 1 ] optional: true }},
  {{ name: "top_k" data_type: TYPE_INT32 dims: [ 1 ] optional: true }},
  {{ name: "top_p" data_type: TYPE_FP32 dims: [ 1 ] optional: true }},
  {{ name: "runtime_top_k" data_type: TYPE_INT32 dims: [ 1 ] optional: true }},
  {{ name: "runtime_top_p" data_type: TYPE_FP32 dims: [ 1 ] optional: true }},
  {{ name: "random_seed" data_type: TYPE_UINT64 dims: [ 1 ] optional: true }},
  {{ name: "repetition_penalty" data_type: TYPE_FP32 dims: [ 1 ] optional: true }},
  {{ name: "presence_penalty" data_type: TYPE_FP32 dims: [ 1 ] optional: true }},
  {{ name: "frequency_penalty" data_type: TYPE_FP32 dims: [ 1 ] optional: true }},
  {{ name: "min_length" data_type: TYPE_INT32 dims: [ 1 ] optional: true }},
  {{ name: "length_penalty" data_type: TYPE_FP32 dims: [ 1 ] optional: true }},
  {{ name: "stop_words" data_type: TYPE_STRING dims: [ -1 ] optional: true }},
  {{ name: "bad_words" data_type: TYPE_STRING dims: [ -1 ] optional: true }},
  {{ name: "return_log_probs" data_type: TYPE_BOOL dims: [ 1 ] optional: true }},
  {{ name: "return_context_logits" data_type: TYPE_BOOL dims: [ 1 ] optional: true }},
  {{ name: "return_generation_logits" data_type: TYPE_BOOL dims: [ 1 ] optional: true }},
  {{ name: "exclude_input_in_output" data_type: TYPE_BOOL dims: [ 1 ] optional: true }},
  {{ name: "sampling_parameters" data_type: TYPE_STRING dims: [ 1 ] optional: true }}
]
output [
  {{ name: "text_output" data_type: TYPE_STRING dims: [ -1 ] }},
  {{ name: "output_ids" data_type: TYPE_INT32 dims: [ -1, -1 ] }},
  {{ name: "sequence_length" data_type: TYPE_INT32 dims: [ -1 ] }},
  {{ name: "cum_log_probs" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "output_log_probs" data_type: TYPE_FP32 dims: [ -1, -1 ] }},
  {{ name: "top_token_ids" data_type: TYPE_INT32 dims: [ -1, -1, -1 ] }},
  {{ name: "top_log_probs" data_type: TYPE_FP32 dims: [ -1, -1, -1 ] }},
  {{ name: "output_tokens" data_type: TYPE_STRING dims: [ -1 ] }},
  {{ name: "top_tokens" data_type: TYPE_STRING dims: [ -1, -1 ] }},
  {{ name: "context_logits" data_type: TYPE_FP32 dims: [ -1, -1 ] }},
  {{ name: "generation_logits" data_type: TYPE_FP32 dims: [ -1, -1, -1 ] }}
]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
parameters [
  {{ key: "batch_scheduler_policy" value: {{ string_value: "guaranteed_no_evict" }} }},
  {{ key: "gpt_model_type" value: {{ string_value: "inflight_fused_batching" }} }},
  {{ key: "max_num_tokens" value: {{ string_value: "512" }} }},
  {{ key: "enable_chunked_context" value: {{ string_value: "true" }} }},
  {{ key: "max_tokens_in_paged_kv_cache" value: {{ string_value: "{kv_tokens}" }} }},
  {{ key: "tokens_per_block" value: {{ string_value: "16" }} }},
  {{ key: "enable_kv_cache_reuse" value: {{ string_value: "true" }} }},
  {{ key: "max_beam_width" value: {{ string_value: "4" }} }},
  {{ key: "exclude_input_in_output" value: {{ string_value: "true" }} }}{extra}
]
"""


def make_tokenizer(out: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS.splitlines() * 4, trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "unk_token": None, "chat_template": CHATML,
        "model_max_length": 2048, "add_bos_token": False}, indent=2) + "\n")


def model_config(arch: str, vocab: int, hidden: int, layers: int, heads: int, kv_heads: int,
                 max_len: int, eos: int, window: int | None) -> object:
    import transformers as tf

    common = dict(vocab_size=vocab, eos_token_id=eos, bos_token_id=None, pad_token_id=0)
    if arch == "gpt2":
        return tf.GPT2Config(n_embd=hidden, n_layer=layers, n_head=heads, n_positions=max_len, **common)
    cls = {"llama": tf.LlamaConfig, "qwen2": tf.Qwen2Config, "mistral": tf.MistralConfig}[arch]
    extra = {"sliding_window": window} if arch == "mistral" else {}
    return cls(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
               num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_len,
               tie_word_embeddings=False, **common, **extra)


def make_checkpoint(out: Path, arch: str = "llama", hidden: int = 64, layers: int = 2, heads: int = 4,
                    kv_heads: int = 2, vocab: int = 512, max_len: int = 2048, seed: int = 0,
                    window: int | None = None, std: float = 0.5) -> None:
    """config.json, model.safetensors, tokenizer files and generation_config.json in `out`."""
    import torch
    import transformers as tf

    out.mkdir(parents=True, exist_ok=True)
    make_tokenizer(out, vocab)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    vocab = tokenizer.get_vocab_size()  # what the training reached (at most the asked size)
    eos = tokenizer.token_to_id("<|im_end|>")
    torch.manual_seed(seed)
    config = model_config(arch, vocab, hidden, layers, heads, kv_heads, max_len, eos, window)
    model = tf.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # wider than the default init: varied text rather than one token repeated
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, std if "embed" in name or "wte" in name or "wpe" in name
                          else std / p.shape[1] ** 0.5 * 4)
    model.save_pretrained(out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="the model directory (its name is the model's name)")
    p.add_argument("--arch", default="llama", choices=["llama", "qwen2", "mistral", "gpt2"])
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--max-len", type=int, default=2048)
    p.add_argument("--window", type=int, default=None, help="mistral sliding_window")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kv-tokens", type=int, default=16384)
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="another config.pbtxt parameter")
    args = p.parse_args(argv)
    make_checkpoint(args.out / "1", args.arch, args.hidden, args.layers, args.heads, args.kv_heads,
                    args.vocab, args.max_len, args.seed, args.window)
    extra = "".join(f',\n  {{ key: "{k}" value: {{ string_value: "{v}" }} }}'
                    for k, v in (kv.split("=", 1) for kv in args.param))
    (args.out / "config.pbtxt").write_text(CONFIG.format(name=args.out.name, arch=args.arch,
                                                         kv_tokens=args.kv_tokens, extra=extra))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
