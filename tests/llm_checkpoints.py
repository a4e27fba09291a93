"""Tiny Hugging Face checkpoints for the LLM tests, built here with `transformers` (random
weights, a tokenizer trained on a few lines): scripts/make_hf_llm.py, imported from its path."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPT = REPO_ROOT / "scripts" / "make_hf_llm.py"

_spec = importlib.util.spec_from_file_location("make_hf_llm", SCRIPT)
make_hf_llm = importlib.util.module_from_spec(_spec)
assert _spec.loader is not None
_spec.loader.exec_module(make_hf_llm)


def checkpoint(path: Path, arch: str = "llama", **sizes: object) -> Path:
    """A checkpoint directory (config.json, model.safetensors, tokenizer files)."""
    sizes.setdefault("hidden", 32)
    sizes.setdefault("max_len", 256)
    make_hf_llm.make_checkpoint(path, arch, **sizes)
    return path


def served_model(repo: Path, name: str, *args: str) -> Path:
    """A model directory of the "inflight" backend, written by the script."""
    subprocess.run([sys.executable, str(SCRIPT), str(repo / name), "--hidden", "32",
                    "--max-len", "256", "--kv-tokens", "4096", *args], check=True, capture_output=True)
    return repo / name
