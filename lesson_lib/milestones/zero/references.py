"""What ZeRO must reproduce (chapters 4 and 5): single-process training on the combined batch (Adam,
or LAMB/LARS from :mod:`lesson_lib.optim`), and torch's own ZeRO-1 on the same model and data.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ... import optim
from ...data import batch_indices, shard, teacher_classification
from ...metrics import optimizer_tensors, storage_bytes
from ...models import fit_whole_batch, mlp
from ...runtime import context
from .milestone import Config


def reference(cfg: Config) -> list[float]:
    """Single-process training on the combined batch (fp32): what every fp32 stage must reproduce."""
    from ..data_parallel import reference as single_process

    if cfg.optimizer == "adam":
        return single_process(cfg, optimizer="adam")
    return layerwise_reference(cfg)["losses"]


def layerwise_reference(cfg: Config) -> dict:
    """Single-process LAMB or LARS (lesson_lib.optim, biases excluded) on the combined batch."""
    model = mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed)
    losses = fit_whole_batch(cfg, model, optim.make(cfg.optimizer, model, cfg.lr, cfg.weight_decay))
    return {"losses": losses, "params": torch.cat([p.detach().view(-1) for p in model.parameters()]).tolist()}


def torch_zero_reference(cfg: Config) -> dict:
    """``torch.distributed.optim.ZeroRedundancyOptimizer`` (ZeRO-1) on the same model and data.

    Gradients are averaged with the library's all-reduce; after each step every rank broadcasts
    the parameters it owns, so its parameter traffic is whole parameters (by tensor), not our
    flat ring all-gather. Runs on every rank of a cluster.
    """
    from torch.distributed.optim import ZeroRedundancyOptimizer

    ctx = context()
    model = mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed)
    zro = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=cfg.lr)
    x_all, y_all = teacher_classification(cfg.samples, cfg.d_in, cfg.classes)
    losses = []
    for step in range(cfg.steps):
        idx = shard(batch_indices(cfg.samples, cfg.global_batch, step, cfg.seed), ctx.rank, ctx.world_size)
        zro.zero_grad()
        loss = F.cross_entropy(model(x_all[idx]), y_all[idx])
        loss.backward()
        for p in model.parameters():
            torch.distributed.all_reduce(p.grad)
            p.grad.div_(ctx.world_size)
        zro.step()
        lt = loss.detach().reshape(1)
        torch.distributed.all_reduce(lt)
        losses.append(float(lt) / ctx.world_size)
    return {"losses": losses, "optimizer_bytes": storage_bytes(optimizer_tensors(zro.optim)),
            "params": torch.cat([p.detach().view(-1) for p in model.parameters()]).tolist()}
