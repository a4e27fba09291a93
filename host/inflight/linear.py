"""The decoders' linear layers, with their weights laid out once for the CPU's matrix library.

`Dense(weight, bias)` computes `x @ weight.T + bias` for a 2-D `x` ([rows, in]), as `F.linear`.

Why: `F.linear` on a CPU hands the weight to the BLAS as it lies, and the BLAS copies it into
its own blocked layout on every call. For a decode step (a few rows against a large weight) that
copy is most of the product: measured on this project's 2-vCPU machine (AMD EPYC, AVX2, 1
thread, 2026-11-27), a [3072 x 768] product took 1.7 ms at 4 rows with `F.linear` and 0.5 ms
with the weight blocked once ahead. So on a CPU, for float32, each weight is blocked once at
load time:
- for several rows, in oneDNN's layout (what PyTorch's own CPU compiler uses for frozen linear
  layers), made for `BATCH_HINT` rows; any row count works with it;
- for one row (a request decoding alone), in MKL's packed layout for one row, which halved that
  product against `F.linear`'s matrix-vector path in the same measurement.

Both layouts are extra copies of the weight (the model's float32 weights take three times their
size: the plain one stays for everything else). `pack=False`, or `MODELHOST_PACKED_WEIGHTS=0`,
keeps plain `F.linear`.

These are PyTorch's operator-level entry points for those libraries (`torch.ops.mkldnn` and
`torch.ops.mkl`), not a documented Python API, so this module is the only place that uses them:
on a build that lacks one, or where its result differs from `F.linear` by more than rounding
(checked once per process on a small product), `Dense` falls back to `F.linear`, and the answers
stay those of `F.linear` up to the order of summation.
"""

from __future__ import annotations

import logging
import os
from functools import cache

import torch
from torch.nn import functional as F

log = logging.getLogger(__name__)

BATCH_HINT = 16  # rows the oneDNN layout is tuned for: a full decode batch of the usual size


@cache
def _available() -> tuple[bool, bool]:
    """(oneDNN blocked weights work, MKL one-row packed weights work) in this PyTorch build."""
    if os.environ.get("MODELHOST_PACKED_WEIGHTS", "1") == "0":
        return False, False
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(40, 24, generator=g), torch.randn(40, generator=g)
    dnn = mkl = False
    try:
        blocked = torch.ops.mkldnn._reorder_linear_weight(w, BATCH_HINT)
        for rows in (1, 3, 17):
            x = torch.randn(rows, 24, generator=g)
            got = torch.ops.mkldnn._linear_pointwise(x, blocked, b, "none", [], "")
            if not torch.allclose(got, F.linear(x, w, b), rtol=1e-4, atol=1e-4):
                raise ValueError("result differs from F.linear")
        dnn = True
    except Exception as exc:  # noqa: BLE001  (missing operator, unsupported CPU, wrong result)
        log.info("oneDNN blocked weights unavailable (%s): plain F.linear for several rows", exc)
    try:
        packed = torch.ops.mkl._mkl_reorder_linear_weight(w, 1)
        x = torch.randn(1, 24, generator=g)
        if not torch.allclose(torch.ops.mkl._mkl_linear(x, packed, w, b, 1), F.linear(x, w, b),
                              rtol=1e-4, atol=1e-4):
            raise ValueError("result differs from F.linear")
        mkl = True
    except Exception as exc:  # noqa: BLE001
        log.info("MKL packed weights unavailable (%s): plain F.linear for one row", exc)
    return dnn, mkl


class Dense:
    """One linear layer: `layer(x)` is `F.linear(x, weight, bias)` for x of shape [rows, in]."""

    __slots__ = ("weight", "bias", "_blocked", "_row")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, pack: bool = True) -> None:
        self.weight, self.bias = weight, bias
        self._blocked: torch.Tensor | None = None
        self._row: torch.Tensor | None = None
        if pack and weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.dim() == 2:
            dnn, mkl = _available()
            if dnn:
                self._blocked = torch.ops.mkldnn._reorder_linear_weight(weight, BATCH_HINT)
            if mkl:
                self._row = torch.ops.mkl._mkl_reorder_linear_weight(weight, 1)

    @property
    def packed(self) -> bool:
        return self._blocked is not None or self._row is not None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        if rows == 1 and self._row is not None:
            return torch.ops.mkl._mkl_linear(x, self._row, self.weight, self.bias, 1)
        if self._blocked is not None and rows:
            return torch.ops.mkldnn._linear_pointwise(x, self._blocked, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)
