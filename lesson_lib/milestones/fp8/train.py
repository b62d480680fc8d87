"""Data-parallel training with FP8 linear layers (chapter 9 §3): every rank takes its slice of each
batch, runs the FP8 forward and backward with its own scales, and the fp32 gradients are averaged
by an all-reduce; SGD with momentum updates the fp32 master weights. ``reference`` runs the same
ranks' slices one after another in one process."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .linear import MLP


@dataclass(kw_only=True)
class Config:
    sizes: tuple[int, ...] = (32, 64, 64, 32)
    """Widths of the MLP's layers, input first."""
    batch: int = 64
    """Sequences per step, over all ranks."""
    steps: int = 40
    lr: float = 0.5
    momentum: float = 0.9
    loss_divisor: float = 1.0
    """The loss divided by this and the learning rate multiplied by it: the same SGD in exact
    arithmetic, with gradients this many times smaller, as a mean over this many times more tokens."""
    seed: int = 0
    """Seeds the model, the teacher and the batches: the same for every precision."""
    capture_steps: tuple[int, ...] = ()
    """Steps at which each rank keeps its layers' output-gradients, as the backward receives them."""

    @classmethod
    def tiny(cls) -> "Config":
        return cls()

    def check(self, world_size: int) -> "Config":
        if world_size < 1 or self.batch % world_size:
            raise ValueError(f"batch ({self.batch}) must divide by world_size ({world_size})")
        return self


def batches(cfg: Config) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fixed teacher network's inputs and outputs; the loss is their mean squared error, a mean
    over batch × width values as an LLM's loss is a mean over its tokens."""
    g = torch.Generator().manual_seed(1000 + cfg.seed)
    d_in, d_out = cfg.sizes[0], cfg.sizes[-1]
    teacher = torch.randn(d_out, d_in, generator=g) / d_in ** 0.5
    out = []
    for _ in range(cfg.steps):
        x = torch.randn(cfg.batch, d_in, generator=g)
        out.append((x, torch.tanh(x @ teacher.t())))
    return out


def _step(cfg, model, opt, parts) -> float:
    """One step from the slices ``parts`` [(x, y)]: gradients averaged over them; returns the loss."""
    opt.zero_grad()
    losses = []
    for x, y in parts:
        loss = torch.nn.functional.mse_loss(model(x), y) / len(parts) / cfg.loss_divisor
        loss.backward()
        losses.append(loss.item())
    opt.step()
    return sum(losses) * cfg.loss_divisor


def _model(cfg: Config, precision: str):
    torch.manual_seed(cfg.seed)
    model = MLP(cfg.sizes, precision)
    return model, torch.optim.SGD(model.parameters(), lr=cfg.lr * cfg.loss_divisor, momentum=cfg.momentum)


def train_job(cfg: Config, precision: str) -> dict:
    """On every rank: its slice of each batch, gradients averaged with an all-reduce."""
    r, n = dist.get_rank(), dist.get_world_size()
    model, opt = _model(cfg, precision)
    losses, captured = [], {}
    for step, (x, y) in enumerate(batches(cfg)):
        share = slice(r * cfg.batch // n, (r + 1) * cfg.batch // n)
        opt.zero_grad()
        model.captured = {} if step in cfg.capture_steps else None
        loss = torch.nn.functional.mse_loss(model(x[share]), y[share])
        (loss / cfg.loss_divisor).backward()
        if model.captured is not None:
            captured[step] = [model.captured[i] for i in sorted(model.captured)]
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= n
        opt.step()
        whole = loss.detach().clone()
        dist.all_reduce(whole)
        losses.append(float(whole) / n)
    zero = sum(int((p.grad == 0).sum()) for p in model.parameters())
    return {"losses": losses, "params": [p.detach().clone() for p in model.parameters()],
            "zero_grad_share": zero / sum(p.numel() for p in model.parameters()), "output_grads": captured}


def reference(cfg: Config, precision: str, world_size: int = 1) -> dict:
    """One process: each step's batch cut into ``world_size`` slices, their gradients averaged."""
    model, opt = _model(cfg, precision)
    losses = [_step(cfg, model, opt, list(zip(x.chunk(world_size), y.chunk(world_size))))
              for x, y in batches(cfg)]
    return {"losses": losses, "params": [p.detach().clone() for p in model.parameters()]}
