"""Chapter 4, section 8 — what PyTorch ships: FSDP2 (``fully_shard``) beside our ZeRO-3.

Two cells: :func:`fsdp2` trains FSDP2 (torch's own Gloo collectives) and our stage 3 on the same
model and batches and compares them; :func:`fsdp2_memory` measures FSDP2's peak per rank on the
``memory`` preset beside our stage 3's (from ``ch04.measured_memory``), with FSDP2's collectives
done by our ring so that the meter sees every byte and the traffic is counted.
"""

from __future__ import annotations

from IPython.display import display

from .. import plots
from ..costmodel import zero_traffic
from ..experiments import run_warm
from ..milestones import zero
from ..runtime import warm_cluster

STATES = ("params", "grads", "optimizer")


def fsdp2(world_size: int = 2) -> dict:
    """FSDP2 and our stage 3 on the chapter's ``laptop`` run: loss and parameter gaps against the
    rounding tolerance, each rank's parameter shard per layer (elements) and in bytes."""
    cfg = zero.Config.laptop(stage=3, world_size=world_size)
    ours = run_warm(cfg)
    theirs = warm_cluster(world_size).run(zero.fsdp2_worker, cfg)
    out = zero.fsdp.compare(cfg, ours, theirs)
    print(f"FSDP2 vs our ZeRO-3 on {world_size} ranks, {cfg.steps} Adam steps, largest difference:\n"
          f"  losses {out['loss_gap']:.1e} (rounding allows {out['loss_tolerance']:.1e}), "
          f"parameters {out['param_gap']:.1e} (allows {out['param_tolerance']:.1e})\n"
          f"parameter shard per layer, elements on each rank:\n  ours  {out['ours_shards']}\n"
          f"  FSDP2 {out['fsdp2_shards']}\nbytes of parameters per rank:\n  ours  {out['ours_param_bytes']}\n"
          f"  FSDP2 {out['fsdp2_param_bytes']}")
    return out


def fsdp2_memory(measured: dict, preset: str = "memory") -> dict:
    """FSDP2 with ``reshard_after_forward`` True (ZeRO-3) and False (ZeRO-2-like) on ``preset``: each
    rank's measured peak beside our stage 3's (``measured``: what ``ch04.measured_memory`` returned),
    the inventory of the model states, and the bytes its collectives sent (our ring, counted)."""
    cfg = zero.Config.from_preset(preset, stage=3)
    ours = next(r for r in measured["rows"] if r["stage"] == 3)
    rows = [{"label": "ours, stage 3", "measured": ours["measured"], "states": ours["states"]}]
    runs = {}
    for reshard in (True, False):
        outs = warm_cluster(cfg.world_size).run(zero.fsdp2_worker, cfg, reshard, "ring")
        runs[reshard] = outs
        rows.append({"label": f"FSDP2, reshard_after_forward={reshard}",
                     "measured": [o["memory"]["measured_peak"] for o in outs],
                     "states": [sum(o["memory"][c] for c in STATES) for o in outs]})
    n, shards = cfg.world_size, runs[True][0]["shard_numel"]
    padded = n * sum(shards)  # every layer's dims divide by N here: FSDP2 pads nothing
    sent = {k: sum(o["bytes_sent"].values()) / cfg.steps for k, o in ((k, v[0]) for k, v in runs.items())}
    psi = zero.param_count(cfg)
    display(plots.memory.side_by_side(
        rows, f"{psi / 1e6:.1f}M parameters, {n} ranks, fp32 Adam: the peak each rank allocated during the "
              "steps (measured, torch's allocator) and the model states it keeps (inventory)"))
    mb = lambda b: f"{b / 1e6:,.1f}"
    print(f"{'run':<33} {'measured MB, per rank':>22} {'model states MB':>16}")
    for row in rows:
        print(f"{row['label']:<33} {', '.join(map(mb, row['measured'])):>22} {mb(max(row['states'])):>16}")
    print(f"bytes each rank sent per step (counted): FSDP2 ZeRO-3 {sent[True]:,.0f}, ZeRO-2-like "
          f"{sent[False]:,.0f}\nformulas: 3Ψ(N−1)/N = {zero_traffic(padded, n, 3):,.0f}, 2Ψ(N−1)/N = "
          f"{zero_traffic(padded, n, 2):,.0f}")
    return {"rows": rows, "sent": sent, "formula": {s: zero_traffic(padded, n, s) for s in (2, 3)},
            "full_param_bytes": 4 * padded, "largest_layer_bytes": 4 * n * max(shards),
            "memory": {k: [o["memory"] for o in v] for k, v in runs.items()}}
