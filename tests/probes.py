"""Small worker functions for the tests: whoami, echo, collectives, failures, events.

Registered with cloudpickle to travel by value, so workers need not find ``tests/`` on their path.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import cloudpickle
import torch
import torch.distributed as dist

from lesson_lib import comm
from lesson_lib.metrics import counters
from lesson_lib.runtime import context

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def whoami() -> dict:
    ctx = context()
    return {"rank": ctx.rank, "world_size": ctx.world_size, "backend": ctx.backend,
            "pid": os.getpid(), "threads": torch.get_num_threads(), "device": str(ctx.device)}


def noop() -> None:
    return None


def echo(*args, **kwargs):
    return args, kwargs


def library_all_reduce(numel: int) -> float:
    t = torch.full((numel,), float(context().rank + 1), device=context().device)
    dist.all_reduce(t)
    return float(t[0])


def ring(values: list[list[float]], dtype: str = "float32", algorithm: str = "ring",
         ) -> tuple[list[float], dict]:
    """All-reduce of ``values[rank]`` by one of ours; returns the result and the rank's counters."""
    counters().reset()
    t = torch.tensor(values[context().rank], dtype=getattr(torch, dtype))
    comm.all_reduce(t, algorithm, op="ring_all_reduce")
    return t.float().tolist(), counters().as_dict()


def raise_on(rank: int, message: str = "boom") -> int:
    """Rank ``rank`` raises; the others enter a collective and are left waiting for it."""
    ctx = context()
    if ctx.rank == rank:
        raise ValueError(message)
    t = torch.ones(1)
    dist.all_reduce(t)
    return ctx.rank


def kill_self_on(rank: int) -> int:
    ctx = context()
    if ctx.rank == rank:
        os.kill(os.getpid(), signal.SIGKILL)
    t = torch.ones(1)
    dist.all_reduce(t)
    return ctx.rank


def stall_on(rank: int) -> int:
    """Rank ``rank`` silently stops taking part (sleeps outside any collective)."""
    ctx = context()
    if ctx.rank == rank:
        time.sleep(3600)
    t = torch.ones(1)
    dist.all_reduce(t)
    return ctx.rank


def spin(seconds: float) -> int:
    """Busy work on every rank, with progress events, for interrupt tests."""
    end = time.monotonic() + seconds
    a = torch.randn(64, 64)
    i = 0
    while time.monotonic() < end:
        a = torch.tanh(a @ a)
        i += 1
        if i % 200 == 0:
            context().emit("tick", i=i)
    return i


def emit_events(n: int) -> int:
    for i in range(n):
        context().emit("tick", i=i)
    return n


def emit_batched_then_now(n: int) -> int:
    """``n`` events that may wait (``batched``), one that may not, then ``n`` more that wait until the
    job ends; returns how many the first ``n`` left waiting at most (> 1: they travelled together)."""
    ctx, most = context(), 0
    for i in range(n):
        ctx.emit("batched", batched=True, i=i)
        most = max(most, len(ctx._batched))
    ctx.emit("now", i=n)
    for i in range(n + 1, 2 * n + 1):
        ctx.emit("batched", batched=True, i=i)
    return most


def library_all_reduce_values(values: list[list[float]]) -> list[float]:
    """``dist.all_reduce`` of ``values[rank]`` (the reference for our ring)."""
    t = torch.tensor(values[context().rank], dtype=torch.float32)
    dist.all_reduce(t)
    return t.tolist()


def as_cell(fn):
    """``fn`` as if defined in a notebook cell: ``__module__ = "__main__"``, so it travels to the
    workers by value and its lines are the ones a message must name."""
    fn.__module__ = "__main__"
    return fn


@as_cell
def barrier_on_rank_0():
    """A collective on some ranks only: rank 0 waits in a barrier rank 1 never enters."""
    import torch.distributed as dist

    if dist.get_rank() == 0:
        dist.barrier()
    return dist.get_rank()
