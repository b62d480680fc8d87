"""The ZeRO milestone (chapter 4): its ``Config``, one rank's training (:func:`worker`: shard, train,
measure) and the summary against the memory and traffic formulas.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ... import comm
from ...config import TrainConfig, opt
from ...costmodel import zero_memory, zero_traffic
from ...data import batch_indices, shard, teacher_classification
from ...metrics import (
    ActivationMeter,
    StepRecorder,
    counters,
    device_memory,
    optimizer_tensors,
    per_rank_summary,
    storage_bytes,
)
from ...models import mlp, mlp_param_count
from ...peakmem import PeakMemory
from ...runtime import context
from .layerwise import PieceOptimizer, layouts, norm_traffic
from .shards import Flat, Transients, fetch_layer_by_layer, scatter_during_backward, sharded_step

NAME = "zero"


@dataclass
class Config(TrainConfig):
    # laptop: chapter 4's 4-layer MLP of 200k parameters, 8 steps. memory: 15.8M parameters in 17
    # layers on 2 ranks, so that the model states (253 MB per rank in fp32 Adam at stage 0) dominate
    # the measured peak and one layer (4 MB) is small beside them.
    PRESETS = {"laptop": {"steps": 8, "global_batch": 64, "hidden": 256, "depth": 3},
               "tiny": {"steps": 4, "global_batch": 24, "hidden": 48, "depth": 2, "samples": 512},
               "memory": {"steps": 2, "global_batch": 16, "hidden": 1024, "depth": 16, "samples": 256,
                          "world_size": 2, "return_params": False, "peak_memory": True}}

    stage: int = opt(0, "0 plain data parallel | 1 shard optimizer state | 2 + gradients | 3 + parameters")
    precision: str = opt("fp32", "fp32 | mixed (bf16 params and grads, fp32 master and Adam: K=12)")
    lr: float = opt(0.01, "learning rate")
    optimizer: str = opt("adam", "adam | lamb | lars (layer-wise: their layer norms are all-reduced "
                                 "from the shards, chapter 5)")
    weight_decay: float = opt(0.0, "lamb/lars weight decay of the weight matrices (biases excluded)")
    return_params: bool = opt(True, "send the trained parameters back for checking (off for large models)")
    peak_memory: bool = opt(False, "measure each rank's peak of allocated bytes (lesson_lib.peakmem); on "
                                   "CPU its profiler slows each step, so runs timed for figures skip it")
    prefetch: int = opt(0, "stage 3: gather this many next layers' parameters during a layer's forward, on a "
                           "communication thread (0: each layer just before its use)")
    link_gbps: float = opt(0.0, "emulated link for every collective, Gbit/s (0: the real link; "
                                "comm.set_link)")
    timeline: bool = opt(False, "stage 3: record the last step's forward, layer by layer: gathers, compute, "
                                "waits (chapter 4's prefetch timeline)")
    bucket_mb: float = opt(0.0, "stage 2: 0 scatter the gradients after the backward | > 0 in buckets of "
                                "this many MiB during the backward, each freed once scattered (as ZeRO-2)")

    def validate(self) -> "Config":
        super().validate()
        if isinstance(self.stage, bool) or self.stage not in (0, 1, 2, 3):
            raise ValueError(f"stage must be 0, 1, 2 or 3, got {self.stage!r}")
        if self.optimizer not in ("adam", "lamb", "lars"):
            raise ValueError(f"optimizer must be 'adam', 'lamb' or 'lars', got {self.optimizer!r}")
        if not (isinstance(self.weight_decay, (int, float)) and 0 <= self.weight_decay < 1):
            raise ValueError(f"weight_decay must be in [0, 1), got {self.weight_decay!r}")
        if isinstance(self.bucket_mb, bool) or not isinstance(self.bucket_mb, (int, float)) \
                or not 0 <= self.bucket_mb < 1e6:
            raise ValueError(f"bucket_mb must be a number of MiB >= 0, got {self.bucket_mb!r}")
        if self.bucket_mb and self.stage != 2:
            raise ValueError(f"bucket_mb={self.bucket_mb} applies to stage 2 only (stage={self.stage}): "
                             "stage 3 already scatters layer by layer")
        if isinstance(self.prefetch, bool) or not isinstance(self.prefetch, int) or self.prefetch < 0:
            raise ValueError(f"prefetch must be a number of layers >= 0, got {self.prefetch!r}")
        if self.prefetch and self.stage != 3:
            raise ValueError(f"prefetch={self.prefetch} applies to stage 3 only (stage={self.stage})")
        if isinstance(self.link_gbps, bool) or not isinstance(self.link_gbps, (int, float)) \
                or not 0 <= self.link_gbps < float("inf"):
            raise ValueError(f"link_gbps must be a number of Gbit/s >= 0, got {self.link_gbps!r}")
        if self.timeline and self.stage != 3:
            raise ValueError(f"timeline applies to stage 3 only (stage={self.stage})")
        if self.precision not in ("fp32", "mixed"):
            raise ValueError(f"precision must be 'fp32' or 'mixed', got {self.precision!r}")
        if self.global_batch % self.world_size:
            raise ValueError(f"global_batch={self.global_batch} must divide evenly over "
                             f"world_size={self.world_size} ranks")
        if param_count(self) < self.world_size:
            raise ValueError(f"world_size={self.world_size} is more ranks than the {param_count(self)} "
                             "parameters to shard")
        return self


def param_count(cfg: TrainConfig) -> int:
    return mlp_param_count(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes)


def worker(cfg: Config) -> dict:
    counters().reset()
    comm.set_link(cfg.link_gbps or None)
    try:
        if not cfg.peak_memory:
            return _train(cfg, None)
        # The allocator's own count (a measurement), from before the model exists to the last step.
        with PeakMemory(context().device) as peak:
            out = _train(cfg, peak)
        out["per_rank"]["memory"].update(peak.as_dict())
        return out
    finally:
        comm.set_link(None)  # warm workers serve other chapters next


def _train(cfg: Config, peak: PeakMemory | None) -> dict:
    ctx = context()
    r, n, dev, stage = ctx.rank, ctx.world_size, ctx.device, cfg.stage
    mixed = cfg.precision == "mixed"
    dtype = torch.bfloat16 if mixed else torch.float32
    model = mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed).to(dev, dtype)
    layers = [m for m in model if isinstance(m, torch.nn.Linear)]
    # Every stage shards layer by layer, so every stage adds the gradients in the same order.
    units = [Flat(list(m.parameters()), n, r) for m in layers]
    transient = Transients()
    overlap = ahead = timeline = None  # the threads of stage 2 with buckets and stage 3 with prefetch
    # --- the model states this rank keeps between steps
    if stage == 3:
        for u in units:
            u.shard = u.full[u.lo:u.hi].clone()
            u.free()
        timeline = [] if cfg.timeline else None
        ahead = fetch_layer_by_layer(units, layers, n, transient, cfg.prefetch, peak, timeline)
    if stage == 2 and cfg.bucket_mb > 0:
        overlap = scatter_during_backward(units, layers, n, int(cfg.bucket_mb * 2**20), transient, peak)
    owned = [u.full if stage == 0 else (u.shard if stage == 3 else u.full[u.lo:u.hi]) for u in units]
    masters = [o.float().clone() if mixed else o for o in owned]  # Adam updates these (fp32)
    for u in units:
        u.grad_shard = torch.zeros(u.hi - u.lo, dtype=dtype, device=dev) if stage >= 2 else None
        if stage < 2:  # the full gradient stays allocated between steps
            u.new_grad()
    if cfg.optimizer == "adam":
        optimizer = torch.optim.Adam(masters, lr=cfg.lr)
    else:  # chapter 5: per-layer norms over the shards
        spans = [(0, u.padded) if stage == 0 else (u.lo, u.hi) for u in units]
        optimizer = PieceOptimizer(cfg.optimizer, masters, spans, layouts(units),
                                             cfg.lr, cfg.weight_decay, sharded=stage > 0)
    x_all, y_all = teacher_classification(cfg.samples, cfg.d_in, cfg.classes)
    x_all, y_all = x_all.to(dev, dtype), y_all.to(dev)
    meter, rec = ActivationMeter(exclude=model.parameters()), StepRecorder(dev, ctx.emit)
    losses = []
    if peak is not None:  # the measured peak is the steps': the model states are alive from here on
        peak.reset_peak()
    try:
        for step in range(cfg.steps):
            idx = shard(batch_indices(cfg.samples, cfg.global_batch, step, cfg.seed), r, n)
            if timeline is not None:
                timeline.clear()  # the last step's forward is kept
            with rec.step(step) as rs:
                for u in units if stage < 3 and overlap is None else ():
                    if stage == 2:  # built during backward, freed once scattered (a transient)
                        u.new_grad(transient)
                    else:
                        u.full_grad.zero_()
                with meter.measure():
                    loss = F.cross_entropy(model(x_all[idx]).float(), y_all[idx])
                if overlap is not None:
                    overlap.start()
                loss.backward()  # stage 3: the hooks gather, free and reduce-scatter layer by layer
                if overlap is not None:
                    overlap.wait()  # stage 2 with buckets: scattered during the backward
                sharded_step(units, masters, owned, optimizer, stage, n, mixed, transient,
                             scattered=overlap is not None)
                lt = loss.detach().reshape(1)
                comm.ring_all_reduce(lt, op="loss_all_reduce")
                rs["loss"] = float(lt) / n
            losses.append(rs["loss"])
    finally:
        for background in (overlap, ahead):
            if background is not None:
                background.close()
    if peak is not None:
        peak.stop()  # what follows (the inventory, a final gather for checking) is not training
    params_kept = [u.shard if stage == 3 else u.full for u in units]
    grads_kept = [u.grad_shard if stage >= 2 else u.full_grad for u in units]
    memory = {"params": storage_bytes(params_kept), "grads": storage_bytes(grads_kept),
              "optimizer": storage_bytes(optimizer_tensors(optimizer) + (masters if mixed else [])),
              "activations": meter.peak, "buffers": transient.peak + counters().scratch_peak,
              **device_memory(dev)}
    final = []
    for u in units if cfg.return_params else ():  # stage 3: gather them for checking (not training)
        if stage == 3:
            u.gather(op="final_check_gather")
        final += u.full[: u.numel].float().tolist()
    return {"losses": losses, "params": final, "padded": sum(u.padded for u in units),
            "layer_bytes": [u.padded * u.full.element_size() for u in units],
            "grads_peak": transient.grads_peak, "params_peak": transient.params_peak,
            "timeline": sorted(timeline or [], key=lambda e: e["start"]),
            "per_rank": per_rank_summary(r, rec, memory)}


def summarize(cfg: Config, outs: list[dict]) -> dict:
    psi, n = param_count(cfg), cfg.world_size
    formula = zero_memory(psi, n, cfg.stage, cfg.precision)
    esize = 2 if cfg.precision == "mixed" else 4
    training_ops = ("grad_reduce_scatter", "grad_all_gather", "param_all_gather")
    traffic = [sum(v["bytes_sent"] for k, v in o["per_rank"]["ops"].items() if k in training_ops)
               / cfg.steps for o in outs]
    padded = outs[0]["padded"]  # per layer in stage 3, for the whole model otherwise
    # LAMB/LARS at stages 1-3: two scalar ring all-reduces per parameter tensor per step
    norms = [o["per_rank"]["ops"].get("norm_all_reduce", {}).get("bytes_sent", 0) / cfg.steps for o in outs]
    tensors = 2 * (cfg.depth + 1)  # a weight and a bias per linear layer
    norm_formula = [norm_traffic(tensors, n, r) if cfg.optimizer != "adam" and cfg.stage > 0
                    else 0 for r in range(n)]
    return {"param_count": psi, "padded_param_count": padded, "formula": formula,
            "traffic_per_step": traffic, "traffic_formula": zero_traffic(psi, n, cfg.stage, esize),
            "traffic_formula_padded": zero_traffic(padded, n, cfg.stage, esize),
            "norm_traffic_per_step": norms, "norm_traffic_formula": norm_formula,
            "final_params": outs[0]["params"],
            # the most bytes of full (unsharded) gradients a rank held at once, and each layer's
            "full_grads_peak": [o["grads_peak"] for o in outs], "layer_bytes": outs[0]["layer_bytes"],
            # stage 3: the most bytes of gathered (full) parameters a rank had allocated at once
            "full_params_peak": [o["params_peak"] for o in outs],
            # timeline: rank 0's last forward, spans in seconds from its first
            "timeline": [{**e, "start": e["start"] - t0, "end": e["end"] - t0} for e in outs[0]["timeline"]
                         for t0 in [outs[0]["timeline"][0]["start"]]]}

