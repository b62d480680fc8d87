"""``python -m lesson_lib bench awake``, ``bench pin`` and ``bench io``: chapter 5's B₀ training loop
with idle cores kept awake (:mod:`lesson_lib.runtime.awake`) and without, with each rank on a core of
its own (:func:`lesson_lib.runtime.placement.own_core`) and without, or with Gloo's I/O threads at
the lowest priority (:mod:`lesson_lib.runtime.iothread`) and without, taking turns."""

from __future__ import annotations

import os
import statistics
from contextlib import ExitStack, nullcontext
from unittest import mock

from .experiments import run
from .milestones import large_batch
from .runtime import Cluster, awake, iothread
from .runtime.placement import own_core_reason_off


def _turns(cfg, world_size: int, rounds: int, on: dict, off: dict, off_ctx=nullcontext,
           off_env: tuple[str, str] | None = None, probe=None) -> dict:
    """``rounds`` pairs of runs of ``cfg`` changed by ``on`` and by ``off`` (under ``off_ctx()``),
    neither always first, on one warm cluster — or, with ``off_env`` (a variable and its value), the
    off runs on a second cluster started with it. Per run the median and the mean step (slowest
    rank; the mean is what a learner waits for, tail included) and the median all-reduce; with
    ``probe``, what it returns on each rank of each mode's cluster (what was compared)."""
    out = {"on": [], "off": [], "steps": cfg.steps, "world_size": world_size}
    with ExitStack() as stack:
        clusters = {"on": stack.enter_context(Cluster(world_size, quiet=True))}
        clusters["off"] = clusters["on"]
        if off_env is not None:
            with mock.patch.dict(os.environ, dict([off_env])):
                clusters["off"] = stack.enter_context(Cluster(world_size, quiet=True))
                clusters["off"].start()  # its workers read the variable as they start
        for c in {id(c): c for c in clusters.values()}.values():
            run("large-batch", cfg.replace(epochs=1), cluster=c)  # warm-up
        if probe is not None:
            out["probe"] = {mode: c.run(probe) for mode, c in clusters.items()}
        for i in range(rounds):
            for mode in ("on", "off") if i % 2 == 0 else ("off", "on"):
                with off_ctx() if mode == "off" else nullcontext():
                    r = run("large-batch", cfg.replace(**(on if mode == "on" else off)),
                            cluster=clusters[mode])
                comm = statistics.median(max(s["comm_s"] for s in per_step)
                                         for per_step in zip(*(p["steps"][1:] for p in r.per_rank)))
                out[mode].append({"step_s": r.median_step_time(), "comm_s": comm,
                                  "mean_s": statistics.mean(r.step_times()[1:])})
    out["ratio"] = statistics.median(a["step_s"] / b["step_s"] for a, b in zip(out["off"], out["on"]))
    out["mean_ratio"] = statistics.median(a["mean_s"] / b["mean_s"] for a, b in zip(out["off"], out["on"]))
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


def io_loop(rounds: int = 4, epochs: int = 2, world_size: int = 2) -> dict:
    """Median and mean step time (slowest rank) and median all-reduce time of chapter 5's LAMB at
    B₀ = 64, ``epochs`` of the laptop task per run, with Gloo's I/O threads at nice 19 (as
    ``own_core`` sets them) and at their own priority (a second cluster, ``LESSON_LIB_IO_NICE=0``), in
    alternate runs."""
    out = _turns(_b0(epochs, world_size), world_size, rounds, {}, {}, off_env=("LESSON_LIB_IO_NICE", "0"),
                 probe=iothread.nices)
    # only own_core lowers them: where it pins nothing, both columns keep their own priority
    why_not = iothread.reason_off("gloo") or own_core_reason_off(world_size, "gloo")
    return {**out, "what": "Gloo's I/O threads at the lowest priority", "why_not": why_not}


def print_awake(r: dict) -> None:
    print(f"chapter 5's LAMB at B0 = 64 on {r['world_size']} ranks, {r['steps']} steps a run, "
          f"{r['what']} or not, taking turns")
    if r["why_not"]:
        print(f"note: this is off here ({r['why_not']}): both columns run without it")
    if "probe" in r:
        print(f"the I/O threads' nice, by rank: with {r['probe']['on']}, without {r['probe']['off']}")
    print(f"{'round':>5} {'with: step':>11} {'mean':>6} {'all-reduce':>11} {'without: step':>14} "
          f"{'mean':>6} {'all-reduce':>11}  (ms; step and all-reduce: medians over steps)")
    for i, (a, b) in enumerate(zip(r["on"], r["off"])):
        print(f"{i:>5} {1e3 * a['step_s']:>11.2f} {1e3 * a['mean_s']:>6.2f} {1e3 * a['comm_s']:>11.2f} "
              f"{1e3 * b['step_s']:>14.2f} {1e3 * b['mean_s']:>6.2f} {1e3 * b['comm_s']:>11.2f}")
    print(f"step time without / with = {r['ratio']:.2f} (median step), {r['mean_ratio']:.2f} (mean step); "
          "medians over rounds")
