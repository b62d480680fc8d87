"""Data parallelism (chapter 0): replicate the model, split the batch, sum the gradients.

Every rank holds the whole model, trains on its slice of the
global batch, and the gradients are summed across ranks before every update.

The gradients of all layers live in one flat bucket (``p.grad`` are views into it), so one
all-reduce per step moves them, and the measured grads memory is exactly that bucket.
With a fixed ``global_batch`` and ``seed`` the losses do not depend on the world size:
the mean of the ranks' mean losses over equal slices is the mean over the whole batch.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import comm
from ..config import TrainConfig, opt, parse_stragglers
from ..data import batch_indices, shard, teacher_classification
from ..metrics import ActivationMeter, StepRecorder, counters, memory_report, per_rank_summary, sync
from ..models import flat_views, mlp
from ..runtime import context

NAME = "data-parallel"


@dataclass
class Config(TrainConfig):
    optimizer: str = opt("adam", "adam | sgd")
    allreduce: str = opt("ring", "ring (ours, counted exactly) | library (the backend's all_reduce)")
    straggler: str = opt("", "RANK:FACTOR[,RANK:FACTOR] — that rank does FACTOR times the work")

    def validate(self) -> "Config":
        super().validate()
        if self.global_batch % self.world_size:
            raise ValueError(f"global_batch={self.global_batch} must divide evenly over "
                             f"world_size={self.world_size} ranks")
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"optimizer must be 'adam' or 'sgd', got {self.optimizer!r}")
        if self.allreduce not in ("ring", "library"):
            raise ValueError(f"allreduce must be 'ring' or 'library', got {self.allreduce!r}")
        parse_stragglers(self.straggler, self.world_size)
        return self


def build(cfg: Config, device: torch.device):
    """The model, its flat gradient bucket (one all-reduce moves all grads) and its optimizer."""
    model = mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed).to(device)
    _, bucket = flat_views(model)
    params = list(model.parameters())
    if cfg.optimizer == "adam":
        optimizer = torch.optim.Adam(params, lr=cfg.lr)
    else:
        optimizer = torch.optim.SGD(params, lr=cfg.lr, momentum=0.9)
    return model, bucket, optimizer


def extra_work(model, x, y, factor: float) -> None:
    """A straggler does ``factor`` times the forward/backward work (real work, not a sleep)."""
    reps = factor - 1.0
    while reps > 1e-9:
        rows = x if reps >= 1 else x[: max(1, int(len(x) * reps))]
        loss = F.cross_entropy(model(rows), y[: len(rows)])
        torch.autograd.grad(loss, list(model.parameters()))
        reps -= 1.0


def runqueue_s() -> float:
    """Seconds the calling thread has spent runnable but waiting for a CPU core (NaN off Linux).

    The second field of Linux's ``/proc/self/task/<tid>/schedstat`` (run-queue wait, ns). It tells
    time spent waiting for a *core* (another rank or program had it) from time spent waiting for
    *peers* (blocked in a receive), which ``wall - busy`` lumps together (chapter 0's idle figure).
    """
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return float("nan")


def train(cfg: Config, rank: int, world_size: int, device: torch.device, emit=None) -> dict:
    """The training loop; with ``world_size == 1`` and no process group it is the reference."""
    model, bucket, optimizer = build(cfg, device)
    x_all, y_all = teacher_classification(cfg.samples, cfg.d_in, cfg.classes)
    x_all, y_all = x_all.to(device), y_all.to(device)
    factor = parse_stragglers(cfg.straggler, world_size).get(rank, 1.0)
    meter = ActivationMeter(exclude=model.parameters())
    rec = StepRecorder(device, emit)
    losses = []
    for step in range(cfg.steps):
        idx = shard(batch_indices(cfg.samples, cfg.global_batch, step, cfg.seed), rank, world_size)
        x, y = x_all[idx], y_all[idx]
        with rec.step(step) as r:
            queued = runqueue_s()
            optimizer.zero_grad(set_to_none=False)
            with meter.measure():
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            extra_work(model, x, y, factor)
            loss = loss.detach().reshape(1)
            if world_size > 1:
                comm.all_reduce(bucket, cfg.allreduce, op="grad_all_reduce")
                bucket.div_(world_size)
                comm.all_reduce(loss, cfg.allreduce, op="loss_all_reduce")
                loss.div_(world_size)
            optimizer.step()
            r["loss"] = float(loss)
            r["runqueue_s"] = runqueue_s() - queued
        losses.append(r["loss"])
    memory = memory_report(model, optimizer, meter.peak, device=device)
    return {"losses": losses, "per_rank": per_rank_summary(rank, rec, memory),
            "param_count": bucket.numel()}


def worker(cfg: Config) -> dict:
    ctx = context()
    counters().reset()
    return train(cfg, ctx.rank, ctx.world_size, ctx.device, emit=ctx.emit)


def reference(cfg: TrainConfig, optimizer: str | None = None) -> list[float]:
    """Single-process training on the whole global batch, in this process, no process group.

    Any milestone's config will do: its training problem (``cfg.task()``) is rerun here with
    ``optimizer`` ("adam" or "sgd" with momentum 0.9) — the answer every synchronous method
    must reproduce.
    """
    if optimizer is not None or not isinstance(cfg, Config):
        cfg = Config(world_size=1, optimizer=optimizer or "adam", **cfg.task())
    return train(cfg, 0, 1, torch.device("cpu"))["losses"]


def summarize(cfg: Config, outs: list[dict]) -> dict:
    n, psi = cfg.world_size, outs[0]["param_count"]
    return {"param_count": psi, "param_bytes": 4 * psi,
            "grad_bytes_formula": 2 * (n - 1) * 4 * psi / n,  # per rank, per step (ring)
            "stragglers": parse_stragglers(cfg.straggler, n)}


def time_against_ddp(hidden_sizes: list[int], steps: int = 12, global_batch: int = 256) -> dict:
    """On every rank: seconds of our data-parallel step (one flat bucket, all-reduced after the
    whole backward, by our ring or the library) and of ``DistributedDataParallel``'s (buckets
    all-reduced during the backward), on the same model, data and Adam, interleaved step by step.

    Issue 13's yardstick (``python -m lesson_lib bench ddp``): DDP overlaps its bucketed all-reduce
    with the backward, which ours does not yet. The first step of each is a warm-up and dropped.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    ctx = context()
    rank, n, device = ctx.rank, ctx.world_size, ctx.device
    out = {}
    for hidden in hidden_sizes:
        cfg = Config(world_size=n, hidden=hidden, global_batch=global_batch, steps=1,
                     samples=max(4096, global_batch)).validate()
        ours = {a: build(cfg, device) for a in ("ring", "library")}
        ddp = DDP(mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed).to(device))
        ddp_opt = torch.optim.Adam(ddp.parameters(), lr=cfg.lr)
        x_all, y_all = teacher_classification(cfg.samples, cfg.d_in, cfg.classes)
        times: dict = {"ring": [], "library": [], "ddp": []}
        names = list(times)
        for step in range(steps + 1):
            idx = shard(batch_indices(cfg.samples, cfg.global_batch, step, cfg.seed), rank, n)
            x, y = x_all[idx].to(device), y_all[idx].to(device)
            for name in names[step % 3:] + names[:step % 3]:  # take turns: load falls on all alike
                torch.distributed.barrier()
                t0 = time.perf_counter()
                if name == "ddp":
                    ddp_opt.zero_grad()
                    F.cross_entropy(ddp(x), y).backward()  # DDP all-reduces its buckets in here
                    ddp_opt.step()
                else:  # the library's train() step, without its meters and recorders
                    model, bucket, optimizer = ours[name]
                    optimizer.zero_grad(set_to_none=False)
                    F.cross_entropy(model(x), y).backward()
                    comm.all_reduce(bucket, name, op="bench")
                    bucket.div_(n)
                    optimizer.step()
                sync(device)
                times[name].append(time.perf_counter() - t0)
        out[hidden] = {"params": ours["ring"][1].numel(), **{k: v[1:] for k, v in times.items()}}
    return out
