"""One pipeline stage (chapter 3): a stage's training loop (:func:`train_stage`), its actions in
schedule order every step; the model's cut is in :mod:`.cut`, interleaved 1F1B's loop in
:mod:`.interleaved_stage`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ...data import teacher_classification
from ...metrics import ActivationMeter, StepRecorder, counters
from ...models import flat_views
from ...peakmem import PeakMemory
from ...runtime import context
from .comm import StageLink, Timeline
from .config import Config
from .cut import build_stage, choose_partition, layer_units, model_layers, param_costs, time_costs  # noqa: F401
from .interleaved_stage import train_interleaved
from .loop import run_steps, stage_record
from .schedules import stage_actions
from .zero_bubble import SCHEDULE as ZB
from .zero_bubble_stage import train_zero_bubble

# --------------------------------------------------------------------------- one stage, training


def stage_forward(stage: nn.Module, x: torch.Tensor, loss=None, recompute: bool = False) -> torch.Tensor:
    """One micro-batch through the stage (the last stage: and its ``loss``). With ``recompute``
    (activation recomputation, Chen et al., 2016) autograd keeps only the input ``x``, not what the
    layers would save: the backward runs this forward again to rebuild it, one micro-batch at a time
    (chapter 3 §6 shows this function and measures what it saves)."""
    run = stage if loss is None else (lambda x: loss(stage(x)))
    if not recompute:
        return run(x)
    # no randomness in the stage (no dropout): no RNG state to keep, and the recomputed forward
    # equals the first bit for bit
    return checkpoint(run, x, use_reentrant=False, preserve_rng_state=False)


def train_stage(cfg: Config, k: int, device: torch.device, emit=None) -> dict:
    """Stage ``k``'s training loop: its actions in schedule order, every step; with ``cfg.peak_memory``
    inside the allocator's count (:class:`lesson_lib.peakmem.PeakMemory`, chapter 3 §6)."""
    if not cfg.peak_memory:
        return _train_stage(cfg, k, device, emit, None)
    # open before the model exists, so every block the stage frees was counted when allocated
    with PeakMemory(device) as peak:
        out = _train_stage(cfg, k, device, emit, peak)
    out["per_rank"]["memory"].update(peak.as_dict())
    return out


def _train_stage(cfg: Config, k: int, device: torch.device, emit, peak: PeakMemory | None) -> dict:
    P, M = cfg.stages, cfg.m
    bounds, costs = choose_partition(cfg, k, device)
    stage = build_stage(cfg, *bounds[k]).to(device)
    flat, grads = flat_views(stage)
    optimizer = torch.optim.SGD(stage.parameters(), lr=cfg.lr, momentum=0.9)
    first, last = k == 0, k == P - 1
    linears = [m for m in stage if isinstance(m, nn.Linear)]
    rows = cfg.global_batch // M
    x_all, y_all = teacher_classification(cfg.samples, cfg.d_in, cfg.classes)
    x_all, y_all = x_all.to(device), y_all.to(device)
    actions = stage_actions(cfg.schedule, P, M, k)
    tl = Timeline(k, device)
    # Receives are posted ahead so that a neighbour's message leaves as soon as it is computed; 1F1B,
    # whose point is to bound what a stage holds, gets two buffers ahead rather than all M
    # (``python -m lesson_lib bench bubble`` measures both schedules' bubble).
    link = StageLink(k, P, M, (rows, linears[0].in_features), (rows, linears[-1].out_features), tl,
                     ahead=2 if cfg.schedule == "1f1b" else None, meter=peak)
    rec = StepRecorder(device, emit)
    act_peak = per_mb = in_flight = 0

    def step_actions(mbs) -> float:
        nonlocal act_peak, per_mb, in_flight
        held, live, loss_sum = {}, 0, 0.0
        for kind, i in actions:
            if kind == "F":
                x = x_all[mbs[i]] if first else link.recv_activation(i).requires_grad_()
                meter = ActivationMeter(exclude=[flat])
                loss = (lambda out, y=y_all[mbs[i]]: F.cross_entropy(out, y)) if last else None
                with tl.event("forward", i), meter.measure():
                    out = stage_forward(stage, x, loss, cfg.recompute)
                if last:
                    loss_sum += out.item()
                else:
                    link.send_activation(out.detach(), i)
                held[i] = (x, out, meter.peak)  # live until its backward: what 1F1B bounds
                live, per_mb = live + meter.peak, meter.peak
                act_peak, in_flight = max(act_peak, live), max(in_flight, len(held))
            else:
                x, out, nbytes = held.pop(i)
                g = None if last else link.recv_grad(i)
                with tl.event("backward", i):
                    if last:
                        (out / M).backward()  # mean over micro-batches = whole-batch mean
                    else:
                        out.backward(g)
                live -= nbytes
                if not first:
                    link.send_grad(x.grad, i)
                x = out = g = None  # freed now, not when the next action reassigns them
        return loss_sum

    def last_step_peak(step: int) -> None:
        if peak is not None and step == cfg.steps - 1:
            peak.reset_peak()  # the last step's peak: parameters, gradients, momentum are alive now

    losses = run_steps(cfg, k, link, tl, rec, optimizer, grads, emit, step_actions, last_step_peak)
    if peak is not None:
        peak.stop()  # the steps' peak, not the copies made below to send back
    kept = {"params": flat.detach().clone(), "grads": grads.clone()} if cfg.return_params else {}
    return stage_record(k, stage, optimizer, rec, tl, losses, bounds, costs, kept, in_flight, act_peak,
                        per_mb, device)


def worker(cfg: Config) -> dict:
    ctx = context()
    counters().reset()
    train = {"interleaved": train_interleaved, ZB: train_zero_bubble}.get(cfg.schedule, train_stage)
    return train(cfg, ctx.rank, ctx.device, ctx.emit)
