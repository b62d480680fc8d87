"""ZeRO (chapter 4): stop storing everything everywhere (Rajbhandari et al., SC 2020).

Data-parallel Adam where each of N ranks keeps only its 1/N share of the model states:
stage 1 shards the optimizer state, stage 2 also the gradients, stage 3 also the parameters.

How we shard: each layer's parameters live in one flat buffer, padded to a multiple of N; rank r
owns the contiguous slice r of every layer (``chunk_bounds``), like PyTorch's FSDP units. Every
collective is our ring over point-to-point (``comm.ring_reduce_scatter`` / ``comm.ring_all_gather``),
so traffic is counted exactly and the sums happen in the same order at every stage — the stages
agree bit for bit.

Per step, per rank (Ψ parameters):
* stage 0: reduce-scatter + all-gather the gradients (an all-reduce), full Adam step   — 2Ψ
* stage 1: reduce-scatter the gradients, Adam on my shard, all-gather the parameters   — 2Ψ
* stage 2: as stage 1, but only my gradient shard outlives the step                    — 2Ψ
* stage 3: before each layer's forward, all-gather its parameters and free them after;
  gather them again before its backward; reduce-scatter its gradient as soon as it is
  complete and free both; Adam on my shard                                              — 3Ψ
So a stage-3 rank holds one layer's full parameters and gradient at a time (module hooks do it).
Stage 2 builds the whole gradient before scattering it, unless ``bucket_mb > 0``: then, as in real
ZeRO-2, layers' gradients are grouped into buckets reduce-scattered during the backward on a
communication thread and freed, and a layer's gradient is allocated only once the gradients not yet
scattered fit in one bucket — so at most one bucket plus one layer of full gradients exist at a
time (:func:`scatter_during_backward`). Mixed precision keeps bf16 parameters and gradients (CPU
has no fast fp16) and an fp32 master copy with Adam's moments: K = 12 bytes per parameter.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import buckets, comm, optim
from ..config import TrainConfig, opt
from ..costmodel import zero_memory, zero_traffic
from ..data import batch_indices, shard, teacher_classification
from ..metrics import (
    ActivationMeter,
    StepRecorder,
    counters,
    device_memory,
    optimizer_tensors,
    per_rank_summary,
    storage_bytes,
)
from ..models import mlp, mlp_param_count
from ..runtime import context
from . import zero_layerwise as layerwise

NAME = "zero"


@dataclass
class Config(TrainConfig):
    stage: int = opt(0, "0 plain data parallel | 1 shard optimizer state | 2 + gradients | 3 + parameters")
    precision: str = opt("fp32", "fp32 | mixed (bf16 params and grads, fp32 master and Adam: K=12)")
    lr: float = opt(0.01, "learning rate")
    optimizer: str = opt("adam", "adam | lamb | lars (layer-wise: their layer norms are all-reduced "
                                 "from the shards, chapter 5)")
    weight_decay: float = opt(0.0, "lamb/lars weight decay of the weight matrices (biases excluded)")
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


class Flat:
    """One layer's parameters made views of one flat buffer, padded to a multiple of N, that can
    be freed and refilled; rank r owns slice r."""

    def __init__(self, params: list, n: int, rank: int):
        self.params = params
        self.numel = sum(p.numel() for p in params)
        self.padded = -(-self.numel // n) * n
        self.lo, self.hi = comm.chunk_bounds(self.padded, n)[rank]
        self.full = torch.zeros(self.padded, dtype=params[0].dtype, device=params[0].device)
        offset = 0
        for p in params:
            self.full[offset:offset + p.numel()].copy_(p.detach().view(-1))
            p.data = self.full[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        self.shard: torch.Tensor | None = None  # stage 3: the only parameters a rank keeps
        self.grad_shard: torch.Tensor | None = None  # stages 2-3: the only gradient kept
        self.bucket: torch.Tensor | None = None
        self.pending = 0

    def point_grads(self, bucket: torch.Tensor | None) -> None:
        offset = 0
        for p in self.params:
            p.grad = None if bucket is None else bucket[offset:offset + p.numel()].view_as(p)
            offset += p.numel()

    def new_grad(self, transient: "Transients | None" = None) -> None:
        """Allocate this layer's full gradient (zeros) and make the parameters' grads views of it."""
        self.bucket = torch.zeros(self.padded, dtype=self.full.dtype, device=self.full.device)
        if transient is not None:  # stages 2-3: it lives only until scattered
            transient.add(self.bucket.untyped_storage().nbytes(), grads=True)
        self.point_grads(self.bucket)

    def drop_grad(self, transient: "Transients") -> None:
        """Free the full gradient once this rank's shard of it is kept."""
        self.point_grads(None)
        transient.add(-self.bucket.untyped_storage().nbytes(), grads=True)
        self.bucket = None

    def free(self) -> None:  # the views stay valid; their storage is given back
        self.full.untyped_storage().resize_(0)

    def gather(self, op: str = "param_all_gather") -> None:
        self.full.untyped_storage().resize_(self.padded * self.full.element_size())
        self.full[self.lo:self.hi].copy_(self.shard)
        comm.ring_all_gather(self.full, op=op)


class Transients:
    """Live bytes of the buffers a rank allocates only for a moment, and their peak; also of the
    full (unsharded) gradients among them."""

    def __init__(self):
        self.live = self.peak = self.grads_live = self.grads_peak = 0
        self.params_peak = 0  # stage 3: most bytes of gathered (full) parameters allocated at once
        self.lock = threading.Lock()  # stage 2 with buckets frees them on the communication thread

    def add(self, nbytes: int, grads: bool = False) -> None:
        with self.lock:
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            if grads:
                self.grads_live += nbytes
                self.grads_peak = max(self.grads_peak, self.grads_live)


def fetch_layer_by_layer(units: list[Flat], modules: list, n: int, transient: Transients) -> None:
    """Stage 3: gather a layer's parameters just before its forward and again before its
    backward, free them right after; reduce-scatter its gradient as soon as it is complete."""
    warnings.filterwarnings("ignore", message="Full backward hook is firing")

    def gather(u):
        u.gather()
        transient.add(u.full.untyped_storage().nbytes())
        allocated = sum(v.full.untyped_storage().nbytes() for v in units)  # measured, not bookkept
        transient.params_peak = max(transient.params_peak, allocated)

    def free(u):
        transient.add(-u.full.untyped_storage().nbytes())
        u.free()

    def before_backward(u):
        gather(u)
        u.new_grad(transient)
        u.pending = len(u.params)

    def grad_ready(u):
        u.pending -= 1
        if u.pending:
            return
        u.grad_shard.copy_(comm.ring_reduce_scatter(u.bucket, op="grad_reduce_scatter")).div_(n)
        u.drop_grad(transient)
        free(u)

    for u, m in zip(units, modules):
        m.register_forward_pre_hook(lambda mod, args, u=u: gather(u))
        m.register_forward_hook(lambda mod, args, out, u=u: free(u))
        m.register_full_backward_pre_hook(lambda mod, grad, u=u: before_backward(u))
        for p in u.params:
            p.register_post_accumulate_grad_hook(lambda p, u=u: grad_ready(u))


def scatter_during_backward(units: list[Flat], modules: list, n: int, bucket_bytes: int,
                            transient: Transients) -> buckets.Overlap:
    """Stage 2 with buckets: reduce-scatter the gradients during the backward, a bucket at a time.

    Just before a layer's backward, wait until the gradients not yet scattered fit in one bucket,
    then allocate the layer's full gradient. When a bucket's layers are all written, the
    communication thread reduce-scatters them, keeps this rank's slice and frees the rest.
    """
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    plan = buckets.plan([u.padded * u.full.element_size() for u in units], bucket_bytes)

    def allocate(u):
        while transient.grads_live > bucket_bytes and overlap.wait_oldest():
            pass  # the backward waits for the network: the price of a bounded memory
        u.new_grad(transient)

    def reduce(i):  # on the communication thread
        for u in (units[j] for j in plan[i]):
            u.grad_shard.copy_(comm.ring_reduce_scatter(u.bucket, op="grad_reduce_scatter")).div_(n)
            u.drop_grad(transient)

    overlap = buckets.Overlap([[p for j in b for p in units[j].params] for b in plan], reduce)
    for u, m in zip(units, modules):
        m.register_full_backward_pre_hook(lambda mod, grad, u=u: allocate(u))
    return overlap


def sharded_step(units: list[Flat], masters: list, owned: list, optimizer, stage: int, n: int,
                 mixed: bool, transient: Transients, scattered: bool = False) -> None:
    """One ZeRO step after backward (shown in chapter 4): average the gradients, update, share.

    Stages 0-2: reduce-scatter each layer's gradient so rank r holds the sum of slice r; stage 0
    all-gathers it back (an all-reduce) and updates everything, stages 1-2 update only slice r
    and all-gather the parameters. Stage 3's gradients were scattered during backward, and so
    were stage 2's when it uses buckets (``scattered``).
    """
    grads = []
    for u in units if stage < 3 and not scattered else ():
        mine = comm.ring_reduce_scatter(u.bucket, op="grad_reduce_scatter").div_(n)
        if stage == 0:
            grads.append(comm.ring_all_gather(u.bucket, op="grad_all_gather"))
        elif stage == 1:
            grads.append(mine)
        else:
            u.grad_shard.copy_(mine)
            del mine
            u.drop_grad(transient)  # the full gradient buffer is freed here
    if stage >= 2:
        grads = [u.grad_shard for u in units]
    for m, g in zip(masters, grads):
        m.grad = g.float() if mixed else g
    if mixed:  # the fp32 copy of the gradients Adam reads
        transient.add(storage_bytes([m.grad for m in masters]))
        transient.add(-storage_bytes([m.grad for m in masters]))
    optimizer.step()
    for m, o in zip(masters, owned):
        m.grad = None
        if mixed:
            o.copy_(m)
    for u in units if stage in (1, 2) else ():
        comm.ring_all_gather(u.full, op="param_all_gather")


def worker(cfg: Config) -> dict:
    ctx = context()
    counters().reset()
    r, n, dev, stage = ctx.rank, ctx.world_size, ctx.device, cfg.stage
    mixed = cfg.precision == "mixed"
    dtype = torch.bfloat16 if mixed else torch.float32
    model = mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed).to(dev, dtype)
    layers = [m for m in model if isinstance(m, torch.nn.Linear)]
    # Every stage shards layer by layer, so every stage adds the gradients in the same order.
    units = [Flat(list(m.parameters()), n, r) for m in layers]
    transient = Transients()
    # --- the model states this rank keeps between steps
    if stage == 3:
        for u in units:
            u.shard = u.full[u.lo:u.hi].clone()
            u.free()
        fetch_layer_by_layer(units, layers, n, transient)
    overlap = None
    if stage == 2 and cfg.bucket_mb > 0:
        overlap = scatter_during_backward(units, layers, n, int(cfg.bucket_mb * 2**20), transient)
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
        optimizer = layerwise.PieceOptimizer(cfg.optimizer, masters, spans, layerwise.layouts(units),
                                             cfg.lr, cfg.weight_decay, sharded=stage > 0)
    x_all, y_all = teacher_classification(cfg.samples, cfg.d_in, cfg.classes)
    x_all, y_all = x_all.to(dev, dtype), y_all.to(dev)
    meter, rec = ActivationMeter(exclude=model.parameters()), StepRecorder(dev, ctx.emit)
    losses = []
    try:
        for step in range(cfg.steps):
            idx = shard(batch_indices(cfg.samples, cfg.global_batch, step, cfg.seed), r, n)
            with rec.step(step) as rs:
                for u in units if stage < 3 and overlap is None else ():
                    if stage == 2:  # built during backward, freed once scattered (a transient)
                        u.new_grad(transient)
                    else:
                        u.bucket.zero_()
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
        if overlap is not None:
            overlap.close()
    params_kept = [u.shard if stage == 3 else u.full for u in units]
    grads_kept = [u.grad_shard if stage >= 2 else u.bucket for u in units]
    memory = {"params": storage_bytes(params_kept), "grads": storage_bytes(grads_kept),
              "optimizer": storage_bytes(optimizer_tensors(optimizer) + (masters if mixed else [])),
              "activations": meter.peak, "buffers": transient.peak + counters().scratch_peak,
              **device_memory(dev)}
    final = []
    for u in units:  # stage 3: gather the final parameters for checking (not part of training)
        if stage == 3:
            u.gather(op="final_check_gather")
        final += u.full[: u.numel].float().tolist()
    return {"losses": losses, "params": final, "padded": sum(u.padded for u in units),
            "layer_bytes": [u.padded * u.full.element_size() for u in units],
            "grads_peak": transient.grads_peak, "params_peak": transient.params_peak,
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
    norm_formula = [layerwise.norm_traffic(tensors, n, r) if cfg.optimizer != "adam" and cfg.stage > 0
                    else 0 for r in range(n)]
    return {"param_count": psi, "padded_param_count": padded, "formula": formula,
            "traffic_per_step": traffic, "traffic_formula": zero_traffic(psi, n, cfg.stage, esize),
            "traffic_formula_padded": zero_traffic(padded, n, cfg.stage, esize),
            "norm_traffic_per_step": norms, "norm_traffic_formula": norm_formula,
            "final_params": outs[0]["params"],
            # the most bytes of full (unsharded) gradients a rank held at once, and each layer's
            "full_grads_peak": [o["grads_peak"] for o in outs], "layer_bytes": outs[0]["layer_bytes"],
            # stage 3: the most bytes of gathered (full) parameters a rank had allocated at once
            "full_params_peak": [o["params_peak"] for o in outs]}


def reference(cfg: Config) -> list[float]:
    """Single-process training on the combined batch (fp32): what every fp32 stage must reproduce."""
    from .data_parallel import reference as single_process

    if cfg.optimizer == "adam":
        return single_process(cfg, optimizer="adam")
    return layerwise_reference(cfg)["losses"]


def layerwise_reference(cfg: Config) -> dict:
    """Single-process LAMB or LARS (lesson_lib.optim, biases excluded) on the combined batch."""
    model = mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed)
    opt_ = optim.make(cfg.optimizer, model, cfg.lr, cfg.weight_decay)
    x_all, y_all = teacher_classification(cfg.samples, cfg.d_in, cfg.classes)
    losses = []
    for step in range(cfg.steps):
        idx = batch_indices(cfg.samples, cfg.global_batch, step, cfg.seed)
        opt_.zero_grad()
        loss = F.cross_entropy(model(x_all[idx]), y_all[idx])
        loss.backward()
        opt_.step()
        losses.append(float(loss.detach()))
    return {"losses": losses, "params": torch.cat([p.detach().view(-1) for p in model.parameters()]).tolist()}


def torch_zero_reference(cfg: Config) -> dict:
    """``torch.distributed.optim.ZeroRedundancyOptimizer`` (ZeRO-1) on the same model and data.

    Gradients are averaged with the library's all-reduce; after each step every rank broadcasts
    the parameters it owns, so its parameter traffic is whole parameters (by tensor), not our
    flat ring all-gather. Runs on every rank of a cluster.
    """
    from torch.distributed.optim import ZeroRedundancyOptimizer

    ctx = context()
    model = mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed)
    zro = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=cfg.lr)
    x_all, y_all = teacher_classification(cfg.samples, cfg.d_in, cfg.classes)
    losses = []
    for step in range(cfg.steps):
        idx = shard(batch_indices(cfg.samples, cfg.global_batch, step, cfg.seed), ctx.rank, ctx.world_size)
        zro.zero_grad()
        loss = F.cross_entropy(model(x_all[idx]), y_all[idx])
        loss.backward()
        for p in model.parameters():
            torch.distributed.all_reduce(p.grad)
            p.grad.div_(ctx.world_size)
        zro.step()
        lt = loss.detach().reshape(1)
        torch.distributed.all_reduce(lt)
        losses.append(float(lt) / ctx.world_size)
    return {"losses": losses, "optimizer_bytes": storage_bytes(optimizer_tensors(zro.optim)),
            "params": torch.cat([p.detach().view(-1) for p in model.parameters()]).tolist()}
