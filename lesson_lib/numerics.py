"""How far a distributed result may sit from its single-process reference, and the gap itself.

Tolerances are derived from the quantity's scale and float32 rounding, never from one machine's
run, so they hold on any CPU and thread count; each docstring says what error it still catches.
"""

from __future__ import annotations

from typing import Iterable

import torch

FP32_EPS = torch.finfo(torch.float32).eps  # 2⁻²³: the spacing of float32 numbers at 1
FP32_UNIT_ROUNDOFF = 2.0**-24               # half of it: the largest relative error of one rounding


def max_gap(a: Iterable[float], b: Iterable[float]) -> float:
    """Largest ``|a_i − b_i|`` over two equally long sequences (losses, parameters)."""
    a, b = list(a), list(b)
    if len(a) != len(b):
        raise ValueError(f"cannot compare {len(a)} values with {len(b)}")
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


def sum_order_tolerance(reference: list[float]) -> float:
    """Loss gap allowed between data-parallel (or synchronous PS) SGD and one process: the sums'
    order changes a few roundings per step, 10·steps·ε·max|loss| (ε = 2⁻²³). A missing 1/N or a
    dropped gradient changes the loss by 1e-3 or more.
    """
    return 10 * len(reference) * FP32_EPS * max(abs(x) for x in reference)


def within_roundings(a: torch.Tensor, b: torch.Tensor, roundings: int = 8) -> bool:
    """``a`` equals ``b`` up to a few roundings of ``b``'s dtype at ``b``'s scale: the same arithmetic
    written another way (x / 3 against x · (1/3), a division before a sum or after it). A wrong
    factor or a missing term differs by far more."""
    atol = roundings * torch.finfo(b.dtype).eps * (1.0 + (float(b.abs().max()) if b.numel() else 0.0))
    return a.shape == b.shape and torch.allclose(a, b, rtol=0, atol=atol)


def pipeline_tolerance(microbatches: int, steps: int, depth: int, scale: float = 3.0) -> float:
    """Float32 rounding allowed between a pipelined run and single-process SGD of the unsplit model:
    a few roundings of ε = 2⁻²³ per accumulated term per step, relative to ``scale``. A missing 1/M
    or a dropped micro-batch changes the result by 1e-2 or more.
    """
    return 10 * steps * (microbatches + depth) * FP32_EPS * scale


def adam_drift(cfg) -> dict[str, float]:
    """How far two correct fp32 Adam runs of ``cfg`` may drift apart by rounding alone.

    Parameters: Adam moves each by at most about ``lr`` per step (Kingma & Ba, 2015, §2.1), and its
    normalisation can amplify rounding where a gradient is near zero; we allow lr·steps/100, below
    one whole wrong step while steps < 100 (``tests/test_zero.py`` checks ZeRO against
    ZeroRedundancyOptimizer). Losses: layers·width·u per step relative to the loss (Higham's
    dot-product bound, u = 2⁻²⁴); a wrong step changes it by orders of magnitude more.
    """
    if cfg.steps >= 100:
        raise ValueError("the parameter tolerance lr·steps/100 would no longer catch one skipped step")
    layers, width = cfg.depth + 1, max(cfg.d_in, cfg.hidden)
    return {"params": cfg.lr * cfg.steps / 100,
            "loss_rel": cfg.steps * layers * width * FP32_UNIT_ROUNDOFF}
