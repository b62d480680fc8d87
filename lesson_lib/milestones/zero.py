"""ZeRO (chapter 4): stop storing everything everywhere (Rajbhandari et al., SC 2020).

Data-parallel Adam where each of N ranks keeps only its 1/N share of the model states:
stage 1 shards the optimizer state, stage 2 also the gradients, stage 3 also the parameters.

How we shard: all parameters live in one flat buffer, padded to a multiple of N; rank r owns the
contiguous slice r (``chunk_bounds``). Every collective is our ring over point-to-point
(``comm.ring_reduce_scatter`` / ``comm.ring_all_gather``), so traffic is counted exactly and the
sums happen in the same order at every stage — the stages agree bit for bit.

Per step, per rank (Ψ parameters):
* stage 0: reduce-scatter + all-gather the gradients (an all-reduce), full Adam step   — 2Ψ
* stage 1: reduce-scatter the gradients, Adam on my shard, all-gather the parameters   — 2Ψ
* stage 2: as stage 1, but only my gradient shard outlives the step                    — 2Ψ
* stage 3: all-gather the parameters for forward, free them, all-gather again for
  backward, free, reduce-scatter the gradients, Adam on my shard                       — 3Ψ
We gather the whole model at once (simple); real ZeRO-3 gathers layer by layer, so its
transient is one layer, not the model. Mixed precision keeps bf16 parameters and gradients
(CPU has no fast fp16) and an fp32 master copy with Adam's moments: K = 12 bytes per parameter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import comm
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

NAME = "zero"


@dataclass
class Config(TrainConfig):
    stage: int = opt(0, "0 plain data parallel | 1 shard optimizer state | 2 + gradients | 3 + parameters")
    precision: str = opt("fp32", "fp32 | mixed (bf16 params and grads, fp32 master and Adam: K=12)")
    lr: float = opt(0.01, "Adam learning rate")

    def validate(self) -> "Config":
        super().validate()
        if isinstance(self.stage, bool) or self.stage not in (0, 1, 2, 3):
            raise ValueError(f"stage must be 0, 1, 2 or 3, got {self.stage!r}")
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
    """A model whose parameters are views of one padded flat buffer that can be freed and refilled."""

    def __init__(self, cfg: Config, n: int, dtype: torch.dtype, device: torch.device):
        self.model = mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed).to(device, dtype)
        self.psi = param_count(cfg)
        self.padded = -(-self.psi // n) * n
        self.full = torch.zeros(self.padded, dtype=dtype, device=device)
        offset = 0
        for p in self.model.parameters():
            self.full[offset:offset + p.numel()].copy_(p.detach().view(-1))
            p.data = self.full[offset:offset + p.numel()].view_as(p)
            offset += p.numel()

    def point_grads(self, bucket: torch.Tensor) -> None:
        offset = 0
        for p in self.model.parameters():
            p.grad = bucket[offset:offset + p.numel()].view_as(p)
            offset += p.numel()

    def free(self) -> None:  # the views stay valid; their storage is given back
        self.full.untyped_storage().resize_(0)

    def alloc(self) -> None:
        self.full.untyped_storage().resize_(self.padded * self.full.element_size())


def worker(cfg: Config) -> dict:
    ctx = context()
    counters().reset()
    r, n, dev, stage = ctx.rank, ctx.world_size, ctx.device, cfg.stage
    mixed = cfg.precision == "mixed"
    dtype = torch.bfloat16 if mixed else torch.float32
    net = Flat(cfg, n, dtype, dev)
    lo, hi = comm.chunk_bounds(net.padded, n)[r]
    # --- the model states this rank keeps between steps
    if stage == 3:
        p_shard = net.full[lo:hi].clone()  # my parameters; the full buffer is only a transient
        net.free()
    owned = net.full if stage == 0 else (p_shard if stage == 3 else net.full[lo:hi])
    master = owned.float().clone() if mixed else owned  # Adam updates this (fp32)
    bucket = torch.zeros(net.padded, dtype=dtype, device=dev) if stage < 2 else None
    g_shard = torch.zeros(hi - lo, dtype=dtype, device=dev) if stage >= 2 else None
    if bucket is not None:
        net.point_grads(bucket)
    optimizer = torch.optim.Adam([master], lr=cfg.lr)
    x_all, y_all = teacher_classification(cfg.samples, cfg.d_in, cfg.classes)
    x_all, y_all = x_all.to(dev, dtype), y_all.to(dev)
    meter, rec = ActivationMeter(exclude=net.model.parameters()), StepRecorder(dev, ctx.emit)
    losses, transient_peak = [], 0

    def gather_params():
        net.alloc()
        net.full[lo:hi].copy_(p_shard)
        comm.ring_all_gather(net.full, op="param_all_gather")

    for step in range(cfg.steps):
        idx = shard(batch_indices(cfg.samples, cfg.global_batch, step, cfg.seed), r, n)
        with rec.step(step) as rs:
            if stage == 3:
                gather_params()
            if stage >= 2:
                bucket = torch.zeros(net.padded, dtype=dtype, device=dev)  # transient
                net.point_grads(bucket)
            else:
                bucket.zero_()
            with meter.measure():
                loss = F.cross_entropy(net.model(x_all[idx]).float(), y_all[idx])
            if stage == 3:
                net.free()
                gather_params()  # fetch again for backward, as if freed layer by layer
            loss.backward()
            transient_peak = max(transient_peak, storage_bytes(
                ([bucket] if stage >= 2 else []) + ([net.full] if stage == 3 else [])))
            if stage == 3:
                net.free()
            mine = comm.ring_reduce_scatter(bucket, op="grad_reduce_scatter").div_(n)
            if stage == 0:
                comm.ring_all_gather(bucket, op="grad_all_gather")
                master.grad = bucket.float() if mixed else bucket
            elif stage == 1:
                master.grad = mine.float() if mixed else mine
            else:
                g_shard.copy_(mine)
                master.grad = g_shard.float() if mixed else g_shard
                del mine
                for p in net.model.parameters():
                    p.grad = None
                bucket = None  # the full gradient buffer is freed here
            if mixed:
                transient_peak = max(transient_peak, storage_bytes([master.grad]))
            optimizer.step()
            master.grad = None
            if mixed:
                owned.copy_(master)
            if stage in (1, 2):
                comm.ring_all_gather(net.full, op="param_all_gather")
            lt = loss.detach().reshape(1)
            comm.ring_all_reduce(lt, op="loss_all_reduce")
            rs["loss"] = float(lt) / n
        losses.append(rs["loss"])
    params_kept = [p_shard] if stage == 3 else [net.full]
    grads_kept = [g_shard] if stage >= 2 else [bucket]
    memory = {"params": storage_bytes(params_kept), "grads": storage_bytes(grads_kept),
              "optimizer": storage_bytes(optimizer_tensors(optimizer) + ([master] if mixed else [])),
              "activations": meter.peak, "buffers": transient_peak + counters().scratch_peak,
              **device_memory(dev)}
    if stage == 3:  # hand back the full, final parameters for checking (not part of training)
        net.alloc()
        net.full[lo:hi].copy_(p_shard)
        comm.ring_all_gather(net.full, op="final_check_gather")
    final = net.full[: net.psi].float().tolist()
    return {"losses": losses, "params": final, "per_rank": per_rank_summary(r, rec, memory)}


def summarize(cfg: Config, outs: list[dict]) -> dict:
    psi, n = param_count(cfg), cfg.world_size
    formula = zero_memory(psi, n, cfg.stage, cfg.precision)
    esize = 2 if cfg.precision == "mixed" else 4
    training_ops = ("grad_reduce_scatter", "grad_all_gather", "param_all_gather")
    traffic = [sum(v["bytes_sent"] for k, v in o["per_rank"]["ops"].items() if k in training_ops)
               / cfg.steps for o in outs]
    padded = -(-psi // n) * n
    return {"param_count": psi, "padded_param_count": padded, "formula": formula,
            "traffic_per_step": traffic, "traffic_formula": zero_traffic(psi, n, cfg.stage, esize),
            "traffic_formula_padded": zero_traffic(padded, n, cfg.stage, esize),
            "final_params": outs[0]["params"]}


def reference(cfg: Config) -> list[float]:
    """Single-process Adam on the combined batch (fp32): what every fp32 stage must reproduce."""
    from .data_parallel import reference as single_process

    return single_process(cfg, optimizer="adam")


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
