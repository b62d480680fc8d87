"""PyTorch's own stack on chapter 8's transformer (torchtitan's ``parallelize.py`` does the same on
a bigger model): a named ``DeviceMesh`` of dp × tp ranks, ``parallelize_module`` with
``ColwiseParallel`` for q, k, v and fc1 and ``RowwiseParallel`` for o and fc2 (our column and row
layers, f and g included), then ``fully_shard`` over the dp dimension (ZeRO-3, chapter 4).

:func:`dtensor_job` trains the unsharded :class:`~.model.Transformer` so wrapped, on the same data
and SGD steps as :func:`~.train.train_job`, and returns the same record. Chapter 8.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .grid import Layout
from .model import Config, Transformer, batch, loss_fn


def plan(cfg: Config) -> dict:
    """The tensor-parallel plan: module name → style (the attention counts heads from its input)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    out = {}
    for i in range(cfg.layers):
        out.update({f"blocks.{i}.attn.{n}": ColwiseParallel() for n in "qkv"})
        out.update({f"blocks.{i}.attn.o": RowwiseParallel(), f"blocks.{i}.mlp.fc1": ColwiseParallel(),
                    f"blocks.{i}.mlp.fc2": RowwiseParallel()})
    return out


def dtensor_job(cfg: Config, layout: Layout) -> dict:
    """On every rank: ``cfg.steps`` SGD steps under ``parallelize_module`` + ``fully_shard``."""
    import warnings

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh("cpu", (layout.dp, layout.tp), mesh_dim_names=("dp", "tp"))
    model = parallelize_module(Transformer(cfg), mesh["tp"], plan(cfg))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FSDP2's note on _register_pre_backward_hook (harmless)
        fully_shard(model, mesh=mesh["dp"])
    sgd = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    share, d = cfg.batch // layout.dp, mesh["dp"].get_local_rank()
    losses = []
    for step in range(cfg.steps):
        tokens, targets = batch(cfg, step)
        cols = slice(d * share, (d + 1) * share)
        loss = loss_fn(model(tokens[:, cols]), targets[:, cols])
        loss.backward()  # FSDP2 averages the gradients over dp (reduce-scatter)
        sgd.step()
        sgd.zero_grad()
        lt = loss.detach().reshape(1)
        dist.all_reduce(lt, group=mesh["dp"].get_group())
        losses.append(float(lt) / layout.dp)
    params = {n: p.full_tensor().detach() for n, p in model.named_parameters()}
    local = sum(p.to_local().numel() for p in model.parameters())
    return {"losses": losses, "params": params, "param_numel": local}
