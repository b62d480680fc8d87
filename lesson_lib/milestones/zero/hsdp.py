"""FSDP2 on a device mesh (chapter 4 §8): hybrid sharding (HSDP), the gradients' reduction precision
and backward prefetch, on the same model, data and Adam as our stage 3.

* HSDP: a 2-D mesh ``("replicate", "shard")`` shards each layer over S ranks and all-reduces the
  gradient shards across R replicas (MiCS, Zhang et al., 2022; ZeRO++'s hpZ, Wang et al., 2023).
* ``MixedPrecisionPolicy(param_dtype, reduce_dtype)``: compute and all-gathers in one, the
  reduce-scatter in the other.
* Backward prefetch is FSDP2's default; ``set_modules_to_backward_prefetch([m])`` turns it off.

The shard group's collectives are our counted ring; the replicate group's all-reduce is FSDP2's own,
seen by :func:`lesson_lib.exercises.observe.observe`. Why only the first step's memory peak is kept:
docs/design.md, "HSDP".
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
    """Our ring collective for one layer, noting ``{lane, layer, start, end}`` (perf_counter seconds)
    of each call in ``events``."""

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
    """On every rank: FSDP2 on ``shape`` (``(S,)`` FSDP, ``(R, S)`` HSDP, ``()``: one shard group) with
    Adam on ``cfg``'s model, our ring in the shard group.

    Returns the global losses, bytes sent per op (shard group), the replicate all-reduces (calls,
    bytes), each layer's shard size, the model-state inventory (and measured peak with
    ``cfg.peak_memory``), and the last step's collectives in time.
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
    """Bytes each rank moves in ``steps`` steps, by group; ``shard_numel``: rank 0's shard per layer
    (FSDP2 pads to it), so Ψ = S·Σ shard_numel.

    Shard group (ring): all-gathers before forward and backward, 2·(S−1)/S·Ψ·param_bytes; gradient
    reduce-scatter, (S−1)/S·Ψ·reduce_bytes. Replicate group: one all-reduce of Ψ/S·reduce_bytes.
    """
    r, s = (1, *shape)[-2:]
    psi = s * sum(shard_numel)
    return {"param_all_gather": steps * 2 * (s - 1) * psi * param_bytes // s,
            "grad_reduce_scatter": steps * (s - 1) * psi * reduce_bytes // s,
            "all_reduce_bytes": steps * (psi // s) * reduce_bytes if r > 1 else 0,
            "all_reduce_ring_sent": steps * 2 * (r - 1) * (psi // s) * reduce_bytes // r}


def prefetched_in_backward(events: list[dict]) -> int:
    """Layers whose backward all-gather started before the next layer's reduce-scatter: prefetched."""
    start = {(e["lane"], e["layer"]): e["start"] for e in events}
    layers = sorted({e["layer"] for e in events})
    return sum(start[("all-gather, backward", i)] < start[("reduce-scatter", i + 1)] for i in layers[:-1])


def bf16_loss_tolerance(cfg: Config, reference: list[float]) -> float:
    """Loss gap allowed between a bf16 run and the fp32 run: (depth + 1)·2⁻⁸ relative to the largest
    loss, one bf16 rounding per layer; a wrong reduction moves the loss far more.
    """
    return (cfg.depth + 1) * 2.0**-8 * max(abs(v) for v in reference)
