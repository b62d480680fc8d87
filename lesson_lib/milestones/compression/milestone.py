"""The compression experiment (chapter 6): its ``Config``, a compressor by name (:func:`make`), the
training loop on every rank and its single-process reference, the summary, and chapter 2's α-β model
of a step on the emulated link.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ... import comm
from ...config import TrainConfig, opt
from ...data import batch_indices, shard, teacher_classification
from ...metrics import StepRecorder, counters, memory_report, per_rank_summary
from ...models import flat_views, mlp
from ...runtime import context
from .allreduce import SignAllReduce
from .compressors import QSGD, Cast, Compressor, RandomK, Sign, TopK
from .powersgd import PowerSGD

NAME = "compression"
COMPRESSORS = ("none", "fp16", "bf16", "topk", "randomk", "qsgd", "sign", "sign-allreduce", "powersgd")
# All-gathered: each rank sends (N−1) payloads. The others add in place (ring all-reduces) or are
# reduced in chunks (sign-allreduce, Tang et al., 2021): 2(N−1)/N.
ALL_GATHERED = ("topk", "qsgd", "sign")


def make(name: str, ratio: float = 0.01, bits: int = 4, rank: int = 1, error_feedback: bool = True,
         seed: int = 0, algorithm: str = "ring", **powersgd) -> Compressor:
    """A compressor by name (the experiment's ``--compressor``); the other options where they apply.
    ``algorithm``: the all-reduce of the compressors that all-reduce (:meth:`Compressor.all_reduce`)."""
    kw = {"seed": seed, "algorithm": algorithm}
    if name == "none":
        return Compressor(**kw)
    if name in ("fp16", "bf16"):
        return Cast(torch.float16 if name == "fp16" else torch.bfloat16, **kw)
    if name == "topk":
        return TopK(ratio, error_feedback=error_feedback, **kw)
    if name == "randomk":
        return RandomK(ratio, error_feedback=error_feedback, **kw)
    if name == "qsgd":
        return QSGD(bits, **kw)
    if name == "sign":
        return Sign(error_feedback=error_feedback, **kw)
    if name == "sign-allreduce":
        return SignAllReduce(error_feedback=error_feedback, **kw)
    if name == "powersgd":
        return PowerSGD(rank, error_feedback=error_feedback, **kw, **powersgd)
    raise ValueError(f"compressor must be one of {', '.join(COMPRESSORS)}, got {name!r}")


@dataclass
class Config(TrainConfig):
    # laptop: a 2-layer MLP of 77k parameters, 2 ranks, plain SGD, 150 steps.
    PRESETS = {"laptop": {"world_size": 2, "steps": 150, "lr": 0.2, "momentum": 0.0, "global_batch": 64,
                          "hidden": 256, "depth": 2},
               "tiny": {"world_size": 2, "steps": 8, "hidden": 32, "depth": 2, "samples": 512}}

    compressor: str = opt("none", " | ".join(COMPRESSORS))
    ratio: float = opt(0.01, "top-k / random-k: the fraction of the gradient sent, in (0, 1]")
    bits: int = opt(4, "QSGD: s = 2^bits − 1 levels a side, 1–7; a code (sign and level) crosses "
                       "in bits + 1 bits rounded up to 2, 4 or 8 (bits 2: 4-bit codes)")
    rank: int = opt(1, "PowerSGD: the rank r of the approximation P Qᵀ")
    error_feedback: bool = opt(True, "keep what was not sent and add it to the next gradient "
                                     "(top-k, random-k, sign, sign-allreduce on both sides, PowerSGD)")
    link_gbps: float = opt(0.0, "emulated link bandwidth in Gbit/s (0: no emulation, the real link)")
    link_latency_us: float = opt(100.0, "emulated latency of each message in µs (with --link-gbps)")
    hidden: int = opt(256, "width of the hidden layers")
    depth: int = opt(2, "number of hidden layers")
    steps: int = opt(60, "training steps")
    lr: float = opt(0.05, "learning rate")
    momentum: float = opt(0.0, "SGD momentum (0: plain SGD, the setting of the error-feedback analyses)")

    def validate(self) -> "Config":
        if self.compressor not in COMPRESSORS:
            raise ValueError(f"compressor must be one of {', '.join(COMPRESSORS)}, "
                             f"got {self.compressor!r}")
        if not (isinstance(self.ratio, (int, float)) and 0 < self.ratio <= 1):
            raise ValueError(f"ratio must be in (0, 1], got {self.ratio!r}")
        if isinstance(self.bits, bool) or not isinstance(self.bits, int) or not 1 <= self.bits <= 7:
            raise ValueError(f"bits must be an int from 1 to 7, got {self.bits!r}")
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"rank must be an int >= 1, got {self.rank!r}")
        if not isinstance(self.error_feedback, bool):
            raise ValueError(f"error_feedback must be True or False, got {self.error_feedback!r}")
        if not (isinstance(self.link_gbps, (int, float)) and math.isfinite(self.link_gbps)
                and self.link_gbps >= 0):
            raise ValueError(f"link_gbps must be a bandwidth >= 0 in Gbit/s (0: off), got {self.link_gbps!r}")
        if not (isinstance(self.link_latency_us, (int, float)) and 0 <= self.link_latency_us <= 1e6):
            raise ValueError(f"link_latency_us must be in [0, 1e6] µs, got {self.link_latency_us!r}")
        super().validate()
        if self.global_batch % self.world_size:
            raise ValueError(f"global_batch={self.global_batch} must divide evenly over "
                             f"world_size={self.world_size} ranks")
        return self

    def make_compressor(self) -> Compressor:
        return make(self.compressor, ratio=self.ratio, bits=self.bits, rank=self.rank,
                                error_feedback=self.error_feedback, seed=self.seed)


def train(cfg: Config, rank: int, world_size: int, device: torch.device, emit=None) -> dict:
    """The loop; with ``world_size == 1`` and no process group it is the single-process reference."""
    model = mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed).to(device)
    _, bucket = flat_views(model)
    shapes = [p.shape for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    compressor = cfg.make_compressor()
    x_all, y_all = teacher_classification(cfg.samples, cfg.d_in, cfg.classes)
    rec = StepRecorder(device, emit)
    losses, sent = [], []
    for step in range(cfg.steps):
        idx = shard(batch_indices(cfg.samples, cfg.global_batch, step, cfg.seed), rank, world_size)
        with rec.step(step) as r:
            optimizer.zero_grad(set_to_none=False)
            loss = F.cross_entropy(model(x_all[idx].to(device)), y_all[idx].to(device))
            loss.backward()
            compressor.reduce(bucket, shapes, op="grad")  # the average of what the ranks sent
            loss = loss.detach().reshape(1)
            if world_size > 1:
                comm.all_reduce(loss, "ring", op="loss_all_reduce")
                loss.div_(world_size)
            optimizer.step()
            r["loss"] = float(loss)
        losses.append(r["loss"])
        sent.append(counters().ops["grad"].bytes_sent if "grad" in counters().ops else 0)
        if not math.isfinite(r["loss"]):  # every rank sees the same all-reduced loss: all stop
            break
    # the compressor's state (residuals, PowerSGD's Q) is memory too: counted under buffers
    memory = memory_report(model, optimizer, 0, buffers=compressor.state_tensors(), device=device)
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
    return {"losses": losses, "grad_bytes_cumulative": sent, "param_count": bucket.numel(),
            "params_sha1": hashlib.sha1(params.numpy().tobytes()).hexdigest(),  # ranks agree?
            "shapes": [list(s) for s in shapes], "per_rank": per_rank_summary(rank, rec, memory)}


def worker(cfg: Config) -> dict:
    ctx = context()
    counters().reset()
    comm.set_link(cfg.link_gbps or None, cfg.link_latency_us * 1e-6)
    try:
        return train(cfg, ctx.rank, ctx.world_size, ctx.device, emit=ctx.emit)
    finally:
        comm.set_link(None)  # warm workers serve other chapters next: never leave the link slowed


def reference(cfg: Config) -> dict:
    """Single-process training on the whole global batch, in this process (no process group)."""
    return train(cfg.replace(world_size=1), 0, 1, torch.device("cpu"))


def messages_per_step(cfg: Config, shapes: list) -> int:
    """Messages each rank posts per step (each pays the latency once): 2(N−1) per ring all-reduce,
    N−1 per all-gather, plus the loss's all-reduce."""
    n = cfg.world_size
    if n == 1:
        return 0
    ring, gather = 2 * (n - 1), n - 1
    grads = gather if cfg.compressor in ALL_GATHERED else ring
    if cfg.compressor == "powersgd":  # P (the uncompressed tensors ride with it), then Q
        grads = ring * len(cfg.make_compressor().all_reduce_sizes(shapes))
    return grads + ring


def summarize(cfg: Config, outs: list[dict]) -> dict:
    n, psi = cfg.world_size, outs[0]["param_count"]
    steps = len(outs[0]["losses"])
    wire = max(o["grad_bytes_cumulative"][-1] for o in outs) / steps if steps else 0.0
    ring = max(comm.ring_bytes_sent(psi, 4, n, r) for r in range(n)) if n > 1 else 0
    # Compute time: the slowest rank's step minus its time inside communication (median, step 0 skipped).
    compute = statistics.median(
        max(s["wall_s"] - s["comm_s"] for s in per_step)
        for per_step in list(zip(*(o["per_rank"]["steps"] for o in outs)))[1:] or
        list(zip(*(o["per_rank"]["steps"] for o in outs))))
    return {"param_count": psi, "wire_bytes_per_step": wire, "uncompressed_bytes_per_step": ring,
            "compression_ratio": ring / wire if wire else None,
            "link_gbps": cfg.link_gbps or None,
            "link_latency_s": cfg.link_latency_us * 1e-6 if cfg.link_gbps else None,
            "messages_per_step": messages_per_step(cfg, outs[0]["shapes"]),
            "compute_s_per_step": compute,
            "grad_bytes_cumulative": [max(o["grad_bytes_cumulative"][i] for o in outs) for i in range(steps)],
            "diverged": not math.isfinite(outs[0]["losses"][-1]) if steps else False,
            "ranks_agree": len({o["params_sha1"] for o in outs}) == 1}  # the same parameters, bit for bit


def predicted_step_s(compute_s: float, messages: int, wire_bytes: float, gbps: float,
                     latency_s: float) -> float:
    """Chapter 2's α-β model on the emulated link: compute + messages·α + bytes·β, β = 1/bandwidth;
    ``wire_bytes``: gradient bytes a rank sends per step."""
    return compute_s + messages * latency_s + wire_bytes * 8 / (gbps * 1e9)


def crossover_gbps(a: dict, b: dict, latency_s: float) -> float | None:
    """Bandwidth below which ``b`` (compressed) beats ``a`` by the α-β model, from two summaries
    (``compute_s_per_step``, ``messages_per_step``, ``wire_bytes_per_step``); None if never/always."""
    extra_time = (b["compute_s_per_step"] - a["compute_s_per_step"]
                  + (b["messages_per_step"] - a["messages_per_step"]) * latency_s)
    saved_bits = 8 * (a["wire_bytes_per_step"] - b["wire_bytes_per_step"])
    if saved_bits <= 0 or extra_time <= 0:
        return None
    return saved_bits / extra_time / 1e9


def ring_busiest_bytes(numel: int, element_size: int, world_size: int) -> int:
    """Bytes the busiest rank sends in our ring all-reduce of ``numel`` elements (exact)."""
    return max(comm.ring_bytes_sent(numel, element_size, world_size, r) for r in range(world_size))


def all_gather_break_even(payload_bytes: int, numel: int, element_size: int = 4) -> int:
    """The smallest N at which an all-gather of ``payload_bytes`` per rank sends at least as much as
    the uncompressed ring all-reduce of ``numel`` elements (busiest rank, chunk rounding included):
    (N−1)·P against 2(N−1)/N·eS, so N = 2eS/P.
    """
    n = max(2, int(2 * element_size * numel / payload_bytes) - 1)  # just below where they meet
    while (n - 1) * payload_bytes < ring_busiest_bytes(numel, element_size, n):
        n += 1
    return n
