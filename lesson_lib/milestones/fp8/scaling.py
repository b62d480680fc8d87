"""Scaling recipes for FP8 (chapter 9, notebooks/09_fp8.ipynb §2): a scale from the current amax
(per tensor, per row), delayed scaling from an amax history (NVIDIA TransformerEngine's recipe),
and DeepSeek-V3's block-wise scaling (1×128 activation tiles, 128×128 weight blocks; technical
report 2024, §3.3). Every product runs through ``torch._scaled_mm``: real FP8 operands.
"""

from __future__ import annotations

from collections import deque

import torch

from .formats import E4M3, dtype_of


def scale_for(amax: torch.Tensor, fmt=E4M3) -> torch.Tensor:
    """The scale s with x / s filling the format: amax / max. A zero amax (an all-zero tensor)
    gives s = 1, so nothing divides by zero."""
    top = torch.finfo(dtype_of(fmt)).max
    amax = amax.float()
    return torch.where(amax > 0, amax / top, torch.ones_like(amax))


def saturating_cast(x: torch.Tensor, scale: torch.Tensor, fmt=E4M3) -> torch.Tensor:
    """x / scale, clamped to ±max (never inf or NaN), then rounded to the format."""
    dtype = dtype_of(fmt)
    top = torch.finfo(dtype).max
    return (x.float() / scale).clamp(-top, top).to(dtype)


def quantize(x: torch.Tensor, fmt=E4M3) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor current scaling: (x8, scale) with x ≈ x8 · scale."""
    scale = scale_for(x.detach().abs().max(), fmt)
    return saturating_cast(x, scale, fmt), scale


def quantize_rows(x: torch.Tensor, fmt=E4M3) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise scaling: one scale per row (shape [rows, 1])."""
    scale = scale_for(x.detach().abs().amax(dim=1, keepdim=True), fmt)
    return saturating_cast(x, scale, fmt), scale


def scaled_mm(a8: torch.Tensor, sa: torch.Tensor, b8: torch.Tensor, sb: torch.Tensor,
              out_dtype=torch.float32) -> torch.Tensor:
    """(a8·sa) @ (b8·sb)ᵀ with FP8 operands, a [M, K], b [N, K] (a weight's layout); scales are
    scalars, or [M, 1] and [N, 1] for row-wise."""
    sb = sb.t() if sb.dim() == 2 else sb
    return torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb, out_dtype=out_dtype)


class DelayedScaling:
    """TransformerEngine's delayed scaling: the scale comes from the largest amax of the last
    ``history`` steps, so the cast needs no pass over the tensor first; this step's amax joins the
    history afterwards. A new outlier larger than the history saturates."""

    def __init__(self, history: int = 16, fmt=E4M3):
        if history < 1:
            raise ValueError(f"history must be at least 1, got {history}")
        self.amaxes: deque = deque(maxlen=history)
        self.fmt = fmt

    def quantize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        amax = x.detach().abs().max()
        past = torch.stack(list(self.amaxes)).max() if self.amaxes else amax  # the first step: current
        scale = scale_for(past, self.fmt)
        self.amaxes.append(amax)
        return saturating_cast(x, scale, self.fmt), scale


def _blocks(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """x [R, C] as [R/rows, C/cols, rows, cols]; R and C must divide."""
    r, c = x.shape
    if r % rows or c % cols:
        raise ValueError(f"x's shape {tuple(x.shape)} must divide into blocks of {rows}×{cols}")
    return x.reshape(r // rows, rows, c // cols, cols).transpose(1, 2)


def quantize_blocks(x: torch.Tensor, rows: int = 128, cols: int = 128, fmt=E4M3):
    """Block-wise scaling: one scale per rows×cols block (DeepSeek-V3: 1×128 for activations,
    128×128 for weights). Returns (x8 [R, C], scales [R/rows, C/cols])."""
    b = _blocks(x.float(), rows, cols)
    scales = scale_for(b.abs().amax(dim=(2, 3)), fmt)
    b8 = saturating_cast(b, scales[:, :, None, None], fmt)
    r, c = x.shape
    return b8.transpose(1, 2).reshape(r, c), scales


def blockwise_mm(a: torch.Tensor, w: torch.Tensor, block: int = 128, fmt=E4M3) -> torch.Tensor:
    """a @ wᵀ with DeepSeek-V3's scaling: a in 1×block tiles, w in block×block blocks. ``_scaled_mm``
    on CPU takes no block scales, but within one K-slice of ``block`` columns a tile's scale is a
    row scale of a and a block's scale a row scale of w (repeated over the block's rows), so each
    slice is one real row-wise FP8 product, and the slices are added in fp32 (DeepSeek-V3 promotes
    its partial sums to FP32 every 128 elements of K, §3.3.2)."""
    a8, sa = quantize_blocks(a, 1, block, fmt)
    w8, sw = quantize_blocks(w, block, block, fmt)
    out = torch.zeros(a.shape[0], w.shape[0])
    for k in range(a.shape[1] // block):
        cols = slice(k * block, (k + 1) * block)
        out += scaled_mm(a8[:, cols].contiguous(), sa[:, k:k + 1].contiguous(), w8[:, cols].contiguous(),
                         sw[:, k].repeat_interleave(block)[:, None].contiguous())
    return out
