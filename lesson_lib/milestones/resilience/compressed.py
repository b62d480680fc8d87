"""Chapter 6's compressed data parallelism on chapter 10's task, to set beside DiLoCo over a slow link.

:func:`replica` is the notebook's data-parallel loop (``my_diloco`` with ``H = None``) with one change:
the gradient is averaged by a chapter-6 compressor, built by :func:`~..compression.make` and called as
chapter 6's own loop calls it (``compressor.reduce(bucket, shapes)``; error feedback inside). Same data,
model, batches per step and replica, inner SGD and steps, so it sees the same tokens as DDP and DiLoCo.
:func:`counted` runs any such function and adds the bytes its rank sent, as the comm layer counts them.
"""

from __future__ import annotations

import time

import torch.distributed as dist

from ... import comm
from ...metrics import counters
from ..compression import make
from . import task as T

OP = "ch10.compressed"  # the counter the compressed exchange is recorded under


def replica(task: T.Task, compressor: str = "powersgd", gbps: float | None = None, **options) -> dict:
    """One rank: every step the flat gradient is averaged by chapter 6's ``compressor`` (``options``:
    ``rank``, ``ratio``, ``error_feedback``… as :func:`~..compression.make` takes them), then the inner
    SGD step. Returns what ``my_diloco`` returns; run it through :func:`counted`, as DDP and DiLoCo are,
    for the bytes and collectives the comm layer saw."""
    rank = dist.get_rank()
    train, held = T.data(task)
    model, inner = T.build(task)
    shapes = [p.shape for p in model.parameters()]
    squeeze = make(compressor, seed=task.seed, **options)
    if gbps:
        comm.set_link(gbps)
    curve, t0 = [], time.perf_counter()
    for step in range(task.steps):
        flat = T.gradient(model, T.batch(task, train, step, rank))
        squeeze.reduce(flat, shapes, op=OP)  # in place: the ranks' average of what they sent
        T.set_gradient(model, flat)
        inner.step()
        if step % 8 == 7:
            curve.append((time.perf_counter() - t0, T.held_out_loss(model, held)))
    return {"params": T.flat_params(model), "held_out": T.held_out_loss(model, held), "curve": curve}


def counted(fn, *args, **kwargs) -> dict:
    """``fn(*args, **kwargs)`` on this rank, its result with what the comm layer counted while it ran,
    not what the function says: ``bytes_sent`` from this rank, ``collectives`` made and ``comm_s`` spent
    in them."""
    c = counters()
    before = c.bytes_sent, sum(s.calls for s in c.ops.values()), c.seconds
    out = fn(*args, **kwargs)
    sent, calls, seconds = (now - then for now, then in zip(
        (c.bytes_sent, sum(s.calls for s in c.ops.values()), c.seconds), before))
    return {**out, "bytes_sent": sent, "collectives": calls, "comm_s": seconds}
