"""The task every replica of chapter 10 trains: a small MLP on chapter 4's teacher-labelled data.

The batch of step s on replica r is a function of (seed, s, r) only, so a replica healed at step s
draws exactly what it would have drawn had it never died, and a single process can replay any run.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...config import opt
from ...data import teacher_classification
from ...models import mlp


@dataclass
class Task:
    """Model, data and optimizer settings shared by our fault-tolerant step, torchft's and DiLoCo's."""

    steps: int = opt(12, "optimizer steps each replica commits")
    batch: int = opt(32, "samples per replica per step")
    hidden: int = opt(64, "width of the MLP's hidden layer")
    lr: float = opt(0.05, "SGD learning rate (inner rate for DiLoCo)")
    momentum: float = opt(0.9, "SGD momentum")
    seed: int = opt(0, "model and data seed")
    samples: int = opt(4096, "training samples; 1,024 more are held out")

    @classmethod
    def tiny(cls, **kw) -> "Task":
        return cls(**kw)


def data(task: Task):
    x, y = teacher_classification(n=task.samples + 1024, seed=1234 + task.seed)
    return (x[:task.samples], y[:task.samples]), (x[task.samples:], y[task.samples:])


def build(task: Task):
    model = mlp(32, task.hidden, 1, 10, task.seed)
    return model, torch.optim.SGD(model.parameters(), lr=task.lr, momentum=task.momentum)


def fragments(model, n: int) -> list:
    """Streaming DiLoCo's fragments: the model's linear layers in ``n`` consecutive groups, each an
    ``nn.Sequential`` of its layers (sharing their parameters)."""
    layers = [m for m in model if isinstance(m, torch.nn.Linear)]
    if not 1 <= n <= len(layers):
        raise ValueError(f"n must be between 1 and {len(layers)} (the linear layers), got {n!r}")
    cut = [round(i * len(layers) / n) for i in range(n + 1)]
    return [torch.nn.Sequential(*layers[a:b]) for a, b in zip(cut, cut[1:])]


def batch(task: Task, train, step: int, replica: int):
    g = torch.Generator().manual_seed(task.seed * 1_000_003 + step * 1_009 + replica)
    idx = torch.randint(0, train[0].shape[0], (task.batch,), generator=g)
    return train[0][idx], train[1][idx]


def gradient(model, xy) -> torch.Tensor:
    """The loss's gradient, flattened into one tensor (what a replica sends)."""
    model.zero_grad()
    F.cross_entropy(model(xy[0]), xy[1]).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def set_gradient(model, flat: torch.Tensor) -> None:
    i = 0
    for p in model.parameters():
        p.grad = flat[i:i + p.numel()].view_as(p).clone()
        i += p.numel()


def flat_params(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def held_out_loss(model, held) -> float:
    with torch.no_grad():
        return float(F.cross_entropy(model(held[0]), held[1]))


def to_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def from_bytes(b: bytes):
    return torch.load(io.BytesIO(b), weights_only=False)
