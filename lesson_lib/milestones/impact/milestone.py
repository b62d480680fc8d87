"""The impact (chapter 7): one model and one data set trained through the milestones of chapters
1–6 on the same ranks — sync parameter server, ring data parallel, 1F1B pipeline, ZeRO-1/2/3, LAMB
at a large batch, PowerSGD compression on the real link and on an EMULATED slow one
(:func:`comm.set_link`) — same seed, same target loss.

Each milestone is its own experiment, run unchanged: its ``Config`` (built by :func:`plans`) and
its ``worker`` on every rank, its ``summarize`` afterwards. For each we record the time to reach
the target loss (a mean over ``window`` steps, so one lucky batch does not count; step 0's one-off
costs replaced by a median step), the steps it
took, the bytes the busiest rank moved per step (counted, sent + received), and each rank's
measured memory by category. Before the milestones, the ranks measure this machine — α and β
fit to our ring all-reduce, each rank's FLOP/s on the task's own step — so that the cost model of
chapter 7 can predict each milestone's step time from the same α-β formulas (:func:`predict`).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .. import comm, costmodel
from ..config import TrainConfig, opt, positive_int
from ..data import teacher_classification
from ..experiments import Result, load
from ..metrics import MEMORY_CATEGORIES
from ..models import mlp, mlp_param_count
from ..runtime import context

NAME = "impact"
MILESTONES = ("parameter-server", "ring", "pipeline", "zero-1", "zero-2", "zero-3", "lamb",
              "compression", "compression-slow-link")
LABELS = {"parameter-server": "parameter server (sync)", "ring": "ring all-reduce",
          "pipeline": "pipeline (1F1B)", "zero-1": "ZeRO-1", "zero-2": "ZeRO-2", "zero-3": "ZeRO-3",
          "lamb": "LAMB, large batch", "compression": "PowerSGD (ring)",
          "compression-slow-link": "PowerSGD, emulated link"}
# Chapter 6's compressor for this model: PowerSGD (Vogels et al., NeurIPS 2019) at rank 2, error
# feedback on. Chapter 6 finds top-k 1% and PowerSGD rank 2 both within 1.5× of the uncompressed
# steps and both over 3× faster per step on its slowest emulated link; on THIS model (SGD with
# momentum 0.9, as the ring milestone) top-k 1% did not reach the quick target in 100 steps, top-k
# 10% did but compresses only 3.3×, and PowerSGD rank 2 did (86 steps) at 19× fewer gradient bytes.
# It is also the compressor torch ships as a DDP hook, which chapter 6 checks ours against.
COMPRESSOR = {"compressor": "powersgd", "rank": 2, "error_feedback": True}
# quick: under nbval on 2 cores; workshop: a longer run for a room of laptops with 4+ cores.
PRESETS = {
    "quick": {"world_size": 3, "hidden": 128, "samples": 4096, "steps": 100, "large_batch_steps": 30,
              "target_loss": 1.0},
    "workshop": {"world_size": 4, "hidden": 256, "samples": 8192, "steps": 300, "large_batch_steps": 80,
                 "target_loss": 0.8},
}


@dataclass
class Config(TrainConfig):
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
    # on 2 shared cores (~0.2 ms) hides the emulated one.
    link_gbps: float = opt(0.01, "the compression-slow-link milestone's EMULATED bandwidth, Gbit/s")
    link_latency_us: float = opt(100.0, "its emulated latency per message, µs (chapter 6's)")
    milestones: str = opt("all", "comma-separated subset of: " + ", ".join(MILESTONES))
    lr: float = opt(0.01, "unused: each optimizer has its own rate", cli=False)

    def __post_init__(self):
        preset = PRESETS.get(self.preset, {})
        for name, value in preset.items():
            if getattr(self, name) in (0, 0.0):
                setattr(self, name, value)

    def validate(self) -> "Config":
        if self.preset not in PRESETS:
            raise ValueError(f"preset must be one of {', '.join(PRESETS)}, got {self.preset!r}")
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
    from . import compression, data_parallel, parameter_server, pipeline, zero

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


# --------------------------------------------------------------------------- results


def smoothed(losses: list[float], window: int) -> list[float]:
    """Mean of the last ``window`` losses at each step (fewer at the start)."""
    return [sum(losses[max(0, i + 1 - window):i + 1]) / (i + 1 - max(0, i + 1 - window))
            for i in range(len(losses))]


def reached_at(losses: list[float], target: float, window: int) -> int | None:
    """The first step (counted from 1) whose mean over the last ``window`` steps is ≤ target;
    at least ``window`` steps must have run."""
    for i, v in enumerate(smoothed(losses, window)):
        if i + 1 >= window and v <= target:
            return i + 1
    return None


def slowest(r: Result, key: str) -> float:
    """The largest per-rank median of ``key`` over the ranks that record steps (not a server)."""
    return max(v for v, p in zip(r.median_step(key), r.per_rank) if p["steps"])


def record(name: str, experiment: str, sub, outs: list[dict], cfg: Config) -> dict:
    """One milestone's line of the dashboard, from its own ``summarize`` and per-rank records."""
    mod = load(experiment)
    extra = mod.summarize(sub, outs)
    r = Result(experiment=mod.NAME, world_size=sub.world_size, backend="", config=sub.as_dict(),
               losses=extra.pop("losses", outs[0]["losses"]), per_rank=[o["per_rank"] for o in outs])
    steps_run = len(r.losses)
    walls = r.step_times()
    at = reached_at(r.losses, cfg.target_loss, cfg.window)
    moved = [sum(v["bytes_sent"] + v["bytes_recv"] for op, v in p["ops"].items()
                 if not op.startswith("final")) / steps_run for p in r.per_rank]
    return {
        "milestone": name, "label": LABELS[name], "experiment": experiment, "optimizer": OPTIMIZER[name],
        "global_batch": sub.global_batch, "world_size": sub.world_size, "steps_run": steps_run,
        "reached_target": at is not None, "steps": at if at is not None else steps_run,
        # step 0 pays one-off costs (first connections, allocations): it counts as a median step
        "time_to_target_s": r.median_step_time() + sum(walls[1:at]) if at is not None else None,
        "time_run_s": sum(walls), "median_step_s": r.median_step_time(),
        "median_comm_s": slowest(r, "comm_s"), "median_busy_s": slowest(r, "busy_s"),
        "bytes_per_step_busiest": max(moved), "bytes_per_step_per_rank": moved,
        "peak_memory_per_rank": [{k: p["memory"][k] for k in MEMORY_CATEGORIES} for p in r.per_rank],
        "losses": r.losses, "step_times": walls,
        "param_count": mlp_param_count(sub.d_in, sub.hidden, sub.depth, sub.classes),
        # None: the real link (here, memory copies between processes); a number: EMULATED Gbit/s
        "link_gbps": getattr(sub, "link_gbps", 0.0) or None,
        "compression_ratio": extra.get("compression_ratio"),
    }


def summarize(cfg: Config, outs: list[dict]) -> dict:
    probe = outs[0]["probe"]
    records = []
    for name, (experiment, sub) in plans(cfg).items():
        rec = record(name, experiment, sub, [o["milestones"][name] for o in outs], cfg)
        p = predict(name, sub, probe)
        rec.update(predicted_step_s=p["step"], predicted_compute_s=p["compute"], predicted_comm_s=p["comm"])
        if rec["link_gbps"]:  # what compression saves there: the uncompressed ring on the same link
            rec["predicted_uncompressed_step_s"] = predict_compression(sub.replace(compressor="none"),
                                                                       probe)["step"]
        records.append(rec)
    return {"milestones": records, "target_loss": cfg.target_loss, "window": cfg.window,
            "probe": probe, "losses": records[0]["losses"]}


# --------------------------------------------------------------------------- the model, fed measurements


def predict(name: str, sub, probe: dict) -> dict:
    """Seconds per step the cost model predicts for milestone ``name`` on this machine, split into
    compute (6·Ψ per sample at the measured FLOP/s) and communication (the measured α and β in the
    chapters' formulas; float32 gradients: 4 bytes per parameter)."""
    a, b, x = probe["alpha_s"], probe["beta_s_per_byte"], probe["flops"]
    n, batch = sub.world_size, sub.global_batch
    if name.startswith("compression"):
        return predict_compression(sub, probe)
    psi = mlp_param_count(sub.d_in, sub.hidden, sub.depth, sub.classes)
    layers = sub.depth + 1
    loss_reduce = costmodel.ring_time(4, n, a, b)
    if name == "parameter-server":  # the workers compute; the server's link carries 2·N·S
        compute, talk = 6 * psi * batch / (n - 1) / x, costmodel.ps_time(4 * psi, n - 1, 1, a, b)
    elif name == "ring":
        compute, talk = 6 * psi * batch / n / x, costmodel.ring_time(4 * psi, n, a, b) + loss_reduce
    elif name == "pipeline":  # M + P − 1 slots of one micro-batch through one stage
        m = sub.microbatches
        compute = (m + n - 1) * 6 * psi * batch / m / n / x
        talk = 2 * m * (a + 4 * sub.hidden * batch / m * b)
    else:  # ZeRO (and LAMB on ZeRO-0): per layer a reduce-scatter and an all-gather (stage 3: two
        # all-gathers), each N−1 ring steps of 1/N of the layer
        per_layer = 3 if name == "zero-3" else 2
        compute = 6 * psi * batch / n / x
        talk = per_layer * (layers * (n - 1) * a + (n - 1) / n * 4 * psi * b) + loss_reduce
    return {"compute": compute, "comm": talk, "step": compute + talk}


def powersgd_sizes(sub) -> list[int]:
    """Elements of each ring all-reduce PowerSGD posts per step: the tensors it leaves uncompressed
    (here the biases), P (rows·r per matrix) and Q (columns·r per matrix); compressor "none": Ψ."""
    shapes = [p.shape for p in mlp(sub.d_in, sub.hidden, sub.depth, sub.classes, sub.seed).parameters()]
    if sub.compressor == "none":
        return [sum(math.prod(s) for s in shapes)]
    mats, plain = sub.make_compressor().split(torch.empty(sum(math.prod(s) for s in shapes)), shapes)
    r = [min(*m.shape, sub.rank) for m in mats]
    return [n for n in (sum(v.numel() for v in plain), sum(m.shape[0] * k for m, k in zip(mats, r)),
                        sum(m.shape[1] * k for m, k in zip(mats, r))) if n]


def predict_compression(sub, probe: dict) -> dict:
    """PowerSGD: compute as the ring's (its own matrix products are left out: r ≪ the layer widths);
    communication one ring all-reduce per :func:`powersgd_sizes` entry plus the loss's. On the
    emulated link every message takes at least latency + bytes/bandwidth (chapter 6's model,
    :func:`compression.predicted_step_s`); the slower of that and the real link's α-β counts."""
    from . import compression

    a, b, x = probe["alpha_s"], probe["beta_s_per_byte"], probe["flops"]
    n, psi = sub.world_size, mlp_param_count(sub.d_in, sub.hidden, sub.depth, sub.classes)
    sizes = powersgd_sizes(sub)
    compute = 6 * psi * sub.global_batch / n / x
    talk = sum(costmodel.ring_time(4 * m, n, a, b) for m in sizes) + costmodel.ring_time(4, n, a, b)
    if sub.link_gbps:
        shapes = [p.shape for p in mlp(sub.d_in, sub.hidden, sub.depth, sub.classes, sub.seed).parameters()]
        sent = max(sum(comm.ring_bytes_sent(m, 4, n, r) for m in sizes) for r in range(n))
        emulated = compression.predicted_step_s(0.0, compression.messages_per_step(sub, shapes), sent,
                                                sub.link_gbps, sub.link_latency_us * 1e-6)
        talk = max(talk, emulated)
    return {"compute": compute, "comm": talk, "step": compute + talk}
