"""Large-batch training (chapter 5): the same samples in fewer, larger steps — SGD, Adam, LARS, LAMB.

Data parallelism as in chapter 0 with a budget of ``epochs`` passes, so a bigger ``global_batch``
means fewer steps. Linear warm-up over ``warmup_steps`` (Goyal et al., 2017), then cosine decay.
Options: held-out evaluation every ``eval_every`` epochs, McCandlish et al. (2018)'s noise scale
(:func:`noise_scale`), ``accumulate`` micro-batches (:mod:`.accumulation`), ``peak_memory``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import comm, optim
from ..config import TrainConfig, opt
from ..data import batch_indices, shard, subspace_teacher
from ..metrics import StepRecorder, counters, memory_report, per_rank_summary
from ..models import flat_views, mlp
from ..peakmem import PeakMemory
from ..runtime import context
from .accumulation import accumulate, validate_accumulate

NAME = "large-batch"


@dataclass
class Config(TrainConfig):
    # laptop: a 6-layer, 91k-parameter MLP, 8 epochs on 2 ranks (quick runs). long: the chapter's
    # 48-epoch experiment, where LAMB at 32·B₀ (192 steps) matches B₀ (6,144 steps).
    PRESETS = {"laptop": {"world_size": 2, "samples": 8192, "eval_samples": 2048, "epochs": 8,
                          "hidden": 128, "depth": 6},
               "long": {"world_size": 2, "samples": 8192, "eval_samples": 2048, "epochs": 48,
                        "eval_every": 8, "hidden": 128, "depth": 6},
               "tiny": {"samples": 512, "eval_samples": 128, "epochs": 2, "hidden": 16, "depth": 3,
                        "global_batch": 64},
               # §7's gradient accumulation: the laptop task at B = 2,048, one epoch (4 steps, no evaluation
               # inside the measured peak; ch05_accumulate)
               "accumulate": {"world_size": 2, "samples": 8192, "eval_samples": 2048, "epochs": 1,
                              "hidden": 128, "depth": 6, "global_batch": 2048, "optimizer": "sgd",
                              "lr": 0.2, "peak_memory": True}}

    optimizer: str = opt("lamb", "sgd (with momentum 0.9) | adam (AdamW) | lars | lamb")
    epochs: int = opt(8, "passes over the training set (the budget of samples: fixed as the batch grows)")
    warmup_steps: int = opt(0, "steps of linear learning-rate warm-up before the cosine decay")
    weight_decay: float = opt(0.0, "weight decay of the weight matrices (biases are excluded)")
    adapt_biases: bool = opt(False, "lars/lamb: give each bias its own trust ratio (default: ratio 1)")
    eval_samples: int = opt(2048, "held-out samples, evaluated every eval_every epochs")
    eval_every: int = opt(1, "epochs between evaluations of the held-out set (and the last epoch)")
    noise_scale: bool = opt(False, "at each evaluation also measure B_simple = tr(Σ)/|G|² (training set)")
    accumulate: int = opt(1, "micro-batches per step: each rank's share of the batch in this many "
                             "forward/backward passes, then one all-reduce (gradient accumulation)")
    peak_memory: bool = opt(False, "measure each rank's peak of allocated bytes from the first step to "
                                   "the end of the last (lesson_lib.peakmem)")
    # The task (chapter 5's defaults differ from the shared ones: a deeper MLP on a harder set).
    hidden: int = opt(128, "width of the hidden layers")
    depth: int = opt(6, "number of hidden layers")
    d_in: int = opt(64, "input features")
    samples: int = opt(8192, "size of the training set")
    global_batch: int = opt(32, "samples per step summed over all ranks")
    lr: float = opt(5e-3, "peak learning rate (after warm-up) — scale it with the batch yourself")
    steps: int = opt(0, "derived: epochs × (samples // global_batch)", cli=False)

    def validate(self) -> "Config":
        for name in ("epochs", "global_batch", "samples", "eval_samples", "eval_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if self.global_batch > self.samples:
            raise ValueError(f"global_batch={self.global_batch} is larger than the data set "
                             f"(samples={self.samples})")
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) \
                or self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an int >= 0, got {self.warmup_steps!r}")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a positive finite number, got {self.lr!r}")
        if not (isinstance(self.weight_decay, (int, float)) and 0 <= self.weight_decay < 1):
            raise ValueError(f"weight_decay must be in [0, 1), got {self.weight_decay!r}")
        for name in ("noise_scale", "adapt_biases", "peak_memory"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.adapt_biases and self.optimizer not in ("lars", "lamb"):
            raise ValueError(f"adapt_biases is for lars and lamb, not optimizer={self.optimizer!r}")
        if self.optimizer not in optim.OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {', '.join(optim.OPTIMIZERS)}, "
                             f"got {self.optimizer!r}")
        self.steps = self.epochs * (self.samples // self.global_batch)
        super().validate()
        if self.global_batch % self.world_size:
            raise ValueError(f"global_batch={self.global_batch} must divide evenly over "
                             f"world_size={self.world_size} ranks")
        validate_accumulate(self.accumulate, self.global_batch // self.world_size)
        return self

    @property
    def steps_per_epoch(self) -> int:
        return self.samples // self.global_batch


# Rates tuned once at B₀ = 64, then only scaled: linear rule for SGD and LARS (Goyal et al., 2017;
# You, Gitman & Ginsburg, 2017), square root for Adam and LAMB (You et al., 2020). LARS adapts its
# biases too: excluded, they moved by the scaled global rate and the run collapsed at 32·B₀.
BASE_BATCH = 64
BASE_LR = {"sgd": 0.1, "adam": 2e-3, "lars": 1.0, "lamb": 5e-3}
RULE = {"sgd": "linear", "adam": "sqrt", "lars": "linear", "lamb": "sqrt"}
WEIGHT_DECAY = {"sgd": 0.0, "adam": 0.0, "lars": 5e-4, "lamb": 5e-4}
ADAPT_BIASES = {"lars": True}  # LAMB keeps the papers' bias exclusion


def scaled_lr(optimizer: str, batch: int, base_batch: int = BASE_BATCH) -> float:
    """The base rate scaled by the optimizer's rule: ×k (linear) or ×√k (square root), k = B/B₀."""
    k = batch / base_batch
    return BASE_LR[optimizer] * (k if RULE[optimizer] == "linear" else math.sqrt(k))


def at_batch(optimizer: str = "lamb", batch: int = BASE_BATCH, preset: str = "laptop", **options) -> Config:
    """The preset at ``batch`` with the rate scaled by the rule and a warm-up of a tenth of the steps."""
    base = {"optimizer": optimizer, "global_batch": batch,
            "lr": scaled_lr(optimizer, batch) if optimizer in BASE_LR else 1.0,
            "weight_decay": WEIGHT_DECAY.get(optimizer, 0.0),
            "adapt_biases": ADAPT_BIASES.get(optimizer, False), **options}
    cfg = Config.from_preset(preset, **base)
    if "warmup_steps" not in options:
        cfg = cfg.replace(warmup_steps=max(1, cfg.steps // 10))
    return cfg


def lr_at(cfg: Config, step: int) -> float:
    """Linear warm-up to ``cfg.lr`` over ``warmup_steps``, then cosine decay to 0 at the end."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    rest = max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * (step - cfg.warmup_steps) / rest))


def evaluate(model, x, y) -> tuple[float, float]:
    with torch.no_grad():
        out = model(x)
        return float(F.cross_entropy(out, y)), float((out.argmax(1) == y).float().mean())


def noise_scale(model, x, y, rank: int = 0, world_size: int = 1, chunk: int = 2048) -> dict:
    """The simple noise scale B_simple = tr(Σ)/|G|² of McCandlish et al. (2018, eq. 2.8) on ``x, y``.

    On a finite set tr(Σ) = mean |g_i|² − |G|²; per-example gradient norms come from each linear
    layer's (|a_i|² + 1)·|δ_i|² (Goodfellow, 2015), without per-example weight copies. Each rank
    takes its shard; one all-reduce adds the sums.
    """
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    if sum(p.numel() for m in linears for p in m.parameters()) != sum(p.numel() for p in model.parameters()):
        raise ValueError("noise_scale needs a Sequential whose parameters all sit in nn.Linear layers")
    mine = shard(torch.arange(len(x), device=x.device), rank, world_size)
    sums = torch.zeros(sum(p.numel() for p in model.parameters()) + 1, dtype=torch.float64, device=x.device)
    for start in range(0, len(mine), chunk):
        idx = mine[start:start + chunk]
        h, inputs, outputs = x[idx], [], []
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                inputs.append(h)
            h = layer(h)
            if isinstance(layer, torch.nn.Linear):
                outputs.append(h)
        deltas = torch.autograd.grad(F.cross_entropy(h, y[idx], reduction="sum"), outputs)
        parts = []
        for a, d in zip(inputs, deltas):
            a, d = a.detach().double(), d.double()
            parts += [(d.T @ a).reshape(-1), d.sum(0)]  # Σ_i g_i of W, then of b (parameters() order)
            sums[-1] += ((a.square().sum(1) + 1) * d.square().sum(1)).sum()
        sums[:-1] += torch.cat(parts)
    if world_size > 1:
        comm.all_reduce(sums, "ring", op="noise_scale_all_reduce")
    n = len(mine) * world_size
    g_sq = float(sums[:-1].div(n).square().sum())
    trace = float(sums[-1]) / n - g_sq
    return {"trace_sigma": trace, "grad_sq": g_sq, "b_simple": trace / g_sq if g_sq > 0 else math.inf}


def train(cfg: Config, rank: int, world_size: int, device: torch.device, emit=None,
          peak: PeakMemory | None = None) -> dict:
    """The loop; with ``world_size == 1`` and no process group it is the single-process reference."""
    x_all, y_all = subspace_teacher(cfg.samples + cfg.eval_samples, cfg.d_in, classes=cfg.classes)
    x_all, y_all = x_all.to(device), y_all.to(device)
    x_eval, y_eval = x_all[cfg.samples:], y_all[cfg.samples:]
    model = mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed).to(device)
    _, bucket = flat_views(model)
    message = torch.zeros(bucket.numel() + 1, device=device)  # the gradients and the loss
    optimizer = optim.make(cfg.optimizer, model, cfg.lr, cfg.weight_decay, adapt_biases=cfg.adapt_biases)
    # last_stats lists the parameters in param-group order; the heat map shows the weight matrices
    adapted = [i for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"]) if p.ndim > 1]
    rec = StepRecorder(device, emit)
    losses, evals, trust = [], [], []
    if peak is not None:  # what is alive now counts in the steps' peak
        peak.reset_peak()
    for step in range(cfg.steps):
        idx = shard(batch_indices(cfg.samples, cfg.global_batch, step, cfg.seed), rank, world_size)
        with rec.step(step) as r:
            for group in optimizer.param_groups:
                group["lr"] = lr_at(cfg, step)
            optimizer.zero_grad(set_to_none=False)
            loss = accumulate(model, x_all, y_all, idx, cfg.accumulate).reshape(1)  # no communication
            if world_size > 1:  # chapter 0's step: sum the gradients, divide by the ranks
                message[:-1].copy_(bucket)  # the loss rides in the same all-reduce:
                message[-1:].copy_(loss)  # one per step (B₀'s small steps are latency-bound)
                comm.all_reduce(message, "ring", op="grad_all_reduce")
                message.div_(world_size)
                bucket.copy_(message[:-1])
                loss = message[-1:]
            optimizer.step()
            r.update(loss=float(loss), lr=lr_at(cfg, step), samples=(step + 1) * cfg.global_batch)
        losses.append(r["loss"])
        if peak is not None and step == cfg.steps - 1:
            peak.stop()  # before the last evaluation
        if rank == 0 and isinstance(optimizer, (optim.LARS, optim.LAMB)):
            trust.append([optimizer.last_stats[i][2] for i in adapted])
        if not math.isfinite(r["loss"]):  # every rank sees the same all-reduced loss: all stop
            break
        epoch, end_of_epoch = divmod(step + 1, cfg.steps_per_epoch)
        if end_of_epoch == 0 and (epoch % cfg.eval_every == 0 or epoch == cfg.epochs):
            ev_loss, ev_acc = evaluate(model, x_eval, y_eval)
            evals.append({"epoch": epoch, "step": step + 1, "eval_loss": ev_loss, "eval_accuracy": ev_acc})
            if cfg.noise_scale:
                evals[-1].update(noise_scale(model, x_all[:cfg.samples], y_all[:cfg.samples], rank,
                                             world_size))
            if emit is not None and rank == 0:
                emit("eval", **evals[-1])
    train_loss, train_acc = evaluate(model, x_all[:cfg.samples], y_all[:cfg.samples])
    memory = memory_report(model, optimizer, 0, device=device)
    return {"losses": losses, "evals": evals, "trust_ratios": trust, "train_loss": train_loss,
            "train_accuracy": train_acc, "param_count": bucket.numel(),
            "per_rank": per_rank_summary(rank, rec, memory)}


def worker(cfg: Config) -> dict:
    ctx = context()
    counters().reset()
    if not cfg.peak_memory:
        return train(cfg, ctx.rank, ctx.world_size, ctx.device, emit=ctx.emit)
    with PeakMemory(ctx.device) as peak:  # the allocator's count: a measurement
        out = train(cfg, ctx.rank, ctx.world_size, ctx.device, emit=ctx.emit, peak=peak)
    out["per_rank"]["memory"].update(peak.as_dict())
    return out


def reference(cfg: Config) -> dict:
    """Single-process training on the whole global batch, in this process: what N ranks must equal."""
    return train(cfg.replace(world_size=1), 0, 1, torch.device("cpu"))


def summarize(cfg: Config, outs: list[dict]) -> dict:
    out = outs[0]
    diverged = len(out["losses"]) < cfg.steps or not math.isfinite(out["losses"][-1])
    last = out["evals"][-1] if out["evals"] and not diverged else {}
    grad_sent = max(o["per_rank"]["ops"].get("grad_all_reduce", {}).get("bytes_sent", 0) for o in outs)
    epochs_run = len(out["losses"]) / cfg.steps_per_epoch
    psi = out["param_count"]
    return {
        "eval_loss": last.get("eval_loss", float("nan")),
        "eval_accuracy": last.get("eval_accuracy", float("nan")),
        "train_loss": out["train_loss"], "train_accuracy": out["train_accuracy"],
        "diverged": diverged, "steps": len(out["losses"]), "steps_per_epoch": cfg.steps_per_epoch,
        "evals": out["evals"], "trust_ratios": out["trust_ratios"], "param_count": psi,
        "grad_bytes_per_epoch": grad_sent / epochs_run if epochs_run else 0.0,
        "grad_bytes_per_step": grad_sent / len(out["losses"]) if out["losses"] else 0.0,
        # exact: one ring all-reduce of the Ψ float32 gradients and the loss per step, busiest rank
        "grad_bytes_per_epoch_formula": cfg.steps_per_epoch * max(
            comm.ring_bytes_sent(psi + 1, 4, cfg.world_size, r) for r in range(cfg.world_size)),
    }
