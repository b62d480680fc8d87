"""The library's pipeline beside ours (chapter 3): ``torch.distributed.pipelining``.

The same stages, weights and micro-batches, trained by ``ScheduleGPipe`` or ``Schedule1F1B`` over
the cluster's group, with ``scale_grads=True`` (as our 1/M loss scaling). Its messages are not counted.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...data import batch_indices, teacher_classification
from ...models import flat_views
from ...runtime import context
from .config import Config
from .results import gaps, reference, state
from .stage import build_stage
from .stage import worker as our_worker


def worker(cfg: Config, bounds: list[tuple[int, int]]) -> dict:
    """Train stage ``rank`` with torch's schedule; losses on the last stage, state on every stage."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    ctx = context()
    k, P, M = ctx.rank, cfg.stages, cfg.m
    module = build_stage(cfg, *bounds[k]).to(ctx.device)
    flat, grads = flat_views(module)
    optimizer = torch.optim.SGD(module.parameters(), lr=cfg.lr, momentum=0.9)
    stage = PipelineStage(module, k, P, ctx.device)
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[cfg.schedule]
    schedule = kind(stage, n_microbatches=M, loss_fn=F.cross_entropy, scale_grads=True)
    x_all, y_all = (t.to(ctx.device) for t in teacher_classification(cfg.samples, cfg.d_in, cfg.classes))
    losses = []
    for step in range(cfg.steps):
        idx = batch_indices(cfg.samples, cfg.global_batch, step, cfg.seed)
        grads.zero_()
        args = (x_all[idx],) if k == 0 else ()
        extra = {"target": y_all[idx], "losses": (mb_losses := [])} if k == P - 1 else {}
        schedule.step(*args, **extra)
        optimizer.step()
        if k == P - 1:
            losses.append(sum(loss.item() for loss in mb_losses) / M)
    return {"losses": losses, "params": flat.detach().clone(), "grads": grads.clone()}


def compare(cfg: Config, cluster) -> dict:
    """Ours, torch's and the single-process reference on the same config: the largest gaps.

    Returns ``{"ours_vs_torch": gaps, "torch_vs_reference": gaps}``, or ``{"error": text}`` if
    torch's pipeline fails here (the message is kept, never hidden).
    """
    cfg = cfg.replace(return_params=True)  # the gaps need our stages' parameters
    if cfg.schedule not in ("gpipe", "1f1b"):
        raise ValueError(f"schedule must be 'gpipe' or '1f1b' to compare with torch, got {cfg.schedule!r}")
    outs = cluster.run(our_worker, cfg)
    ours = state(outs)
    try:
        theirs = state(cluster.run(worker, cfg, outs[0]["bounds"]))
    except Exception as e:  # a library limitation on this backend: report it precisely
        return {"error": f"{type(e).__name__}: {e}"}
    return {"ours_vs_torch": gaps(ours, theirs), "torch_vs_reference": gaps(theirs, reference(cfg))}
