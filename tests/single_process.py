"""Single-process training written out with torch alone: what the milestones' own single-process
references must equal (``data_parallel.reference``, the pipeline's, ``compression.reference``,
``large_batch.reference``, ``zero.layerwise_reference``).

Those references run the milestones' own training loops at one rank, so a bug in a loop (an
optimizer built wrong, a learning-rate schedule, a parameter group) is in the reference too and the
"N ranks equal one process" tests cannot see it. The loops here share the task with them — the data
(:mod:`lesson_lib.data`), the batches of each step and the first weights (:func:`lesson_lib.models.mlp`)
— and nothing of the training: the optimizers are torch's own, or LARS/LAMB from
:mod:`lesson_lib.optim` with the parameter groups written out here (those two classes are checked
against the papers' equations in tests/test_optim.py), and the schedule is written out.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from lesson_lib.data import batch_indices, subspace_teacher, teacher_classification
from lesson_lib.models import mlp


def _flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def fit(cfg, make_optimizer, steps: int | None = None, x=None, y=None, lr_at=None) -> dict:
    """``steps`` (default ``cfg.steps``) steps on ``cfg``'s whole global batch: the mean cross-entropy,
    its backward, ``optimizer.step()``. ``make_optimizer(model)`` builds the optimizer; ``lr_at(step)``,
    if given, sets every group's rate before the step. Returns the losses, the final parameters and
    the last step's gradients (flat, in ``model.parameters()`` order)."""
    model = mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed)
    if x is None:
        x, y = teacher_classification(cfg.samples, cfg.d_in, cfg.classes)
    opt = make_optimizer(model)
    losses = []
    for step in range(cfg.steps if steps is None else steps):
        if lr_at is not None:
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
        idx = batch_indices(cfg.samples, cfg.global_batch, step, cfg.seed)
        opt.zero_grad()
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).clone()
        opt.step()
        losses.append(float(loss.detach()))
    return {"losses": losses, "params": _flat(model), "grads": grads}


def adam(cfg):
    """torch's Adam on every parameter at ``cfg.lr`` (chapter 0's and ZeRO's optimizer)."""
    return lambda model: torch.optim.Adam(model.parameters(), lr=cfg.lr)


def sgd_momentum(cfg, momentum: float = 0.9):
    """torch's SGD with momentum on every parameter at ``cfg.lr``."""
    return lambda model: torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=momentum)


def groups(model, weight_decay: float, adapt_biases: bool = False) -> list[dict]:
    """The recipes' two groups, written out: the weight matrices decayed and adapted; the biases
    neither decayed nor (unless ``adapt_biases``) given a trust ratio of their own."""
    return [{"params": [p for p in model.parameters() if p.ndim == 2], "weight_decay": weight_decay,
             "adapt": True},
            {"params": [p for p in model.parameters() if p.ndim == 1], "weight_decay": 0.0,
             "adapt": adapt_biases}]


def layerwise(name: str, lr: float, weight_decay: float, adapt_biases: bool = False, momentum: float = 0.9):
    """The optimizer ``name`` on :func:`groups`: LARS (momentum 0.9, its default η = 0.001) or LAMB
    (its defaults β = (0.9, 0.999), ε = 1e-6); "sgd" is torch's SGD with momentum 0.9 (weight decay
    added to the gradient), "adam" torch's AdamW."""
    from lesson_lib.optim import LAMB, LARS

    def make(model):
        g = groups(model, weight_decay, adapt_biases)
        if name == "lars":
            return LARS(g, lr=lr, momentum=momentum)
        if name == "lamb":
            return LAMB(g, lr=lr)
        if name == "sgd":
            return torch.optim.SGD(g, lr=lr, momentum=momentum)
        return torch.optim.AdamW(g, lr=lr)
    return make


def warmup_cosine(peak: float, warmup: int, steps: int):
    """Goyal et al.'s linear warm-up to ``peak`` over ``warmup`` steps (step s at (s + 1)/warmup of
    it), then a half cosine from ``peak`` to 0 over the remaining steps, written out."""
    def lr(step: int) -> float:
        if step < warmup:
            return peak * (step + 1) / warmup
        return peak * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup))) / 2
    return lr


def large_batch(cfg) -> dict:
    """Chapter 5's training (one micro-batch per step) on its held-in set: subspace_teacher's first
    ``cfg.samples`` points (the rest are held out), the optimizer on :func:`groups`, the schedule."""
    x, y = subspace_teacher(cfg.samples + cfg.eval_samples, cfg.d_in, classes=cfg.classes)
    make = layerwise(cfg.optimizer, cfg.lr, cfg.weight_decay, cfg.adapt_biases)
    return fit(cfg, make, x=x, y=y, lr_at=warmup_cosine(cfg.lr, cfg.warmup_steps, cfg.steps))
