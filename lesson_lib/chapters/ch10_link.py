"""Chapter 10 §3 over a slow link (notebooks/10_resilience.ipynb): DDP, DiLoCo and chapter 6's
PowerSGD on the course's emulated link, the same tokens each, and the bytes at other settings."""

from __future__ import annotations

from IPython.display import display

from .. import plots
from ..milestones.resilience import compressed
from ..milestones.resilience import task as T
from ..runtime import warm_cluster


def slow_link(fn, task: T.Task, gbps: float, h: int, rank: int = 2, outer_lr: float = 0.5,
              outer_momentum: float = 0.5) -> dict:
    """§3: DDP, DiLoCo and chapter 6's PowerSGD (:func:`compressed.replica`) over the course's emulated
    link (``comm.set_link``), the same tokens each: bytes sent as the comm layer counts them, time to a
    target held-out loss, the assumptions printed first."""
    cluster = warm_cluster(2)
    psgd = f"PowerSGD, rank {rank}"
    runs = {name: cluster.run(compressed.counted, fn, task, hh, outer_lr, outer_momentum, gbps)[0]
            for name, hh in (("DDP", None), (f"DiLoCo, H = {h}", h))}
    runs[psgd] = cluster.run(compressed.counted, compressed.replica, task, "powersgd", gbps, rank=rank)[0]
    target = max(r["held_out"] for r in runs.values()) * 1.02
    reach = {name: next((t for t, loss in r["curve"] if loss <= target), float("inf"))
             for name, r in runs.items()}
    rate = gbps * 1e9 / 8  # bytes per second
    calls = sum(r["collectives"] for r in runs.values())
    fixed = sum(r["comm_s"] - r["bytes_sent"] / rate for r in runs.values()) / calls
    compute = min((r["curve"][-1][0] - r["comm_s"]) / task.steps for r in runs.values())
    ddp, psi = runs["DDP"], runs["DDP"]["params"].numel()
    print(f"assumptions: 2 replicas, each {task.steps} steps of {task.batch} samples (the same tokens in "
          f"every run), inner SGD lr {task.lr}, momentum {task.momentum}\n"
          f"  link: emulated at {gbps * 1e3:g} Mbit/s each way, no latency added (each transfer padded to "
          f"bytes / bandwidth)\n"
          f"  DiLoCo: H = {h}, outer Nesterov lr {outer_lr}, momentum {outer_momentum}\n"
          f"  PowerSGD: rank {rank}, error feedback, Q warm-started (chapter 6's, called as its loop calls "
          f"it; the biases ride uncompressed with P)\n"
          f"  compute: a {psi:,}-parameter MLP, {compute * 1e3:.1f} ms a step outside communication here, so "
          f"the gap is set by communication:\n"
          f"    the bytes, and each collective's own cost on this machine ({fixed * 1e3:.1f} ms on average "
          f"beyond its bytes' link time), which the link does not model\n"
          f"  target: 2 % above the worst final held-out loss of the three, {target:.3f}\n")
    print(f"{'':>17} {'collectives':>11} {'bytes sent':>11} {'× fewer':>8} {'in comm':>8} "
          f"{'to target':>10} {'final loss':>11}")
    for name, r in runs.items():
        print(f"{name:>17} {r['collectives']:>11,} {r['bytes_sent']:>11,} "
              f"{ddp['bytes_sent'] / r['bytes_sent']:>8.1f} {r['comm_s']:>7.2f}s {reach[name]:>9.2f}s "
              f"{r['held_out']:>11.4f}")
    order = sorted(reach, key=reach.get)
    print("to the target: " + " < ".join(f"{n} ({reach[n]:.2f} s)" for n in order))
    display(plots.resilience.time_to_target(
        {n: r["curve"] for n, r in runs.items()}, target,
        f"2 replicas over an emulated {gbps * 1e3:g} Mbit/s link: DDP, DiLoCo and chapter 6's PowerSGD, "
        "time to the same held-out loss",
        "The link is emulated (each transfer padded to bytes / bandwidth); compute here is a tiny MLP's, so "
        "the gap is set by communication alone: the bytes, and each collective's fixed cost, which favours "
        "DiLoCo's few exchanges. On a real cluster, compute per step is far larger."))
    return {"runs": runs, "target": target, "reach": reach, "order": order, "fixed_s": fixed,
            "compute_s": compute}


def bytes_and_quality(fn, task: T.Task, base: dict, hs=(4, 64), ranks=(1, 4), topk: float = 0.01,
                      outer_lr: float = 0.5, outer_momentum: float = 0.5) -> dict:
    """§3: bytes sent against final held-out loss at other H, PowerSGD ranks and top-k (with error
    feedback), beside :func:`slow_link`'s runs (``base``); without the link, which changes no byte."""
    cluster = warm_cluster(2)
    rows = dict(base["runs"])
    for h in hs:
        rows[f"DiLoCo, H = {h}"] = cluster.run(compressed.counted, fn, task, h, outer_lr, outer_momentum)[0]
    squeezed = [(f"PowerSGD, rank {r}", "powersgd", {"rank": r}) for r in ranks]
    for name, compressor, options in squeezed + [(f"top-k {topk:.0%}", "topk", {"ratio": topk})]:
        rows[name] = cluster.run(compressed.counted, compressed.replica, task, compressor, **options)[0]
    ddp = rows["DDP"]["bytes_sent"]
    print(f"{'':>17} {'bytes sent':>11} {'× fewer':>8} {'final loss':>11}   ({task.steps} steps, the same "
          f"tokens; top-k: (index, value) pairs all-gathered)")
    for name, r in sorted(rows.items(), key=lambda kv: -kv[1]["bytes_sent"]):
        print(f"{name:>17} {r['bytes_sent']:>11,} {ddp / r['bytes_sent']:>8.1f} {r['held_out']:>11.4f}")
    return {"rows": rows}
