"""Compiling backends and caches against the bridge's headers, for tests (ours and plugins').

    from host.native.testing import build_library
    lib = build_library(Path("my_backend.c"), tmp_path / "libtriton_mine.so")
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Sequence

from host.native import include_dir


def compiler() -> str | None:
    """The C compiler to use: $CC, else gcc or cc on PATH (None when there is none)."""
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


def build_library(source: Path, output: Path, extra_args: Sequence[str] = ()) -> Path:
    """Compile one C source into a shared library; raises with the compiler's output on failure.

    The library is not linked against anything Triton: its TRITON* symbols stay undefined and
    resolve at load time against whichever server loads it (the bridge, or Triton itself)."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (set CC or install gcc)")
    output.parent.mkdir(parents=True, exist_ok=True)
    cmd = [cc, "-shared", "-fPIC", "-O2", "-Wall", f"-I{include_dir()}", f"-I{source.parent}",
           str(source), "-o", str(output), "-lpthread", *extra_args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"compiling {source} failed:\n{' '.join(cmd)}\n{done.stderr}")
    return output
