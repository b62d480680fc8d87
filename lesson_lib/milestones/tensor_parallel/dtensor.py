"""PyTorch's own stack on chapter 8's transformer, as torchtitan's ``parallelize.py`` does it.

A dp × tp ``DeviceMesh``; ``parallelize_module`` with ``ColwiseParallel`` (q, k, v, fc1) and
``RowwiseParallel`` (o, fc2), plus ``SequenceParallel`` / ``PrepareModuleInput`` with sequence
parallelism (our sequence dimension is 0); then ``fully_shard`` over dp on each block and the
root. :func:`dtensor_job` trains it like :func:`~.train.train_job` and returns the same record.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from .grid import Layout
from .model import Config, Transformer, batch, loss_fn


def plan(cfg: Config, sequence_parallel: bool = False) -> dict:
    """The tensor-parallel plan: module name → style (the attention counts heads from its input)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    out = {}
    for i in range(cfg.layers):
        out.update({f"blocks.{i}.attn.{n}": ColwiseParallel() for n in "qkv"})
        out.update({f"blocks.{i}.attn.o": RowwiseParallel(), f"blocks.{i}.mlp.fc1": ColwiseParallel(),
                    f"blocks.{i}.mlp.fc2": RowwiseParallel()})
    if not sequence_parallel:
        return out
    gather = PrepareModuleInput(input_layouts=(Shard(0),), desired_input_layouts=(Replicate(),))
    out["blocks.0"] = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(0),),
                                         use_local_output=True)  # the embeddings' output, cut along seq
    for i in range(cfg.layers):
        out.update({f"blocks.{i}.ln1": SequenceParallel(sequence_dim=0), f"blocks.{i}.attn": gather,
                    f"blocks.{i}.ln2": SequenceParallel(sequence_dim=0), f"blocks.{i}.mlp": gather,
                    f"blocks.{i}.attn.o": RowwiseParallel(output_layouts=Shard(0)),
                    f"blocks.{i}.mlp.fc2": RowwiseParallel(output_layouts=Shard(0))})
    out["ln"] = SequenceParallel(sequence_dim=0)
    out["head"] = PrepareModuleInput(input_layouts=(Shard(0),), desired_input_layouts=(Replicate(),),
                                     use_local_output=True)
    return out


def dtensor_job(cfg: Config, layout: Layout) -> dict:
    """On every rank: ``cfg.steps`` SGD steps under ``parallelize_module`` + ``fully_shard``."""
    import warnings

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh("cpu", (layout.dp, layout.tp), mesh_dim_names=("dp", "tp"))
    model = parallelize_module(Transformer(cfg), mesh["tp"], plan(cfg, layout.sequence_parallel))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FSDP2's note on _register_pre_backward_hook (harmless)
        for block in model.blocks:  # one FSDP unit per block, as torchtitan wraps them: each
            fully_shard(block, mesh=mesh["dp"])  # block gathered just before it runs, freed after
        fully_shard(model, mesh=mesh["dp"])  # the root: embeddings, final norm, head
    sgd = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    share, d = cfg.batch // layout.dp, mesh["dp"].get_local_rank()
    losses, rows = [], []  # rows: the sequence positions the first norm sees on this rank
    model.blocks[0].ln1.register_forward_hook(lambda m, args, out: rows.append(_local(args[0]).shape[0]))
    for step in range(cfg.steps):
        tokens, targets = batch(cfg, step)
        cols = slice(d * share, (d + 1) * share)
        with warnings.catch_warnings():  # the head's Linear on a 3-D input returns a view, which
            warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view")
            out = model(tokens[:, cols])  # FSDP2 warns of; the loss reads it out of place
        loss = loss_fn(out, targets[:, cols])
        loss.backward()  # FSDP2 averages the gradients over dp (reduce-scatter)
        sgd.step()
        sgd.zero_grad()
        lt = loss.detach().reshape(1)
        dist.all_reduce(lt, group=mesh["dp"].get_group())
        losses.append(float(lt) / layout.dp)
    quiet = logging.getLogger("torch.distributed.tensor._redistribute")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # its note that gathering dp × tp shards takes 2 all-gathers
    try:
        params = {n: p.full_tensor().detach() for n, p in model.named_parameters()}
    finally:
        quiet.setLevel(level)
    local = sum(p.to_local().numel() for p in model.parameters())
    return {"losses": losses, "params": params, "param_numel": local, "norm_rows": rows[0]}


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t
