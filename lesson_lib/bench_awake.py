"""``python -m lesson_lib bench awake`` and ``bench pin``: chapter 5's B₀ training loop with idle
cores kept awake (:mod:`lesson_lib.runtime.awake`) and without, or with each rank on a core of its
own (:func:`lesson_lib.runtime.placement.own_core`) and without, taking turns on the same warm cluster."""

from __future__ import annotations

import statistics
from contextlib import nullcontext

from .experiments import run
from .milestones import large_batch
from .runtime import Cluster, awake
from .runtime.placement import own_core_reason_off


def _turns(cfg, world_size: int, rounds: int, on: dict, off: dict, off_ctx=nullcontext) -> dict:
    """``rounds`` pairs of runs of ``cfg`` changed by ``on`` and by ``off`` (under ``off_ctx()``),
    neither always first: per run the median step (slowest rank) and the median all-reduce."""
    out = {"on": [], "off": [], "steps": cfg.steps, "world_size": world_size}
    with Cluster(world_size, quiet=True) as c:
        run("large-batch", cfg.replace(epochs=1), cluster=c)  # warm-up
        for i in range(rounds):
            for mode in ("on", "off") if i % 2 == 0 else ("off", "on"):
                with off_ctx() if mode == "off" else nullcontext():
                    r = run("large-batch", cfg.replace(**(on if mode == "on" else off)), cluster=c)
                comm = statistics.median(max(s["comm_s"] for s in per_step)
                                         for per_step in zip(*(p["steps"][1:] for p in r.per_rank)))
                out[mode].append({"step_s": r.median_step_time(), "comm_s": comm})
    out["ratio"] = statistics.median(a["step_s"] / b["step_s"] for a, b in zip(out["off"], out["on"]))
    return out


def _b0(epochs: int, world_size: int):
    return large_batch.at_batch("lamb", large_batch.BASE_BATCH, "laptop", epochs=epochs,
                                world_size=world_size)


def awake_loop(rounds: int = 4, epochs: int = 2, world_size: int = 2) -> dict:
    """Median step time (slowest rank) and median all-reduce time of chapter 5's LAMB at B₀ = 64,
    ``epochs`` of the laptop task per run, spinners on and off in alternate runs."""
    out = _turns(_b0(epochs, world_size), world_size, rounds, {}, {}, off_ctx=awake.off)
    return {**out, "what": "idle cores kept awake", "why_not": awake.reason_off("gloo")}


def pin_loop(rounds: int = 4, epochs: int = 2, world_size: int = 2) -> dict:
    """Median step time (slowest rank) and median all-reduce time of chapter 5's LAMB at B₀ = 64,
    ``epochs`` of the laptop task per run, each rank on a core of its own (``own_core``) or not,
    in alternate runs."""
    out = _turns(_b0(epochs, world_size), world_size, rounds, {"own_core": True}, {"own_core": False})
    why_not = own_core_reason_off(world_size, "gloo")
    return {**out, "what": "each rank on a core of its own", "why_not": why_not}


def print_awake(r: dict) -> None:
    print(f"chapter 5's LAMB at B0 = 64 on {r['world_size']} ranks, {r['steps']} steps a run, "
          f"{r['what']} or not, taking turns")
    if r["why_not"]:
        print(f"note: this is off here ({r['why_not']}): both columns run without it")
    print(f"{'round':>5} {'with: step':>11} {'all-reduce':>11} {'without: step':>14} "
          f"{'all-reduce':>11}  (ms)")
    for i, (a, b) in enumerate(zip(r["on"], r["off"])):
        print(f"{i:>5} {1e3 * a['step_s']:>11.2f} {1e3 * a['comm_s']:>11.2f} "
              f"{1e3 * b['step_s']:>14.2f} {1e3 * b['comm_s']:>11.2f}")
    print(f"step time without / with = {r['ratio']:.2f} (median over rounds)")
