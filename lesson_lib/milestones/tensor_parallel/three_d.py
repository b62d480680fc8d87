"""Data × pipeline × tensor parallelism on one grid (Narayanan et al., SC21), equal to one process.

Each stage holds ``layers / pp`` blocks, tensor-parallel over its tp group; micro-batches run as in
GPipe with point-to-point messages over the pp group, each tp rank sending its own copy (its
seq / t shard with sequence parallelism; Megatron-LM's scatter-gather optimisation is not used).
Gradients are then averaged over the dp group.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.distributed as dist

from ... import comm
from ...metrics import StepRecorder, counters
from ...peakmem import PeakMemory
from ..pipeline.schedules import stage_actions
from . import ops as op_names
from .grid import Grid, Layout
from .layers import ParallelTransformer, all_reduce_flat, gather_full, sync_sequence_parallel
from .model import Config, Transformer, batch, loss_fn


def check(cfg: Config, layout: Layout, micro: int) -> None:
    """ValueError naming the parameter, before any rank starts."""
    layout.check(None, cfg)
    if cfg.layers % layout.pp:
        raise ValueError(f"layers = {cfg.layers} does not divide among pp = {layout.pp} stages")
    if micro < 1 or (cfg.batch // layout.dp) % micro:
        raise ValueError(f"micro = {micro} micro-batches must divide each replica's "
                         f"{cfg.batch // layout.dp} sequences")


def stage_names(cfg: Config, pp: int, stage: int) -> list[str]:
    """The parameter-name prefixes stage ``stage`` owns."""
    per = cfg.layers // pp
    names = [f"blocks.{i}." for i in range(stage * per, (stage + 1) * per)]
    return (["tok.", "pos."] if stage == 0 else []) + names + (["ln.", "head."] if stage == pp - 1 else [])


def activation_shape(cfg: Config, layout: Layout, micro: int) -> tuple[int, int, int]:
    """What a stage sends: ``[seq (/ tp with sequence parallelism), sequences per micro-batch, d]``."""
    seq = cfg.seq // layout.tp if layout.sequence_parallel else cfg.seq
    return seq, cfg.batch // layout.dp // micro, cfg.d_model


def gpipe_step(model, blocks, grid, cfg: Config, micro: int, step: int) -> float:
    """One step's forwards and backwards on this stage, in the order chapter 3's GPipe schedule gives
    (:func:`~lesson_lib.milestones.pipeline.schedules.stage_actions`); the loss on the last stage (0
    elsewhere). Gradients are left in ``.grad``."""
    P, k = grid.layout.pp, grid.pp_rank
    shape, size = activation_shape(cfg, grid.layout, micro), cfg.batch // grid.layout.dp // micro
    tokens, targets = batch(cfg, step)
    lo = grid.dp_rank * size * micro
    ins, outs = {}, {}
    for kind, m in stage_actions("gpipe", P, micro, k):
        if kind == "F":
            cols = slice(lo + m * size, lo + (m + 1) * size)
            if k == 0:
                x = model.embed(tokens[:, cols])
            else:
                x = torch.empty(shape)
                comm.recv(x, k - 1, grid.pp_group, op=op_names.PP_ACTIVATION)
                x.requires_grad_()
            y = x
            for block in blocks:
                y = block(y)
            if k == P - 1:
                y = loss_fn(model.finish(y), targets[:, cols]) / micro  # the mean over micro-batches
            else:
                comm.send(y.detach(), k + 1, grid.pp_group, op=op_names.PP_ACTIVATION)
            ins[m], outs[m] = x, y
        else:
            if k == P - 1:
                outs[m].backward()
            else:
                grad = torch.empty(shape)
                comm.recv(grad, k + 1, grid.pp_group, op=op_names.PP_GRADIENT)
                outs[m].backward(grad)
            if k > 0:
                comm.send(ins[m].grad, k - 1, grid.pp_group, op=op_names.PP_GRADIENT)
    return sum(float(y.detach()) for y in outs.values()) if k == P - 1 else 0.0


def train_3d_job(cfg: Config, layout: Layout, micro: int = 2, recorder: StepRecorder | None = None) -> dict:
    """On every rank: ``cfg.steps`` SGD steps of its stage's blocks, GPipe over ``micro``
    micro-batches, tensor-parallel inside the stage, gradients averaged over dp. A ``recorder``
    times each step (and the last stage's loss), as the registered experiment's worker asks."""
    check(cfg, layout, micro)
    grid = Grid(layout)
    P, k = layout.pp, grid.pp_rank
    model = ParallelTransformer(Transformer(cfg), grid.tp_group, layout.sequence_parallel)
    owned = tuple(stage_names(cfg, P, k))
    mine = [p for n, p in model.named_parameters() if n.startswith(owned)]
    blocks = model.blocks[k * cfg.layers // P:(k + 1) * cfg.layers // P]
    counters().reset()
    losses = []
    with PeakMemory() as meter:  # the training's allocations (the model was built before)
        for step in range(cfg.steps):
            with recorder.step(step) if recorder is not None else nullcontext({}) as timed:
                loss = gpipe_step(model, blocks, grid, cfg, micro, step)
                sync_sequence_parallel(mine, grid.tp_group)
                if layout.dp > 1:
                    all_reduce_flat([p.grad for p in mine], grid.dp_group, op_names.DP_GRAD_ALL_REDUCE,
                                    layout.dp)
                with torch.no_grad():
                    for p in mine:
                        p -= cfg.lr * p.grad
                        p.grad = None
                lt = torch.tensor([loss])
                dist.all_reduce(lt, group=grid.dp_group)  # bookkeeping, not counted: the global loss
                losses.append(float(lt) / layout.dp)
                if k == P - 1:
                    timed["loss"] = losses[-1]
    params = gather_full(model, grid.tp_group)
    return {"rank": dist.get_rank(), "grid": [grid.dp_rank, grid.pp_rank, grid.tp_rank],
            "losses": losses if k == P - 1 else None, "ops": counters().as_dict(),
            "params": {n: t for n, t in params.items() if n.startswith(owned)},
            "param_numel": sum(p.numel() for p in mine), "peak": meter.peak}
