"""Chapter 5 §3: the fair race at 32·B₀ — every optimizer's sweep of the same tuning budget
(:mod:`lesson_lib.milestones.large_batch_race`), its best beside LAMB at B₀."""

from __future__ import annotations

import time

from IPython.display import display

from .. import plots
from ..milestones import large_batch as lb
from ..milestones import large_batch_race as lbr
from ..runtime import warm_cluster

# Options that change how a run is executed or measured, not what it trains: any other field that
# differs between the grid's run and a race entry makes them different trainings.
NOT_TRAINING = {"world_size", "backend", "timeout_s", "eval_every", "noise_scale", "peak_memory"}


def _from_grid(entry: dict, runs: dict) -> dict | None:
    """The grid's data-parallel run of exactly this entry's training, as a race row (or None)."""
    r = runs.get((entry["optimizer"], entry["cfg"].global_batch))
    if r is None:
        return None
    mine = entry["cfg"].as_dict()
    for name, value in mine.items():
        if name in NOT_TRAINING:
            continue
        theirs = r.config.get(name)
        same = (abs(theirs - value) <= 1e-9 * abs(value) if name == "lr" and theirs is not None
                else theirs == value)
        if not same:
            return None
    return lbr.result_row(entry, bool(r["diverged"]), r, r["steps"])


def race(grid_runs: dict | None = None, batch: int = 2048, preset: str = "long") -> dict:
    """Every optimizer's sweep at ``batch``, two single-process runs at a time; an entry the grid
    already trained (``grid_runs``: (optimizer, batch) → Result) is taken from there. Draws the race
    and prints each sweep; returns its rows, each optimizer's best and what it cost."""
    grid_runs = grid_runs or {}
    entries = lbr.entries(batch=batch, preset=preset)  # every Config validated before any run
    reused = [row for row in (_from_grid(e, grid_runs) for e in entries) if row is not None]
    done = {(r["optimizer"], r["multiplier"], r["rule"]) for r in reused}
    todo = [e for e in entries if (e["optimizer"], e["multiplier"], e["rule"]) not in done]

    def said(event):
        if event.get("kind") == "race":
            print(f"  {event['optimizer']:>5}, {event['multiplier']:g} × base, {event['rule']:>6} rule, "
                  f"lr {event['lr']:.3g}: " + ("diverged" if event["diverged"] else
                                               f"held-out accuracy {event['eval_accuracy']:.3f}"))

    print(f"{len(todo)} runs of {lb.Config.PRESETS[preset]['epochs']} epochs at B = {batch:,}, two at a "
          f"time ({len(reused)} more taken from the grid above):")
    t0 = time.perf_counter()
    rows = [r for mine in warm_cluster(2).run(lbr.race_job, todo, on_event=said) for r in mine] + reused
    seconds = time.perf_counter() - t0
    best = lbr.best(rows)
    small = grid_runs.get(("lamb", lb.BASE_BATCH))
    small_acc = None if small is None or small["diverged"] else small["eval_accuracy"]
    display(plots.large_batch.race(rows, batch, small_acc))
    print(f"\neach optimizer's best\n{'optimizer':<9} {'× base':>6} {'rule':>6} {'lr':>8} {'accuracy':>9}")
    edges = False
    for name, b in best.items():
        edge = b["lr"] in (min(r["lr"] for r in rows if r["optimizer"] == name),
                           max(r["lr"] for r in rows if r["optimizer"] == name))
        edges |= edge
        print(f"{name:<9} {b['multiplier']:>6g} {b['rule']:>6} {b['lr']:>8.3g} {b['eval_accuracy']:>9.3f}"
              + (" *" if edge else ""))
    if edges:
        print("*: at the edge of its sweep, where a larger budget might find better")
    print(f"accuracy: held-out. The race cost {len(todo)} runs, {seconds:.0f} s.")
    return {"rows": rows, "best": best, "seconds": seconds, "runs": len(todo),
            "small_batch_accuracy": small_acc}
