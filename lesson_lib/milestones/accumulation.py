"""Gradient accumulation (chapter 5 §7): a large batch in the memory of a small one.

A rank runs its share as ``k`` micro-batches with losses scaled by 1/k, autograd summing their
gradients, then all-reduces once: the same step to rounding, activations k-fold smaller, the same
bytes. :func:`accumulate` is the loop ``large_batch.train`` runs; :func:`ddp_worker` does it with
DDP's ``no_sync()``, counted by a communication hook.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .. import optim
from ..data import batch_indices, shard, subspace_teacher
from ..models import mlp
from ..runtime import context


def accumulate(model, x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor, k: int) -> torch.Tensor:
    """``p.grad += ∇ mean loss over x[idx]``, in ``k`` forward/backward passes of len(idx)/k samples
    each; no communication. Returns the mean loss (detached). ``len(idx)`` must divide by ``k``."""
    loss = torch.zeros((), device=x.device)
    for micro in idx.chunk(k):  # k equal micro-batches: the mean of their k means is the batch's mean
        part = F.cross_entropy(model(x[micro]), y[micro]) / k
        part.backward()  # autograd adds this micro-batch's share into p.grad; its activations are freed
        loss += part.detach()
    return loss


def validate_accumulate(k, per_rank_batch: int) -> None:
    """Raise a ValueError naming ``accumulate`` unless it is an int ≥ 1 dividing the rank's batch."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"accumulate must be a positive int (micro-batches per step), got {k!r}")
    if per_rank_batch % k:
        raise ValueError(f"accumulate={k} must divide each rank's batch of {per_rank_batch} samples "
                         "(global_batch / world_size) into equal micro-batches")


def ddp_worker(cfg, schedule: Callable, no_sync: bool = True) -> dict:
    """On every rank: ``cfg``'s training (a ``large_batch.Config``) by ``DistributedDataParallel``, each
    step in ``cfg.accumulate`` micro-batches, the first k−1 under ``no_sync()`` when ``no_sync``. A
    communication hook counts each all-reduce's bytes, then averages as DDP's default does."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    cfg.validate()  # derives cfg.steps
    ctx = context()
    rank, n, device, k = ctx.rank, ctx.world_size, ctx.device, cfg.accumulate
    x_all, y_all = subspace_teacher(cfg.samples + cfg.eval_samples, cfg.d_in, classes=cfg.classes)
    x_all, y_all = x_all.to(device), y_all.to(device)
    net = mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed).to(device)
    model = DDP(net, bucket_cap_mb=1024)  # one bucket, as our one flat all-reduce
    calls: list[list[int]] = []  # per step: the bytes of each all-reduce DDP launched

    def counted(state, bucket):
        calls[-1].append(bucket.buffer().numel() * bucket.buffer().element_size())
        return default_hooks.allreduce_hook(state, bucket)

    model.register_comm_hook(None, counted)
    optimizer = optim.make(cfg.optimizer, net, cfg.lr, cfg.weight_decay, adapt_biases=cfg.adapt_biases)
    losses = []
    for step in range(cfg.steps):
        idx = shard(batch_indices(cfg.samples, cfg.global_batch, step, cfg.seed), rank, n)
        calls.append([])
        for group in optimizer.param_groups:
            group["lr"] = schedule(cfg, step)
        optimizer.zero_grad(set_to_none=False)
        loss = torch.zeros(1, device=device)
        for i, micro in enumerate(idx.chunk(k)):
            with model.no_sync() if no_sync and i < k - 1 else nullcontext():  # no all-reduce in here
                part = F.cross_entropy(model(x_all[micro]), y_all[micro]) / k
                part.backward()
            loss += part.detach()
        dist.all_reduce(loss)
        optimizer.step()
        losses.append(float(loss) / n)
    return {"losses": losses, "all_reduce_bytes": calls}
