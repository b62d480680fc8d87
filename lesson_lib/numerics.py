"""How far a distributed result may sit from its single-process reference, and the gap itself.

Every comparison of the course (a chapter's assert, an exercise checker, a test) takes its
tolerance from here, derived from the quantity's scale and float32's rounding, never from one
machine's run: the same bound must hold on any CPU (AVX-512 or not, ARM) and thread count. Each
function's docstring says what error it would still catch.
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
    """Loss gap allowed between data-parallel (or synchronous parameter-server) SGD and one process.

    The ranks sum the same gradients in another order, so each step's result differs by a few
    float32 roundings (ε = 2⁻²³ relative to the loss), compounded over the steps: 10·steps·ε·max|loss|.
    A real error (a missing 1/N, a rank's gradient dropped) changes the loss by 1e-3 or more.
    """
    return 10 * len(reference) * FP32_EPS * max(abs(x) for x in reference)


def pipeline_tolerance(microbatches: int, steps: int, depth: int, scale: float = 3.0) -> float:
    """Float32 rounding allowed between a pipelined run and single-process SGD of the unsplit model.

    Per step, each accumulated value (a gradient over M micro-batches, a layer's output over its
    inputs) picks up at most a few roundings of ε = 2⁻²³ relative per term; over ``steps`` steps,
    relative to the quantities' ``scale`` (losses ≈ 2.3, weights and gradients below 3). A real error
    — a missing 1/M, a dropped micro-batch — changes them by 1e-2 or more.
    """
    return 10 * steps * (microbatches + depth) * FP32_EPS * scale


def adam_drift(cfg) -> dict[str, float]:
    """How far two correct fp32 Adam runs of ``cfg`` may drift apart by rounding alone.

    Parameters: Adam moves each parameter by at most about ``lr`` per step (its update is
    m̂/(√v̂ + ε), a ratio near ±1; Kingma & Ba, 2015, §2.1). Rounding differs between runs that sum
    gradients in another order or use other kernels (AVX-512 or not, another thread count), and
    Adam normalises the gradient, so a coordinate whose gradient is near zero can take a visibly
    different step; over the run the drift stays a small fraction of lr·steps (ZeRO against
    ZeroRedundancyOptimizer: ``tests/test_zero.py``, run also under ATEN_CPU_CAPABILITY=default).
    We allow 1/100 of lr·steps, which stays below ``lr`` — one whole step skipped or one slice
    updated with the wrong gradient moves some parameters by about lr — while steps < 100.

    Losses: a forward pass sums up to ``width`` products per layer, so its relative rounding error
    is at most about layers·width·u (Higham's bound for dot products, u = 2⁻²⁴ in fp32); we allow
    that much per step, relative to the loss. A wrong step changes the loss by the step's own
    change, orders of magnitude more.
    """
    if cfg.steps >= 100:
        raise ValueError("the parameter tolerance lr·steps/100 would no longer catch one skipped step")
    layers, width = cfg.depth + 1, max(cfg.d_in, cfg.hidden)
    return {"params": cfg.lr * cfg.steps / 100,
            "loss_rel": cfg.steps * layers * width * FP32_UNIT_ROUNDOFF}
