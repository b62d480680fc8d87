"""Pipeline parallelism (chapter 3): cut the model's layers into P stages, one stage per rank.

Like an assembly line, stage k owns a run of consecutive layers; activations flow forward from
stage k to k+1 and gradients flow back, point-to-point (:mod:`.pp_comm`). Splitting the batch
into M micro-batches lets stage k work on micro-batch i+1 while stage k+1 works on i, so most
stages are busy most of the time; what is left idle is the *bubble*, (P−1)/(M+P−1) of each stage's
time with equal stages. Schedules (who does which forward and backward when) are pure functions in
:mod:`.pp_schedules`: naive, GPipe (Huang et al., 2019) and 1F1B (Narayanan et al., 2021).

The model is :func:`lesson_lib.models.mlp`; a *layer* here is one ``Linear`` together with the
``ReLU`` after it, so the model has ``depth + 1`` layers to cut. Stages are balanced by parameter
count or by measured forward+backward time per layer. Each micro-batch's loss is scaled by 1/M, so
the gradients summed over micro-batches are the gradients of the whole batch's mean loss, and
training equals single-process SGD on the unsplit model (``reference``) up to float rounding.
Memory is measured: each micro-batch's saved activations (``ActivationMeter``) are live from its
forward until its backward finishes; the peak over the schedule is the stage's activation memory.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .. import comm
from ..config import TrainConfig, opt, positive_int
from ..data import batch_indices, teacher_classification
from ..metrics import ActivationMeter, StepRecorder, counters, memory_report, per_rank_summary, sync
from ..models import flat_views, mlp, mlp_param_count
from ..runtime import context
from .pp_comm import StageLink, Timeline
from .pp_schedules import (
    SCHEDULES,
    all_actions,
    bubble_breakdown,
    bubble_formula,
    message_delays,
    microbatches_run,
    partition,
    stage_actions,
    step_bubbles,
)

NAME = "pipeline"
BALANCES = ("params", "time")

# A compute-dominated model for measuring the bubble against its formula (chapter 3, ``python -m
# lesson_lib bench bubble``): 16 hidden layers of width 1024, which 2 stages cut 8 + 8, between a
# thin first layer and a thin head. With a full-width first layer (d_in = hidden) stage 0 is lighter
# in its backwards (its first layer computes no input gradient): on the earlier preset (8 layers,
# 512 samples) 12 % lighter, which alone put the replayed bubble 25-38 % above the formula at M = 8.
# 128-256 samples per micro-batch make one forward take several milliseconds and a message (0.5-1 MB)
# a small fraction of one. What each message costs beyond its bytes (a core for Gloo's I/O thread
# and the link's threads while both stages compute) does not grow with the work per micro-batch:
# on the earlier preset the wall-clock bubble at M = 8 was 1.25-1.55x the formula, on this one
# 1.07-1.21x (bench bubble, quiet 2-core machine, 2 runs of 3).
BUBBLE_PRESET = {"steps": 6, "global_batch": 1024, "hidden": 1024, "d_in": 32, "depth": 17, "samples": 4096}


@dataclass
class Config(TrainConfig):
    world_size: int = opt(0, "derived: = stages, one rank per stage (leave unset)")
    stages: int = opt(2, "pipeline stages P, one rank each (1: the unsplit model on one rank)")
    microbatches: int = opt(4, "micro-batches M per step; must divide global_batch (naive ignores it)")
    schedule: str = opt("1f1b", "naive (whole batch, one stage busy at a time) | gpipe | 1f1b")
    balance: str = opt("params", "params | time: equal parameter counts or equal measured time per stage")
    depth: int = opt(3, "hidden layers; the model has depth + 1 layers (Linear + ReLU) to cut into stages")
    lr: float = opt(0.3, "SGD learning rate (momentum 0.9)")

    def __post_init__(self):
        if self.world_size == 0 and isinstance(self.stages, int) and not isinstance(self.stages, bool):
            self.world_size = self.stages

    def validate(self) -> "Config":
        positive_int(self, "stages")
        if self.world_size != self.stages:
            raise ValueError(f"world_size={self.world_size} must equal stages={self.stages} "
                             "(one rank per stage; leave world_size unset)")
        super().validate()
        positive_int(self, "microbatches")
        if self.global_batch % self.microbatches:
            raise ValueError(f"microbatches={self.microbatches} must divide global_batch="
                             f"{self.global_batch} into equal micro-batches")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.balance not in BALANCES:
            raise ValueError(f"balance must be one of {', '.join(BALANCES)}, got {self.balance!r}")
        if self.stages > self.layers:
            raise ValueError(f"stages={self.stages} is more than the {self.layers} layers of the model "
                             f"(depth + 1); use at most {self.layers} stages or a deeper model")
        return self

    def replace(self, **changes) -> "Config":
        if "stages" in changes and "world_size" not in changes:
            changes["world_size"] = changes["stages"]
        return super().replace(**changes)

    @property
    def layers(self) -> int:
        return self.depth + 1

    @property
    def m(self) -> int:
        """Micro-batches the schedule really runs (naive: 1, the whole batch)."""
        return microbatches_run(self.schedule, self.microbatches)


# --------------------------------------------------------------------------- the model, cut


def layer_units(model: nn.Sequential) -> list[list[nn.Module]]:
    """The model's layers as the pipeline counts them: each ``Linear`` with the ``ReLU`` after it."""
    units: list[list[nn.Module]] = []
    for m in model:
        if isinstance(m, nn.Linear):
            units.append([m])
        else:
            units[-1].append(m)
    return units


def model_layers(cfg: Config) -> list[list[nn.Module]]:
    """Every rank builds the whole model from the seed, so all agree on the initial weights."""
    return layer_units(mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed))


def build_stage(cfg: Config, lo: int, hi: int) -> nn.Sequential:
    """Layers [lo, hi) of the model; the others are freed on return."""
    return nn.Sequential(*[m for u in model_layers(cfg)[lo:hi] for m in u])


def param_costs(cfg: Config) -> list[float]:
    return [float(sum(p.numel() for m in u for p in m.parameters())) for u in model_layers(cfg)]


def time_costs(cfg: Config, device: torch.device, repeats: int = 5) -> list[float]:
    """Median seconds of one forward+backward of each layer on one micro-batch: busy (CPU) time,
    or synchronized wall time on a GPU."""
    clock = time.perf_counter if device.type == "cuda" else time.thread_time
    x = torch.randn(cfg.global_batch // cfg.m, cfg.d_in, generator=torch.Generator().manual_seed(0))
    x = x.to(device)
    costs = []
    for u in model_layers(cfg):
        layer, samples = nn.Sequential(*u).to(device), []
        for _ in range(repeats + 1):  # the first run pays one-off allocation costs
            xin = x.detach().requires_grad_(bool(costs))  # the first layer needs no input gradient
            sync(device)
            t0 = clock()
            out = layer(xin)
            out.sum().backward()
            sync(device)
            samples.append(clock() - t0)
        costs.append(statistics.median(samples[1:]))
        x = out.detach()
    return costs


def choose_partition(cfg: Config, rank: int, device: torch.device) -> tuple[list, list[float]]:
    """Layer bounds per stage and the per-layer costs they balance. By time: rank 0 measures and
    sends its costs to every stage, so that all stages cut the model the same way."""
    if cfg.balance == "params":
        return partition(param_costs(cfg), cfg.stages), param_costs(cfg)
    costs = torch.tensor(time_costs(cfg, device) if rank == 0 else [0.0] * cfg.layers, dtype=torch.float64,
                         device=device)
    for r in range(1, cfg.stages):
        if rank == 0:
            comm.send(costs, r, op="balance")
    if rank > 0:
        comm.recv(costs, 0, op="balance")
    return partition(costs.tolist(), cfg.stages), costs.tolist()


# --------------------------------------------------------------------------- one stage, training


def train_stage(cfg: Config, k: int, device: torch.device, emit=None) -> dict:
    """Stage ``k``'s training loop: its actions in schedule order, every step."""
    P, M = cfg.stages, cfg.m
    bounds, costs = choose_partition(cfg, k, device)
    stage = build_stage(cfg, *bounds[k]).to(device)
    flat, grads = flat_views(stage)
    optimizer = torch.optim.SGD(stage.parameters(), lr=cfg.lr, momentum=0.9)
    first, last = k == 0, k == P - 1
    linears = [m for m in stage if isinstance(m, nn.Linear)]
    rows = cfg.global_batch // M
    x_all, y_all = teacher_classification(cfg.samples, cfg.d_in, cfg.classes)
    x_all, y_all = x_all.to(device), y_all.to(device)
    actions = stage_actions(cfg.schedule, P, M, k)
    tl = Timeline(k, device)
    # Receives are posted ahead so that a neighbour's message leaves as soon as it is computed; 1F1B,
    # whose point is to bound what a stage holds, gets two buffers ahead (earlier preset, quiet 2-core
    # machine, M = 8: 1.30-1.72x the formula over 10 runs, against 1.37-1.54x with all M posted at once).
    link = StageLink(k, P, M, (rows, linears[0].in_features), (rows, linears[-1].out_features), tl,
                     ahead=2 if cfg.schedule == "1f1b" else None)
    rec = StepRecorder(device, emit)
    losses, act_peak, per_mb, in_flight = [], 0, 0, 0
    try:
        for step in range(cfg.steps):
            tl.step = step
            idx = batch_indices(cfg.samples, cfg.global_batch, step, cfg.seed)
            mbs = [idx[i * rows:(i + 1) * rows] for i in range(M)]
            with rec.step(step) as r:
                grads.zero_()
                link.begin_step()
                held, live, loss_sum = {}, 0, 0.0
                for kind, i in actions:
                    if kind == "F":
                        x = x_all[mbs[i]] if first else link.recv_activation(i).requires_grad_()
                        meter = ActivationMeter(exclude=[flat])
                        with tl.event("forward", i), meter.measure():
                            out = stage(x)
                            if last:
                                out = F.cross_entropy(out, y_all[mbs[i]])
                        if last:
                            loss_sum += out.item()
                        else:
                            link.send_activation(out.detach(), i)
                        held[i] = (x, out, meter.peak)  # live until its backward: what 1F1B bounds
                        live, per_mb = live + meter.peak, meter.peak
                        act_peak, in_flight = max(act_peak, live), max(in_flight, len(held))
                    else:
                        x, out, nbytes = held.pop(i)
                        g = None if last else link.recv_grad(i)
                        with tl.event("backward", i):
                            if last:
                                (out / M).backward()  # mean over micro-batches = whole-batch mean
                            else:
                                out.backward(g)
                        live -= nbytes
                        if not first:
                            link.send_grad(x.grad, i)
                link.flush()
                optimizer.step()
                if last:
                    r["loss"] = loss_sum / M
            if last:
                losses.append(r["loss"])
            if emit is not None:
                emit("pp_events", step=step, events=tl.of_step(step))
    finally:
        link.close()
    memory = memory_report(stage, optimizer, act_peak, device=device)
    return {"losses": losses, "stage": k, "bounds": bounds, "costs": costs, "events": tl.events,
            "params": flat.detach().clone(), "grads": grads.clone(),
            "activation_peak": act_peak, "activation_per_microbatch": per_mb, "max_in_flight": in_flight,
            "per_rank": per_rank_summary(k, rec, memory)}


def worker(cfg: Config) -> dict:
    ctx = context()
    counters().reset()
    return train_stage(cfg, ctx.rank, ctx.device, ctx.emit)


# --------------------------------------------------------------------------- results


def summarize(cfg: Config, outs: list[dict]) -> dict:
    events = sorted((e for o in outs for e in o["events"]), key=lambda e: e["start"])
    measured = list(range(1, cfg.steps)) or [0]  # step 0 pays one-off costs
    actions = all_actions(cfg.schedule, cfg.stages, cfg.m)
    bubbles = [step_bubbles(actions, events, s) for s in range(cfg.steps)]
    causes = [bubble_breakdown(actions, events, s) for s in measured]
    B, H = cfg.global_batch, cfg.hidden
    return {
        "losses": outs[-1]["losses"], "events": events,
        "bubble_fraction": statistics.median(bubbles[s]["wall"] for s in measured),
        "bubble_busy": statistics.median(bubbles[s]["busy"] for s in measured),
        "bubble_formula": bubble_formula(cfg.stages, cfg.m), "bubble_per_step": bubbles,
        "bubble_breakdown": _median_breakdown(causes),
        "message_delays_s": sorted(d for s in measured for d in message_delays(events, s).values()),
        "microbatches_run": cfg.m, "partition": [list(b) for b in outs[0]["bounds"]],
        "layer_costs": outs[0]["costs"],
        "stage_memory": [{"stage": o["stage"], "layers": list(o["bounds"][o["stage"]]),
                          "param_bytes": o["per_rank"]["memory"]["params"],
                          "activation_peak": o["activation_peak"],
                          "activation_per_microbatch": o["activation_per_microbatch"],
                          "max_in_flight": o["max_in_flight"]} for o in outs],
        "unsplit_param_bytes": 4 * mlp_param_count(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes),
        # per step, each stage boundary carries the whole batch's activations one way, grads the other
        "bytes_per_step_formula": {"send_activation": 4 * B * H, "send_grad": 4 * B * H},
    }


def _median_breakdown(causes: list[dict]) -> dict:
    """Each rung of :func:`bubble_breakdown` and each per-stage share: its median over steps."""
    med = {k: statistics.median(c[k] for c in causes) for k in ("stages", "busy", "messages", "wall")}
    med["per_stage"] = [{"stage": s["stage"], **{k: statistics.median(c["per_stage"][i][k] for c in causes)
                                                 for k in ("off_core", "recv", "between")}}
                        for i, s in enumerate(causes[0]["per_stage"])]
    return med


def reference(cfg: Config) -> dict:
    """Single-process SGD (momentum 0.9) of the unsplit model on the whole batch, no process group:
    ``losses`` per step (those of ``data_parallel.reference(cfg, "sgd")``), the final ``params``
    and the last step's ``grads`` (flat, in layer order)."""
    model = mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed)
    flat, grads = flat_views(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    x_all, y_all = teacher_classification(cfg.samples, cfg.d_in, cfg.classes)
    losses = []
    for step in range(cfg.steps):
        idx = batch_indices(cfg.samples, cfg.global_batch, step, cfg.seed)
        grads.zero_()
        loss = F.cross_entropy(model(x_all[idx]), y_all[idx])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return {"losses": losses, "params": flat.detach().clone(), "grads": grads.clone()}


def state(outs: list[dict]) -> dict:
    """The pipeline's losses, final parameters and last gradients, stages joined in layer order."""
    return {"losses": outs[-1]["losses"], "params": torch.cat([o["params"] for o in outs]),
            "grads": torch.cat([o["grads"] for o in outs])}


def gaps(a: dict, b: dict) -> dict:
    """Largest absolute differences of losses, parameters and gradients between two runs."""
    return {"losses": max(abs(x - y) for x, y in zip(a["losses"], b["losses"], strict=True)),
            "params": (a["params"] - b["params"]).abs().max().item(),
            "grads": (a["grads"] - b["grads"]).abs().max().item()}


def verify(cfg: Config, cluster) -> dict:
    """Run the pipeline on ``cluster`` and compare it with :func:`reference` (``gaps``)."""
    cfg.validate()
    return gaps(state(cluster.run(worker, cfg)), reference(cfg))
