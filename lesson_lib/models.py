"""Small models that run in seconds on a laptop CPU. Sequential on purpose: the pipeline chapter
cuts them into stages, ZeRO shards their flat parameters, data parallelism replicates them."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .data import batch_indices, teacher_classification


def mlp(d_in: int, hidden: int, depth: int, d_out: int, seed: int) -> nn.Sequential:
    """``depth`` hidden layers of width ``hidden``; initialised from ``seed`` (same on every rank)."""
    for name, v in (("d_in", d_in), ("hidden", hidden), ("depth", depth), ("d_out", d_out)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    g = torch.random.fork_rng(devices=[])
    with g:
        torch.manual_seed(seed)
        layers: list[nn.Module] = [nn.Linear(d_in, hidden), nn.ReLU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(hidden, hidden), nn.ReLU()]
        layers.append(nn.Linear(hidden, d_out))
        return nn.Sequential(*layers)


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def mlp_param_count(d_in: int, hidden: int, depth: int, d_out: int) -> int:
    """Parameters of :func:`mlp` without building it (for calculators and formulas)."""
    return (d_in + 1) * hidden + (depth - 1) * (hidden + 1) * hidden + (hidden + 1) * d_out


def flat_views(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """Make every parameter, and every gradient, a view into one flat tensor; return both.

    One flat gradient bucket lets one collective (or one message) carry all gradients; a flat
    parameter vector lets a shard of it be replaced in place. Memory accounting then sees
    exactly one storage each.
    """
    params = list(model.parameters())
    numel = sum(p.numel() for p in params)
    ref = params[0]
    flat = torch.empty(numel, dtype=ref.dtype, device=ref.device)
    grads = torch.zeros(numel, dtype=ref.dtype, device=ref.device)
    offset = 0
    for p in params:
        n = p.numel()
        flat[offset:offset + n].copy_(p.detach().view(-1))
        p.data = flat[offset:offset + n].view_as(p)
        p.grad = grads[offset:offset + n].view_as(p)
        offset += n
    return flat, grads


def fit_whole_batch(cfg, model: nn.Module, optimizer: torch.optim.Optimizer) -> list[float]:
    """Train ``model`` in this process on ``cfg``'s whole global batch for ``cfg.steps`` steps.

    The single-process loop the milestones' references share (no process group); the losses per
    step. Gradients are zeroed in place, so flat gradient views (:func:`flat_views`) stay views.
    """
    x_all, y_all = teacher_classification(cfg.samples, cfg.d_in, cfg.classes)
    losses = []
    for step in range(cfg.steps):
        idx = batch_indices(cfg.samples, cfg.global_batch, step, cfg.seed)
        optimizer.zero_grad(set_to_none=False)
        loss = F.cross_entropy(model(x_all[idx]), y_all[idx])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
