"""Training chapter 8's transformer on a rank grid, and the single process it must equal.

:func:`train_job` (every rank): data parallel over ``grid.dp_group``, tensor (and sequence)
parallel over ``grid.tp_group``; returns the losses, the first step's logits and gradients, the
final parameters reassembled, and the first step's counted bytes per op. :func:`reference` trains
the unsharded model in this process.
"""

from __future__ import annotations

import torch.distributed as dist

from ...metrics import counters
from . import ops as op_names
from .grid import Grid, Layout
from .layers import ParallelTransformer, all_reduce_flat, gather_full, sync_sequence_parallel
from .model import Config, Transformer, batch, loss_fn, sgd


def _ops() -> dict[str, dict]:
    return {op: {"calls": s.calls, "bytes_sent": s.bytes_sent} for op, s in counters().ops.items()}


def _minus(after: dict, before: dict) -> dict:
    out = {}
    for op, s in after.items():
        b = before.get(op, {"calls": 0, "bytes_sent": 0})
        if s["calls"] > b["calls"]:
            out[op] = {k: s[k] - b[k] for k in s}
    return out


def train_job(cfg: Config, layout: Layout) -> dict:
    """On every rank: ``cfg.steps`` SGD steps of the transformer on ``layout``'s grid (dp × tp; the
    grid has a pipeline axis, which chapter 3's stages would use: not trained here)."""
    if layout.pp != 1:
        raise ValueError(f"pp = {layout.pp}: this run trains dp × tp only (chapter 3 trains pipelines)")
    grid = Grid(layout)
    model = ParallelTransformer(Transformer(cfg), grid.tp_group, layout.sequence_parallel)
    share = cfg.batch // layout.dp
    counters().reset()
    losses, first = [], {}
    for step in range(cfg.steps):
        tokens, targets = batch(cfg, step)
        cols = slice(grid.dp_rank * share, (grid.dp_rank + 1) * share)  # my replica's sequences
        start = _ops()
        logits = model(tokens[:, cols])
        loss = loss_fn(logits, targets[:, cols])
        forward = _ops()
        loss.backward()
        sync_sequence_parallel(model.parameters(), grid.tp_group)
        backward = _ops()
        if layout.dp > 1:  # average the replicas' gradients: one all-reduce of them all
            all_reduce_flat([p.grad for p in model.parameters()], grid.dp_group, op_names.DP_GRAD_ALL_REDUCE,
                            layout.dp)
        if step == 0:
            first = {"logits": logits.detach(), "grads": gather_full(model, grid.tp_group, grads=True),
                     "forward": _minus(forward, start), "backward": _minus(backward, forward),
                     "step": _minus(_ops(), start)}
        lt = loss.detach().reshape(1)
        dist.all_reduce(lt, group=grid.dp_group)  # bookkeeping, not counted: the global loss
        losses.append(float(lt) / layout.dp)
        sgd(model.parameters(), cfg.lr)
    return {"rank": dist.get_rank(), "grid": [grid.dp_rank, grid.pp_rank, grid.tp_rank],
            "losses": losses, **first, "params": gather_full(model, grid.tp_group),
            "param_numel": sum(p.numel() for p in model.parameters())}


def reference(cfg: Config) -> dict:
    """The unsharded model in one process: the same steps on the whole batch."""
    model = Transformer(cfg)
    losses, first = [], {}
    for step in range(cfg.steps):
        tokens, targets = batch(cfg, step)
        logits = model(tokens)
        loss = loss_fn(logits, targets)
        loss.backward()
        if step == 0:
            first = {"logits": logits.detach(),
                     "grads": {n: p.grad.clone() for n, p in model.named_parameters()}}
        losses.append(float(loss.detach()))
        sgd(model.parameters(), cfg.lr)
    return {"losses": losses, **first, "params": {n: p.detach().clone() for n, p in model.named_parameters()},
            "param_numel": sum(p.numel() for p in model.parameters())}
