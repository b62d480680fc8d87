"""Chapter 4, section 8 — FSDP2 on a device mesh (notebooks/04_zero.ipynb): hybrid sharding (HSDP)
beside plain FSDP on 4 ranks, and the precision FSDP2 reduces gradients in, on 2 ranks.

:func:`hsdp` and :func:`reduce_precision` are one cell's figure work each: real ranks, counted bytes
against :func:`lesson_lib.milestones.zero.hsdp.traffic_formula`, losses against single-process Adam.
"""

from __future__ import annotations

import functools

from IPython.display import display

from .. import plots
from ..milestones import zero
from ..numerics import adam_drift, max_gap
from ..runtime import warm_cluster

STATES = ("params", "grads", "optimizer")
PARTS = ("param_all_gather", "grad_reduce_scatter", "all_reduce_ring_sent")


@functools.lru_cache(maxsize=4)
def _reference(task: tuple) -> tuple:
    """Single-process fp32 Adam on the task (seconds on 2 cores): computed once for both cells."""
    return tuple(zero.reference(zero.Config(**dict(task))))


def hsdp(world_size: int = 4, replicas: int = 2) -> dict:
    """FSDP2 on the chapter's ``laptop`` run over ``world_size`` ranks twice: a 1-D mesh (plain FSDP,
    one shard group of all ranks) and a (replicas, world_size / replicas) mesh (HSDP). Per mesh: the
    bytes each rank sent per step by group, counted and by formula; the measured peak and the
    inventory of model states per rank; the loss gap to single-process Adam and its tolerance."""
    cfg = zero.Config.laptop(stage=3, world_size=world_size, peak_memory=True)
    ref, tol = list(_reference(tuple(cfg.task().items()))), adam_drift(cfg)
    meshes = {"FSDP": (world_size,), "HSDP": (replicas, world_size // replicas)}
    out = {"loss_tolerance": tol["loss_rel"] * max(map(abs, ref)), "meshes": meshes}
    for label, shape in meshes.items():
        outs = warm_cluster(world_size).run(zero.hsdp.mesh_worker, cfg, shape)
        o = outs[0]
        f = zero.hsdp.traffic_formula(o["shard_numel"], shape)
        counted = {k: v / cfg.steps for k, v in o["bytes_sent"].items()}
        counted["all_reduce_bytes"] = o["all_reduce"]["bytes"] / cfg.steps
        counted["all_reduce_ring_sent"] = counted["all_reduce_bytes"] * 2 * (shape[0] - 1) / shape[0] \
            if len(shape) == 2 else 0
        out[label] = {"shape": shape, "counted": counted, "formula": f, "label": f"{label} {shape}",
                      "all_reduce_calls": o["all_reduce"]["calls"] / cfg.steps,
                      "measured": [x["memory"]["measured_peak"] for x in outs],
                      "states": [sum(x["memory"][c] for c in STATES) for x in outs],
                      "loss_gap": max_gap(o["losses"], ref), **{k: counted.get(k, 0) for k in PARTS}}
    psi = zero.param_count(cfg)
    display(plots.memory.group_traffic(
        [out[k] for k in meshes], f"FSDP2 on {world_size} ranks, {psi:,} parameters, fp32: one shard group "
        f"of {world_size} (FSDP) or {replicas} replicas of shard groups of {world_size // replicas} (HSDP)"))
    print("bytes per rank per step, counted (formula). Shard group: all-gather, reduce-scatter sent;\n"
          "replicate group: all-reduce handed in, and what a ring would send")
    print(f"{'run':<13} {'all-gather':>21} {'reduce-scatter':>21} {'all-reduce':>21} {'ring sends':>10}")
    for k in meshes:
        r, c, f = out[k], out[k]["counted"], out[k]["formula"]
        both = lambda op, c=c, f=f: f"{c[op]:,.0f} ({f[op]:,})"
        print(f"{r['label']:<13} {both('param_all_gather'):>21} {both('grad_reduce_scatter'):>21} "
              f"{both('all_reduce_bytes'):>21} {c['all_reduce_ring_sent']:>10,.0f}")
    print(f"\n{'run':<13} {'all-reduce calls':>16} {'peak MB':>8} {'states MB':>9} {'loss gap':>8}"
          f"   (allowed {out['loss_tolerance']:.1e})")
    for k in meshes:
        r = out[k]
        print(f"{r['label']:<13} {r['all_reduce_calls']:>16g} {max(r['measured']) / 1e6:>8.2f} "
              f"{max(r['states']) / 1e6:>9.2f} {r['loss_gap']:>8.1e}")
    return out


def reduce_precision(world_size: int = 2) -> dict:
    """FSDP2 with bf16 parameters (forward, backward and all-gathers in bf16) and gradients reduced in
    bf16 or in fp32, beside fp32 throughout, on the ``laptop`` run: each step's loss gap to
    single-process fp32 Adam, the bf16 tolerance, and the bytes each collective sent per step."""
    cfg = zero.Config.laptop(stage=3, world_size=world_size)
    ref = list(_reference(tuple(cfg.task().items())))
    runs = {"fp32": ("fp32", "fp32"), "bf16, reduce in bf16": ("bf16", "bf16"),
            "bf16, reduce in fp32": ("bf16", "fp32")}
    out = {"tolerance": zero.hsdp.bf16_loss_tolerance(cfg, ref),
           "fp32_tolerance": adam_drift(cfg)["loss_rel"] * max(map(abs, ref))}
    for label, (p, r) in runs.items():
        o = warm_cluster(world_size).run(zero.hsdp.mesh_worker, cfg, (), p, r)[0]
        out[label] = {"gaps": [abs(a - b) for a, b in zip(o["losses"], ref)],
                      "sent": {k: v / cfg.steps for k, v in o["bytes_sent"].items()}}
        out[label]["max_gap"] = max(out[label]["gaps"])
    display(plots.precision.reduce_gaps(
        {k: out[k]["gaps"] for k in runs}, out["tolerance"],
        f"FSDP2 on {world_size} ranks: how far each run's loss is from fp32 single-process Adam"))
    print(f"{'run':>22} {'largest loss gap':>17} {'all-gather B/step':>18} {'reduce-scatter B/step':>22}")
    for k in runs:
        s = out[k]["sent"]
        print(f"{k:>22} {out[k]['max_gap']:>17.1e} {s['param_all_gather']:>18,.0f} "
              f"{s['grad_reduce_scatter']:>22,.0f}")
    print(f"bf16 rounding allows {out['tolerance']:.1e}; fp32 rounding {out['fp32_tolerance']:.1e}")
    return out
