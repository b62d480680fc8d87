"""How far chapter 9's runs may sit from their references, derived from the formats' unit roundoff
u = 2^-(mantissa bits + 1), never from one machine's run.
"""

from __future__ import annotations

import torch

from ...numerics import FP32_UNIT_ROUNDOFF


def unit_roundoff(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps / 2


def loss_gap(losses: list[float], dtype: torch.dtype) -> float:
    """The loss gap allowed between a run whose products are rounded to ``dtype`` and fp32: each
    product errs by about u relative, and a loss near a smooth minimum moves by at most that share
    of its size (u·max|loss|). e4m3: 6 % of the loss; bf16: 0.4 %. A run that stalls (unscaled FP8
    losing its gradients) sits at its first loss, several times further off."""
    return unit_roundoff(dtype) * max(abs(v) for v in losses)


def data_parallel(losses: list[float], world_size: int) -> float:
    """Ranks against the same slices in one process: the only difference is the order of the
    gradient sum (exact at N = 2: a + b = b + a), a few roundings per step."""
    return 10 * len(losses) * world_size * 2 * FP32_UNIT_ROUNDOFF * max(abs(v) for v in losses)
