"""FSDP2 on a device mesh (chapter 4, section 8): hybrid sharding, the precision the gradients are
reduced in, and the backward prefetch — on the same model, data and Adam as our stage 3.

* **Hybrid sharding (HSDP)**: ``fully_shard(module, mesh=mesh)`` with a 2-D mesh
  ``init_device_mesh("cpu", (R, S), mesh_dim_names=("replicate", "shard"))`` shards every layer over
  the S ranks of its *shard group* (all-gathers and reduce-scatters stay there) and keeps R replicas
  of those shards, whose gradient shards are averaged by one all-reduce across the *replicate
  group* (FSDP2's ``foreach_reduce``: ``dist.all_reduce(..., group=all_reduce_group)``). MiCS
  (Zhang et al., VLDB 2022) and ZeRO++'s hpZ (Wang et al., 2023) are the same idea.
* **Reduction precision**: ``MixedPrecisionPolicy(param_dtype=..., reduce_dtype=...)``: the forward
  and backward run in ``param_dtype`` (so do the all-gathers), the reduce-scatter in ``reduce_dtype``.
* **Backward prefetch**: FSDP2's default gathers the previous layer's parameters in a layer's
  ``pre_backward``, before its backward runs (``_fsdp_param_group.py``, ``_backward_prefetch``);
  ``set_modules_to_backward_prefetch([m])`` (prefetch only itself, already gathered) turns it off.

Counting: the shard group's collectives are our ring (:class:`.fsdp.RingAllGather`), whose bytes sent
:func:`lesson_lib.metrics.counters` counts per op and which the allocator meter sees; the replicate
group's all-reduce is FSDP2's own (Gloo), recorded by :func:`lesson_lib.exercises.observe.observe`
with the bytes handed to it. :func:`traffic_formula` is what both must equal.

Memory: the allocator meter (:class:`lesson_lib.peakmem.PeakMemory`) keeps the peak of the *first*
step, when Adam's moments are created and every model state is alive. Over more steps its count
of an HSDP run grows by one gradient shard per layer per step: FSDP2 hands that buffer to Gloo's
all-reduce, and it is freed where the meter, listening on the rank's thread, does not see it.
"""

from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ...data import batch_indices, shard, teacher_classification
from ...exercises.observe import observe
from ...metrics import counters, storage_bytes
from ...models import mlp
from ...peakmem import PeakMemory
from ...runtime import context
from .fsdp import RingAllGather, RingReduceScatter, _local
from .milestone import Config

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class _Recorded:
    """Our ring collective for one layer, which notes ``{lane, layer, start, end}`` of each call in
    ``events`` (perf_counter seconds); ``lane`` says forward or backward (autograd running)."""

    def __init__(self, events: list, layer: int):
        self.events, self.layer = events, layer

    def __call__(self, *args, **kwargs):
        backward = torch._C._current_graph_task_id() != -1
        t0 = time.perf_counter()
        super().__call__(*args, **kwargs)
        lane = self.lane if self.lane != "all-gather" else \
            f"all-gather, {'backward' if backward else 'forward'}"
        self.events.append({"lane": lane, "layer": self.layer, "start": t0, "end": time.perf_counter()})


class RecordedAllGather(_Recorded, RingAllGather):
    lane = "all-gather"


class RecordedReduceScatter(_Recorded, RingReduceScatter):
    lane = "reduce-scatter"


def mesh_worker(cfg: Config, shape: tuple = (), param_dtype: str = "fp32", reduce_dtype: str = "fp32",
                backward_prefetch: bool = True) -> dict:
    """On every rank: FSDP2 on ``shape`` (``(S,)`` plain FSDP over S ranks, ``(R, S)`` HSDP; ``()``: all
    ranks in one shard group) with Adam on ``cfg``'s model and batches, our ring in the shard group.

    Returns the global losses; the bytes this rank sent per op in the shard group (counted) and the
    replicate group's all-reduces (their number and the bytes handed in, observed); each layer's
    shard (elements); an inventory of the model states it keeps and, with ``cfg.peak_memory``, the
    allocator's measured peak; the last step's collectives per layer, in time (:class:`_Recorded`).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if param_dtype not in DTYPES or reduce_dtype not in DTYPES:
        raise ValueError(f"param_dtype and reduce_dtype must be in {sorted(DTYPES)}, "
                         f"got {param_dtype!r}, {reduce_dtype!r}")
    ctx = context()
    r, n, dev = ctx.rank, ctx.world_size, ctx.device
    shape = tuple(shape) or (n,)
    if len(shape) not in (1, 2) or int(torch.tensor(shape).prod()) != n:
        raise ValueError(f"shape must be (S,) or (R, S) with R·S = {n} ranks, got {shape!r}")
    counters().reset()
    mesh = init_device_mesh(dev.type, shape, mesh_dim_names=("replicate", "shard")[2 - len(shape):])
    mp = MixedPrecisionPolicy(param_dtype=DTYPES[param_dtype], reduce_dtype=DTYPES[reduce_dtype])
    peak = PeakMemory(dev) if cfg.peak_memory else None
    events: list[dict] = []
    with peak if peak is not None else contextlib.nullcontext():
        model = mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed).to(dev)
        layers = [m for m in model if isinstance(m, torch.nn.Linear)]
        for m in layers:  # bottom-up, one unit per layer
            fully_shard(m, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        for i, m in enumerate(layers):
            m.set_custom_all_gather(RecordedAllGather(events, i))
            m.set_custom_reduce_scatter(RecordedReduceScatter(events, i))
            if not backward_prefetch:  # explicit prefetch of itself (already gathered): none
                m.set_modules_to_backward_prefetch([m])
        adam = torch.optim.Adam(model.parameters(), lr=cfg.lr)
        x_all, y_all = teacher_classification(cfg.samples, cfg.d_in, cfg.classes)
        x_all, y_all = x_all.to(dev), y_all.to(dev)
        losses, grads = [], 0
        if peak is not None:
            peak.reset_peak()
        with observe() as log:  # sees FSDP2's all-reduce across the replicate group
            for step in range(cfg.steps):
                events.clear()  # the last step's are kept
                idx = shard(batch_indices(cfg.samples, cfg.global_batch, step, cfg.seed), r, n)
                loss = F.cross_entropy(model(x_all[idx]).float(), y_all[idx])
                loss.backward()
                adam.step()
                grads = storage_bytes(_local(p.grad) for p in model.parameters())
                adam.zero_grad()
                losses.append(loss.detach())
                if peak is not None:
                    peak.stop()  # the first step's peak: see the module's docstring
    lt = torch.stack(losses)
    dist.all_reduce(lt)  # the global loss of each step, after training
    for g in {mesh.get_group(d) for d in mesh.mesh_dim_names} - {dist.group.WORLD}:
        dist.destroy_process_group(g)  # a warm worker serves many runs: the mesh's own groups go
    states = [_local(v) for s in adam.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    reduces = [c for c in log if c["op"] == "all_reduce"]
    t0 = min((e["start"] for e in events), default=0.0)
    return {"losses": (lt / n).tolist(), "shape": shape,
            "bytes_sent": {k: v["bytes_sent"] for k, v in counters().as_dict().items()},
            "all_reduce": {"calls": len(reduces), "bytes": sum(c["bytes"] for c in reduces)},
            "shard_numel": [sum(_local(p).numel() for p in m.parameters()) for m in layers],
            "memory": {"params": storage_bytes(_local(p) for p in model.parameters()), "grads": grads,
                       "optimizer": storage_bytes(states), **(peak.as_dict() if peak is not None else {})},
            "events": [{**e, "start": e["start"] - t0, "end": e["end"] - t0} for e in events]}


def traffic_formula(shard_numel: list[int], shape: tuple, steps: int = 1, param_bytes: int = 4,
                    reduce_bytes: int = 4) -> dict:
    """What each rank moves in ``steps`` steps, by group, for a model whose rank-0 shard per layer is
    ``shard_numel`` (FSDP2 pads every rank's shard to rank 0's): Ψ = S·Σ shard_numel elements.

    shard group (S ranks, ring): all-gather of the parameters before the forward and again before the
    backward, 2·(S−1)/S·Ψ·param_bytes sent; reduce-scatter of the gradients, (S−1)/S·Ψ·reduce_bytes.
    replicate group (R ranks): one all-reduce of my gradient shard, Ψ/S·reduce_bytes handed in (a
    ring all-reduce would send 2·(R−1)/R of that).
    """
    r, s = (1, *shape)[-2:]
    psi = s * sum(shard_numel)
    return {"param_all_gather": steps * 2 * (s - 1) * psi * param_bytes // s,
            "grad_reduce_scatter": steps * (s - 1) * psi * reduce_bytes // s,
            "all_reduce_bytes": steps * (psi // s) * reduce_bytes if r > 1 else 0,
            "all_reduce_ring_sent": steps * 2 * (r - 1) * (psi // s) * reduce_bytes // r}


def prefetched_in_backward(events: list[dict]) -> int:
    """Layers whose backward all-gather started before the next layer's reduce-scatter did — that is,
    before the layer after it in the model had finished its backward: gathers issued ahead."""
    start = {(e["lane"], e["layer"]): e["start"] for e in events}
    layers = sorted({e["layer"] for e in events})
    return sum(start[("all-gather, backward", i)] < start[("reduce-scatter", i + 1)] for i in layers[:-1])


def bf16_loss_tolerance(cfg: Config, reference: list[float]) -> float:
    """Loss gap allowed between a run whose forward and backward run in bf16 and the fp32 run.

    Every layer's output is rounded to bf16 (u = 2⁻⁸ relative), so the loss of a forward through
    depth + 1 layers is off by up to about (depth + 1)·u relative; we allow that, relative to the
    largest loss (as ``loss_scaling.loss_tolerance`` does for autocast). A wrong reduction (a missing
    1/N, a dropped shard) moves the loss by its own step's change, well above it.
    """
    return (cfg.depth + 1) * 2.0**-8 * max(abs(v) for v in reference)
