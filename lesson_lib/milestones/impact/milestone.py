"""The impact experiment's plan and run (chapter 7): the milestones it trains and their ``Config``s
(:func:`plans`), the probe of this machine (α, β, FLOP/s), and the worker that runs every milestone
in turn on the same ranks.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ... import comm, costmodel
from ...config import TrainConfig, opt, positive_int
from ...data import teacher_classification
from ...experiments import load
from ...models import mlp, mlp_param_count
from ...runtime import context

NAME = "impact"
MILESTONES = ("parameter-server", "ring", "pipeline", "zero-1", "zero-2", "zero-3", "lamb",
              "compression", "compression-slow-link")
LABELS = {"parameter-server": "parameter server (sync)", "ring": "ring all-reduce",
          "pipeline": "pipeline (1F1B)", "zero-1": "ZeRO-1", "zero-2": "ZeRO-2", "zero-3": "ZeRO-3",
          "lamb": "LAMB, large batch", "compression": "PowerSGD (ring)",
          "compression-slow-link": "PowerSGD, emulated link"}
# Chapter 6's compressor for this model: PowerSGD (Vogels et al., NeurIPS 2019) at rank 2, error
# feedback on, which reaches the quick target with many times fewer gradient bytes (chapter 6 runs
# the compressors side by side). It is also the compressor torch ships as a DDP hook, which chapter 6
# checks ours against (``python -m lesson_lib bench compression``).
COMPRESSOR = {"compressor": "powersgd", "rank": 2, "error_feedback": True}
# What the ``preset`` option fills into the options left at 0. quick: under nbval on 2 cores;
# workshop: a longer run for a room of laptops with 4+ cores.
SIZES = {
    "quick": {"world_size": 3, "hidden": 128, "samples": 4096, "steps": 100, "large_batch_steps": 30,
              "target_loss": 1.0},
    "workshop": {"world_size": 4, "hidden": 256, "samples": 8192, "steps": 300, "large_batch_steps": 80,
                 "target_loss": 0.8},
}


@dataclass
class Config(TrainConfig):
    PRESETS = {"laptop": {"preset": "quick"}, "workshop": {"preset": "workshop"},
               "tiny": {"preset": "quick", "hidden": 16, "samples": 1024, "steps": 12, "large_batch_steps": 6,
                        "target_loss": 2.25}}

    preset: str = opt("quick", "quick (nbval, 2 cores) | workshop (4+ cores); fills the options left at 0")
    world_size: int = opt(0, "ranks for every milestone (the parameter server: one server, the rest workers)")
    steps: int = opt(0, "steps of every small-batch milestone")
    hidden: int = opt(0, "width of the hidden layers")
    samples: int = opt(0, "size of the generated data set")
    target_loss: float = opt(0.0, "the loss every milestone must reach (mean over `window` steps)")
    window: int = opt(5, "steps averaged before comparing the loss with the target")
    global_batch: int = opt(96, "samples per step (divisible by the ranks and by the workers)")
    large_batch_scale: int = opt(8, "the LAMB milestone's batch, in multiples of global_batch")
    large_batch_steps: int = opt(0, "steps of the LAMB milestone")
    sgd_lr: float = opt(0.1, "SGD (momentum 0.9) rate: parameter server, ring, pipeline")
    adam_lr: float = opt(0.003, "Adam rate: ZeRO-1/2/3")
    lamb_lr: float = opt(0.05, "LAMB rate at the large batch")
    microbatches: int = opt(4, "pipeline micro-batches per step")
    # 10 Mbit/s makes this 38k-parameter model's uncompressed ring exchange (~150 KB) take ~100× its
    # compute, the regime of a large model on a real cluster link; faster, Gloo's own per-message cost
    # on shared cores (``python -m lesson_lib bench allreduce`` shows it at small sizes) hides the
    # emulated one.
    link_gbps: float = opt(0.01, "the compression-slow-link milestone's EMULATED bandwidth, Gbit/s")
    link_latency_us: float = opt(100.0, "its emulated latency per message, µs (chapter 6's)")
    milestones: str = opt("all", "comma-separated subset of: " + ", ".join(MILESTONES))
    lr: float = opt(0.01, "unused: each optimizer has its own rate", cli=False)

    def __post_init__(self):
        preset = SIZES.get(self.preset, {})
        for name, value in preset.items():
            if getattr(self, name) in (0, 0.0):
                setattr(self, name, value)

    def validate(self) -> "Config":
        if self.preset not in SIZES:
            raise ValueError(f"preset must be one of {', '.join(SIZES)}, got {self.preset!r}")
        if self.world_size < 2:
            raise ValueError(f"world_size must be at least 2 (a server and a worker), got {self.world_size}")
        for name in ("window", "large_batch_scale", "large_batch_steps", "microbatches"):
            positive_int(self, name)
        for name in ("target_loss", "sgd_lr", "adam_lr", "lamb_lr", "link_gbps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or v == float("inf"):
                raise ValueError(f"{name} must be a positive number, got {v!r}")
        super().validate()
        self.chosen()
        for name, (_, sub) in plans(self).items():  # each milestone's own checks, before any worker
            try:
                sub.validate()
            except ValueError as e:
                raise ValueError(f"milestone {name}: {e}") from None
        return self

    def chosen(self) -> list[str]:
        names = list(MILESTONES) if self.milestones == "all" else [
            m.strip() for m in str(self.milestones).split(",") if m.strip()]
        bad = [m for m in names if m not in MILESTONES]
        if bad or not names:
            raise ValueError(f"milestones must be 'all' or a comma-separated subset of "
                             f"{', '.join(MILESTONES)}; got {self.milestones!r}")
        return names


def plans(cfg: Config) -> dict[str, tuple[str, object]]:
    """Each chosen milestone's experiment and ``Config``: one task (model, data, seed), one world."""
    from .. import compression, data_parallel, parameter_server, pipeline, zero

    task = {"hidden": cfg.hidden, "depth": cfg.depth, "d_in": cfg.d_in, "classes": cfg.classes,
            "samples": cfg.samples, "seed": cfg.seed, "global_batch": cfg.global_batch, "steps": cfg.steps,
            "backend": cfg.backend, "timeout_s": cfg.timeout_s}
    n = cfg.world_size
    all_ = {
        "parameter-server": ("parameter-server", lambda: parameter_server.Config(
            workers=n - 1, servers=1, mode="sync", lr=cfg.sgd_lr, **task)),
        "ring": ("data-parallel", lambda: data_parallel.Config(
            world_size=n, optimizer="sgd", allreduce="ring", lr=cfg.sgd_lr, **task)),
        "pipeline": ("pipeline", lambda: pipeline.Config(
            stages=n, microbatches=cfg.microbatches, schedule="1f1b", lr=cfg.sgd_lr, **task)),
        **{f"zero-{s}": ("zero", lambda s=s: zero.Config(world_size=n, stage=s, optimizer="adam",
                                                          lr=cfg.adam_lr, **task)) for s in (1, 2, 3)},
        "lamb": ("zero", lambda: zero.Config(
            world_size=n, stage=0, optimizer="lamb", lr=cfg.lamb_lr, **{
                **task, "global_batch": cfg.large_batch_scale * cfg.global_batch,
                "steps": cfg.large_batch_steps})),
        "compression": ("compression", lambda: compression.Config(
            world_size=n, lr=cfg.sgd_lr, momentum=0.9, **COMPRESSOR, **task)),
        "compression-slow-link": ("compression", lambda: compression.Config(
            world_size=n, lr=cfg.sgd_lr, momentum=0.9, link_gbps=cfg.link_gbps,
            link_latency_us=cfg.link_latency_us, **COMPRESSOR, **task)),
    }
    return {name: (all_[name][0], all_[name][1]()) for name in cfg.chosen()}


OPTIMIZER = {"parameter-server": "SGD", "ring": "SGD", "pipeline": "SGD", "zero-1": "Adam",
             "zero-2": "Adam", "zero-3": "Adam", "lamb": "LAMB", "compression": "SGD",
             "compression-slow-link": "SGD"}


# --------------------------------------------------------------------------- this machine, measured


def measure_machine(cfg: Config, sizes=(4, 4096, 65536, 1 << 20), reps: int = 7) -> dict:
    """On every rank, all ranks at once (so the cores are shared as in training): α and β fitted
    to our ring all-reduce at four sizes (chapter 2's method), and the FLOP/s of one local training
    step of the task's model (forward, backward, SGD update) on a rank's share of the batch."""
    n = dist.get_world_size()
    rows = []
    for size in sizes:
        t = torch.ones(max(1, size // 4))
        comm.ring_all_reduce(t, op="probe")  # opens the connections: not timed
        rounds = []
        for _ in range(reps):
            dist.barrier()
            t0 = time.perf_counter()
            comm.ring_all_reduce(t, op="probe")
            rounds.append(time.perf_counter() - t0)
        rows.append({"world_size": n, "size_bytes": size, "time_s": statistics.median(rounds)})
    fit = costmodel.fit_alpha_beta(rows, "ring")
    model = mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed)
    opt_ = torch.optim.SGD(model.parameters(), lr=1e-9)
    x, y = teacher_classification(cfg.samples, cfg.d_in, cfg.classes)
    local = cfg.global_batch // n
    rounds = []
    dist.barrier()
    for _ in range(12):
        t0 = time.perf_counter()
        opt_.zero_grad()
        F.cross_entropy(model(x[:local]), y[:local]).backward()
        opt_.step()
        rounds.append(time.perf_counter() - t0)
    psi = mlp_param_count(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes)
    flops = 6 * psi * local / statistics.median(rounds[2:])  # 2Ψ forward + 4Ψ backward per sample
    rates = [torch.zeros(1) for _ in range(n)]
    dist.all_gather(rates, torch.tensor([flops]))
    return {**fit, "flops_per_rank": [float(r) for r in rates], "flops": min(float(r) for r in rates),
            "ring_rows": rows}


def worker(cfg: Config) -> dict:
    ctx = context()
    probe = measure_machine(cfg)
    outs = {}
    subs = plans(cfg)
    total, offset = sum(sub.steps for _, sub in subs.values()), 0
    for name, (experiment, sub) in subs.items():
        # offset/total: the CLI's progress bar runs once over every milestone's steps
        ctx.emit("milestone", name=name, steps=sub.steps, offset=offset, total=total)
        outs[name] = load(experiment).worker(sub)
        offset += sub.steps
    last = outs[list(outs)[-1]]["per_rank"]
    return {"milestones": outs, "probe": probe, "losses": [],
            "per_rank": {**last, "steps": []}}  # the last milestone's counters stand for the job
