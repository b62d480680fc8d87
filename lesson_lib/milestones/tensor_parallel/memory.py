"""Memory per rank of the tensor- and sequence-parallel transformer beside the unsharded one,
measured by torch's allocator (:class:`lesson_lib.peakmem.PeakMemory`) over one forward and
backward, with the parameters (inventory) and the activations the blocks save for the backward
(:class:`lesson_lib.metrics.ActivationMeter`). Chapter 8.
"""

from __future__ import annotations

import torch.distributed as dist

from ...metrics import ActivationMeter, storage_bytes
from ...peakmem import PeakMemory
from .grid import Grid, Layout
from .layers import ParallelTransformer, sync_sequence_parallel
from .model import Config, Transformer, batch, loss_fn


def _measure(build, cfg: Config, group=None) -> dict:
    with PeakMemory() as peak:
        model = build()
        peak.reset_peak()  # from here: the model's parameters are alive
        tokens, targets = batch(cfg, 0)
        meter = ActivationMeter(exclude=list(model.parameters()))
        x = model.embed(tokens)
        with meter.measure():
            x = model.body(x)
        loss_fn(model.finish(x), targets).backward()
        if group is not None:
            sync_sequence_parallel(model.parameters(), group)
    return {"params": storage_bytes(model.parameters()), "block_activations": meter.peak, **peak.as_dict()}


def memory_job(cfg: Config, layout: Layout, unsharded: bool = True) -> dict:
    """On every rank: the layout's model measured; on rank 0 first the unsharded model too."""
    grid = Grid(layout)
    out = {}
    if unsharded and dist.get_rank() == 0:
        out["unsharded"] = _measure(lambda: Transformer(cfg), cfg)
    dist.barrier()  # the others wait: each measurement has the rank's cores to itself
    sp = layout.sequence_parallel
    group = grid.tp_group
    out["parallel"] = _measure(lambda: ParallelTransformer(Transformer(cfg), group, sp), cfg, group)
    return out
