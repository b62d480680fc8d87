"""What every pipeline stage's training loop shares (GPipe and 1F1B in :mod:`.stage`, interleaved
1F1B in :mod:`.interleaved_stage`, ZB-H1 in :mod:`.zero_bubble_stage`): the steps around the
schedule's actions, and the record a stage returns. Each schedule's actions stay in its own module.
"""

from __future__ import annotations

from typing import Callable

import torch

from ...data import batch_indices
from ...metrics import memory_report, per_rank_summary


def run_steps(cfg, k: int, link, tl, rec, optimizer, grads: torch.Tensor, emit,
              actions: Callable[[list[torch.Tensor]], float],
              before_step: Callable[[int], None] | None = None) -> list[float]:
    """``cfg.steps`` steps of stage ``k``: each step's micro-batch indices, the gradients zeroed,
    ``actions(micro_batches)`` (the schedule's forwards and backwards; it returns the sum of the
    micro-batches' losses on the last stage), the messages flushed, the optimizer's step. Returns the
    last stage's mean loss per step (empty elsewhere); the link is closed at the end, whatever happens."""
    M, rows, last = cfg.m, cfg.global_batch // cfg.m, k == cfg.stages - 1
    losses = []
    try:
        for step in range(cfg.steps):
            tl.step = step
            idx = batch_indices(cfg.samples, cfg.global_batch, step, cfg.seed)
            mbs = [idx[i * rows:(i + 1) * rows] for i in range(M)]
            if before_step is not None:
                before_step(step)
            with rec.step(step) as r:
                grads.zero_()
                link.begin_step()
                loss_sum = actions(mbs)
                link.flush()
                optimizer.step()
                if last:
                    r["loss"] = loss_sum / M  # mean over micro-batches = whole-batch mean
            if last:
                losses.append(r["loss"])
            if emit is not None:
                emit("pp_events", step=step, events=tl.of_step(step))
    finally:
        link.close()
    return losses


def stage_record(k: int, model, optimizer, rec, tl, losses: list[float], bounds, costs, kept: dict,
                 in_flight: int, act_peak: int = 0, per_mb: int = 0, device=None) -> dict:
    """What a stage's job returns (:mod:`.results` reads it)."""
    memory = memory_report(model, optimizer, act_peak, device=device)
    return {"losses": losses, "stage": k, "bounds": bounds, "costs": costs, "events": tl.events, **kept,
            "activation_peak": act_peak, "activation_per_microbatch": per_mb, "max_in_flight": in_flight,
            "per_rank": per_rank_summary(k, rec, memory)}
