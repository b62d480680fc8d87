"""FSDP2's ``fully_shard`` (Zhao et al., VLDB 2023) on the same model, data and Adam as our stage 3,
and the comparison of the two (chapter 4 §8). How our steps map to FSDP2's: docs/design.md, "FSDP2".
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ... import comm
from ...data import batch_indices, shard, teacher_classification
from ...metrics import counters, storage_bytes
from ...models import mlp
from ...numerics import adam_drift, max_gap
from ...peakmem import PeakMemory
from ...runtime import context
from .milestone import Config


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # a DTensor's shard on this rank


class RingAllGather:
    """FSDP2's ``AllGather`` interface done by our ring on this thread, so :class:`PeakMemory` sees
    its buffers (Gloo's own collectives free some on Gloo's threads)."""

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        lo, hi = comm.chunk_bounds(output_tensor.numel(), dist.get_world_size(group))[dist.get_rank(group)]
        output_tensor[lo:hi].copy_(input_tensor)
        comm.ring_all_gather(output_tensor, group, op="param_all_gather")


class RingReduceScatter(RingAllGather):
    """FSDP2's reduce-scatter (``ReduceScatter``) done by our ring, averaged as FSDP2 asks (``AVG``)."""

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        output_tensor.copy_(comm.ring_reduce_scatter(input_tensor, group, op="grad_reduce_scatter"))
        if op == dist.ReduceOp.AVG:
            output_tensor.div_(dist.get_world_size(group))
        elif op != dist.ReduceOp.SUM:
            raise ValueError(f"our ring sums; FSDP2 asked for {op}")


def fsdp2_worker(cfg: Config, reshard_after_forward: bool = True, collectives: str = "gloo") -> dict:
    """On every rank: train ``cfg``'s model with FSDP2 and fp32 Adam on our stage 3's batches;
    ``collectives``: ``"gloo"`` or ``"ring"`` (ours). Returns the global losses, each layer's shard
    size, the model-state inventory, the measured peak (``cfg.peak_memory``) and the trained
    parameters (``cfg.return_params``).
    """
    from torch.distributed.fsdp import fully_shard

    if collectives not in ("gloo", "ring"):
        raise ValueError(f"collectives must be 'gloo' or 'ring', got {collectives!r}")
    if cfg.precision != "fp32":
        raise ValueError("the FSDP2 comparison runs fp32 (FSDP2's MixedPrecisionPolicy is not ours)")
    ctx = context()
    counters().reset()
    r, n, dev = ctx.rank, ctx.world_size, ctx.device
    peak = PeakMemory(dev) if cfg.peak_memory else None
    with peak if peak is not None else contextlib.nullcontext():
        model = mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed).to(dev)
        layers = [m for m in model if isinstance(m, torch.nn.Linear)]
        for m in layers:  # bottom-up, one unit per layer, as the docstring of fully_shard asks
            fully_shard(m, reshard_after_forward=reshard_after_forward)
        fully_shard(model, reshard_after_forward=reshard_after_forward)
        for m in layers if collectives == "ring" else ():
            m.set_custom_all_gather(RingAllGather())
            m.set_custom_reduce_scatter(RingReduceScatter())
        adam = torch.optim.Adam(model.parameters(), lr=cfg.lr)
        x_all, y_all = teacher_classification(cfg.samples, cfg.d_in, cfg.classes)
        x_all, y_all = x_all.to(dev), y_all.to(dev)
        losses, grads = [], 0
        if peak is not None:
            peak.reset_peak()  # from here on, as ours: the model states are alive
        for step in range(cfg.steps):
            idx = shard(batch_indices(cfg.samples, cfg.global_batch, step, cfg.seed), r, n)
            loss = F.cross_entropy(model(x_all[idx]), y_all[idx])
            loss.backward()  # FSDP2's hooks gather, free and reduce-scatter layer by layer
            adam.step()
            grads = storage_bytes(_local(p.grad) for p in model.parameters())  # my gradient shards
            adam.zero_grad()
            lt = loss.detach().reshape(1)
            dist.all_reduce(lt)
            losses.append(float(lt) / n)
        if peak is not None:
            peak.stop()
    states = [_local(v) for s in adam.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    memory = {"params": storage_bytes(_local(p) for p in model.parameters()), "grads": grads,
              "optimizer": storage_bytes(states), **(peak.as_dict() if peak is not None else {})}
    final = [] if not cfg.return_params else \
        torch.cat([p.full_tensor().reshape(-1) for p in model.parameters()]).tolist()  # not training
    sent = {k: v["bytes_sent"] for k, v in counters().as_dict().items()}  # our ring's, per op
    return {"losses": losses, "params": final, "memory": memory, "bytes_sent": sent,
            "shard_numel": [sum(_local(p).numel() for p in m.parameters()) for m in layers]}


def compare(cfg: Config, ours, theirs: list[dict]) -> dict:
    """Our stage 3 (a ``Result`` or a dict of ``losses``, ``final_params``, ``per_rank``,
    ``layer_bytes``) against FSDP2's outputs: gaps, tolerances (:func:`lesson_lib.numerics.adam_drift`)
    and each rank's shards."""
    n, esize = cfg.world_size, 4
    ours_shards = [[b // esize // n for b in ours["layer_bytes"]]] * n  # Flat: padded / N per layer
    tol = adam_drift(cfg)
    out = {"loss_gap": max_gap(ours["losses"], theirs[0]["losses"]),
           "loss_tolerance": tol["loss_rel"] * max(map(abs, ours["losses"])),
           "param_tolerance": tol["params"],
           "ours_shards": ours_shards, "fsdp2_shards": [t["shard_numel"] for t in theirs],
           "ours_param_bytes": [p["memory"]["params"] for p in ours["per_rank"]],
           "fsdp2_param_bytes": [t["memory"]["params"] for t in theirs]}
    if ours["final_params"] and theirs[0]["params"]:
        out["param_gap"] = max_gap(ours["final_params"], theirs[0]["params"])
    out["same_shards"] = out["ours_shards"] == out["fsdp2_shards"] \
        and out["ours_param_bytes"] == out["fsdp2_param_bytes"]
    out["same_training"] = out["loss_gap"] <= out["loss_tolerance"] \
        and out.get("param_gap", 0.0) <= out["param_tolerance"]
    return out
