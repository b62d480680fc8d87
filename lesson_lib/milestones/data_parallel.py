"""Data parallelism (chapter 0): replicate the model, split the batch, sum the gradients.

All gradients live in one flat buffer (``p.grad`` are views), so one all-reduce per step moves them;
``bucket_mb > 0`` all-reduces buckets during the backward, as DDP does (:mod:`lesson_lib.buckets`).
With a fixed ``global_batch`` and ``seed`` the losses do not depend on the world size.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import buckets, comm
from ..config import TrainConfig, opt, parse_stragglers
from ..data import batch_indices, shard, teacher_classification
from ..metrics import ActivationMeter, StepRecorder, counters, memory_report, per_rank_summary
from ..models import flat_views, mlp
from ..runtime import context

NAME = "data-parallel"


@dataclass
class Config(TrainConfig):
    # laptop: chapter 0's 38k-parameter MLP, 15 steps, seconds per run on 2 cores.
    PRESETS = {"laptop": {"steps": 15, "global_batch": 64, "hidden": 128, "depth": 3},
               "tiny": {"steps": 6, "global_batch": 24, "hidden": 32, "depth": 2, "samples": 512}}

    optimizer: str = opt("adam", "adam | sgd")
    allreduce: str = opt("ring", "ring (ours, counted exactly) | library (the backend's all_reduce)")
    straggler: str = opt("", "RANK:FACTOR[,RANK:FACTOR] — that rank does FACTOR times the work")
    bucket_mb: float = opt(0.0, "0: one all-reduce after the backward | > 0: buckets of this many MiB, "
                                "each all-reduced during the backward as soon as it is ready (as DDP)")
    link_gbps: float = opt(0.0, "EMULATED link bandwidth in Gbit/s for this run's transfers (0: the real "
                                "link; lesson_lib.comm.set_link, undone when the run ends)")

    def validate(self) -> "Config":
        super().validate()
        if self.global_batch % self.world_size:
            raise ValueError(f"global_batch={self.global_batch} must divide evenly over "
                             f"world_size={self.world_size} ranks")
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"optimizer must be 'adam' or 'sgd', got {self.optimizer!r}")
        if self.allreduce not in ("ring", "library"):
            raise ValueError(f"allreduce must be 'ring' or 'library', got {self.allreduce!r}")
        if isinstance(self.bucket_mb, bool) or not isinstance(self.bucket_mb, (int, float)) \
                or not 0 <= self.bucket_mb < 1e6:
            raise ValueError(f"bucket_mb must be a number of MiB >= 0 (0: one bucket after the "
                             f"backward), got {self.bucket_mb!r}")
        if isinstance(self.link_gbps, bool) or not isinstance(self.link_gbps, (int, float)) \
                or not 0 <= self.link_gbps < float("inf"):
            raise ValueError(f"link_gbps must be a bandwidth >= 0 in Gbit/s (0: off), got {self.link_gbps!r}")
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


def overlapped(model, flat: torch.Tensor, bucket_mb: float, allreduce: str, n: int) -> buckets.Overlap:
    """Cut the flat gradient buffer into DDP's buckets of ``bucket_mb`` MiB
    (:func:`~lesson_lib.buckets.plan_ddp`), each all-reduced on the communication thread once written.
    As in DDP, each gradient is divided by ``n`` as it moves into its bucket."""
    params = list(model.parameters())
    ends = torch.tensor([p.numel() for p in params]).cumsum(0).tolist()  # p's slice of flat ends here
    views = [flat[end - p.numel():end].view_as(p) for p, end in zip(params, ends)]
    plan = buckets.plan_ddp([p.numel() * p.element_size() for p in params], int(bucket_mb * 2**20))
    spans = [(ends[min(b)] - params[min(b)].numel(), ends[max(b)]) for b in plan]

    def into_bucket(p, view):  # p.grad is final: divide it into its slice (in place if it is already)
        torch.div(p.grad, n, out=view)
        p.grad = view

    for p, view in zip(params, views):  # registered first: runs before Overlap's hook counts p ready
        p.register_post_accumulate_grad_hook(lambda p, view=view: into_bucket(p, view))

    def reduce(i: int) -> None:
        comm.all_reduce(flat[spans[i][0]:spans[i][1]], allreduce, op="grad_all_reduce")

    return buckets.Overlap([[params[j] for j in b] for b in plan], reduce)


def extra_work(model, x, y, factor: float) -> None:
    """A straggler does ``factor`` times the forward/backward work (real work, not a sleep)."""
    reps = factor - 1.0
    while reps > 1e-9:
        rows = x if reps >= 1 else x[: max(1, int(len(x) * reps))]
        loss = F.cross_entropy(model(rows), y[: len(rows)])
        torch.autograd.grad(loss, list(model.parameters()))
        reps -= 1.0


def runqueue_s() -> float:
    """Seconds the calling thread waited runnable for a core (NaN off Linux), from
    ``/proc/self/task/<tid>/schedstat``: tells waiting for a core from waiting for peers.
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
    overlap = overlapped(model, bucket, cfg.bucket_mb, cfg.allreduce, world_size) \
        if world_size > 1 and cfg.bucket_mb > 0 else None
    losses, timeline = [], {}
    try:
        for step in range(cfg.steps):
            idx = shard(batch_indices(cfg.samples, cfg.global_batch, step, cfg.seed), rank, world_size)
            x, y = x_all[idx], y_all[idx]
            with rec.step(step) as r:
                queued = runqueue_s()
                # buckets: each gradient moves into its bucket after the backward (see overlapped)
                optimizer.zero_grad(set_to_none=overlap is not None)
                with meter.measure():
                    loss = F.cross_entropy(model(x), y)
                if overlap is not None:
                    overlap.start()
                t0 = time.perf_counter()
                loss.backward()  # with buckets: they are all-reduced in here, as they fill
                t1 = time.perf_counter()
                extra_work(model, x, y, factor)
                loss = loss.detach().reshape(1)
                if overlap is not None:
                    overlap.wait()
                    events = overlap.events
                elif world_size > 1:
                    events = [{"bucket": 0, "launched": time.perf_counter()}]
                    events[0]["start"] = events[0]["launched"]
                    comm.all_reduce(bucket, cfg.allreduce, op="grad_all_reduce")
                    bucket.div_(world_size)
                    events[0]["end"] = time.perf_counter()
                timeline = {"backward": (t0, t1), "buckets": events if world_size > 1 else []}
                if world_size > 1:
                    comm.all_reduce(loss, cfg.allreduce, op="loss_all_reduce")
                    loss.div_(world_size)
                optimizer.step()
                r["loss"] = float(loss)
                r["runqueue_s"] = runqueue_s() - queued
            losses.append(r["loss"])
    finally:
        if overlap is not None:
            overlap.close()
    memory = memory_report(model, optimizer, meter.peak, device=device)
    return {"losses": losses, "per_rank": per_rank_summary(rank, rec, memory),
            "param_count": bucket.numel(), "timeline": timeline}


def worker(cfg: Config) -> dict:
    ctx = context()
    counters().reset()
    comm.set_link(cfg.link_gbps or None)
    try:
        return train(cfg, ctx.rank, ctx.world_size, ctx.device, emit=ctx.emit)
    finally:
        comm.set_link(None)  # warm workers serve other runs next


def reference(cfg: TrainConfig, optimizer: str | None = None) -> list[float]:
    """Single-process training on the whole global batch in this process, with ``optimizer``
    ("adam" or "sgd" with momentum 0.9): what every synchronous method must reproduce.
    """
    if optimizer is not None or not isinstance(cfg, Config):
        cfg = Config(world_size=1, optimizer=optimizer or "adam", **cfg.task())
    return train(cfg, 0, 1, torch.device("cpu"))["losses"]


def summarize(cfg: Config, outs: list[dict]) -> dict:
    n, psi = cfg.world_size, outs[0]["param_count"]
    return {"param_count": psi, "param_bytes": 4 * psi,
            "grad_bytes_formula": 2 * (n - 1) * 4 * psi / n,  # per rank, per step (ring)
            "stragglers": parse_stragglers(cfg.straggler, n),
            # the last step's backward and each bucket's all-reduce, per rank (perf_counter seconds)
            "timeline": [o["timeline"] for o in outs]}
