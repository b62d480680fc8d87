"""fp16 needs loss scaling, bf16 does not (chapter 4 §10): one process, four precisions.

fp16 gradients below 2⁻²⁵ underflow to zero; dynamic loss scaling (Micikevicius et al., 2018;
``torch.amp.GradScaler``) avoids it. bfloat16 has fp32's range (Kalamkar et al., 2019) and needs no
scale. The case: a deep, narrow tanh MLP initialised small (vanishing gradients) trained with Adam
under ``torch.autocast`` from the same start on the same batches; :func:`train` records the loss
and the share of exactly-zero gradient values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...config import opt
from ...data import teacher_classification

PRECISIONS = {"fp32": None, "fp16": torch.float16, "fp16+scaling": torch.float16, "bf16": torch.bfloat16}
UNIT_ROUNDOFF = {"fp32": 2.0**-24, "fp16": 2.0**-11, "fp16+scaling": 2.0**-11, "bf16": 2.0**-8}


@dataclass
class Task:
    depth: int = opt(12, "hidden tanh layers (the deeper, the smaller the first layers' gradients)")
    width: int = opt(32, "width of the hidden layers")
    gain: float = opt(0.3, "init: weights ~ N(0, gain²/fan_in); below 1 the gradients vanish backwards")
    d_in: int = opt(32, "input features")
    classes: int = opt(10, "output classes")
    steps: int = opt(20, "Adam steps")
    batch: int = opt(64, "samples per step")
    lr: float = opt(3e-3, "Adam's learning rate")
    seed: int = opt(0, "seed of the weights and the data")


def model(task: Task) -> torch.nn.Sequential:
    g = torch.Generator().manual_seed(task.seed)
    sizes = [task.d_in] + [task.width] * task.depth + [task.classes]
    layers = []
    for fan_in, fan_out in zip(sizes, sizes[1:]):
        lin = torch.nn.Linear(fan_in, fan_out)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(fan_out, fan_in, generator=g) * task.gain / fan_in**0.5)
            lin.bias.zero_()
        layers += [lin, torch.nn.Tanh()]  # tanh: no exact zeros of its own (a ReLU has them)
    return torch.nn.Sequential(*layers[:-1])


def zero_share(params) -> float:
    """The share of gradient values that are exactly zero (in fp32 none are, here: the underflow)."""
    grads = [p.grad.reshape(-1) for p in params if p.grad is not None]
    return float(sum((g == 0).sum() for g in grads)) / sum(g.numel() for g in grads)


def train(precision: str, task: Task | None = None, init_scale: float = 2.0**16) -> dict:
    """``task``'s Adam run in ``precision``: losses, the zero share of the gradients per step (after
    unscaling), each step's loss scale S (1 without scaling) and whether the step was taken."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    task = task or Task()
    net = model(task)
    dtype, params = PRECISIONS[precision], list(net.parameters())
    optimizer = torch.optim.Adam(params, lr=task.lr)
    # Micikevicius et al.'s dynamic loss scaling; disabled, it passes the loss and the step through
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, enabled=precision == "fp16+scaling")
    x_all, y_all = teacher_classification(task.steps * task.batch, task.d_in, task.classes, seed=task.seed)
    out = {"losses": [], "zero_share": [], "scale": [], "stepped": []}
    for step in range(task.steps):
        rows = slice(step * task.batch, (step + 1) * task.batch)
        x, y = x_all[rows], y_all[rows]
        optimizer.zero_grad(set_to_none=False)
        with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = F.cross_entropy(net(x), y)
        scaler.scale(loss).backward()  # with scaling: the backward of S·loss
        scaler.unscale_(optimizer)  # the fp32 gradients divided by S (no-op when disabled)
        out["zero_share"].append(zero_share(params))
        scale = scaler.get_scale() if scaler.is_enabled() else 1.0
        out["scale"].append(scale)
        scaler.step(optimizer)  # skipped if a gradient is inf or nan (then S is lowered)
        scaler.update()
        out["stepped"].append(not scaler.is_enabled() or scaler.get_scale() >= scale)
        out["losses"].append(float(loss.detach()))
    return out


def loss_tolerance(precision: str, task: Task, reference: list[float]) -> float:
    """Loss gap allowed between a run in ``precision`` and the fp32 run by rounding alone:
    (depth + 1)·u relative to the largest loss (u = 2⁻¹¹ fp16, 2⁻⁸ bf16). Underflow is not rounding:
    it grows with the steps.
    """
    return (task.depth + 1) * UNIT_ROUNDOFF[precision] * max(abs(v) for v in reference)
