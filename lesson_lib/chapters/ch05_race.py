"""Chapter 5 §3: the fair race at 32·B₀ — every optimizer's sweep of the same tuning budget
(:mod:`lesson_lib.milestones.large_batch_race`), its best beside LAMB at B₀."""

from __future__ import annotations

import datetime
import json
import os
import platform
import time
from pathlib import Path

from IPython.display import display

from .. import plots
from ..milestones import large_batch as lb
from ..milestones import large_batch_race as lbr
from ..runtime import warm_cluster
from ..runtime.output import notice_scope, reserve

# The race's last result, shown until its button is pressed; a source checkout's benchmarks/records.
RECORD = Path(__file__).resolve().parents[2] / "benchmarks" / "records" / "ch05-race.json"
COMMAND = "python benchmarks/record_ch05_race.py"
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


def _run(grid_runs: dict, batch: int, preset: str) -> dict:
    """Every optimizer's sweep at ``batch``, two single-process runs at a time; an entry the grid
    already trained (``grid_runs``: (optimizer, batch) → Result) is taken from there."""
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
    return {"rows": rows, "best": lbr.best(rows), "seconds": time.perf_counter() - t0, "runs": len(todo),
            "batch": batch, "preset": preset}


def _show(fair: dict, small_acc: float | None) -> None:
    """The race's figure and each optimizer's best, from a live run or the record alike."""
    rows, best = fair["rows"], fair["best"]
    display(plots.large_batch.race(rows, fair["batch"], small_acc))
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


def _small(grid_runs: dict) -> float | None:
    small = grid_runs.get(("lamb", lb.BASE_BATCH))
    return None if small is None or small["diverged"] else small["eval_accuracy"]


def race(grid_runs: dict | None = None, batch: int = 2048, preset: str = "long") -> dict:
    """The race, live: draws it and prints each sweep; returns its rows, each optimizer's best and
    what it cost."""
    grid_runs = grid_runs or {}
    fair = _run(grid_runs, batch, preset)
    _show(fair, _small(grid_runs))
    print(f"accuracy: held-out. The race cost {fair['runs']} runs, {fair['seconds']:.0f} s.")
    return fair | {"small_batch_accuracy": _small(grid_runs)}


def recorded(grid_runs: dict | None = None, path: Path = RECORD) -> dict:
    """The race's last recorded result (``path``, written by :data:`COMMAND`), drawn as :func:`race`
    draws it, and a button that reruns it live. Returns the record: rows, best and how it was made."""
    import ipywidgets as W

    if not path.exists():
        raise FileNotFoundError(f"no recorded race at {path}: run `{COMMAND}` from a source checkout, "
                                "or ch05.race(out['runs']) to run it here")
    fair = json.loads(path.read_text())
    grid_runs = grid_runs or {}
    print(f"Recorded on {fair['date']} ({fair['machine']}, {fair['nproc']} cores, 1-minute load "
          f"{fair['load_1min']}) by `{fair['command']}`: {fair['runs']} single-process runs, "
          f"{fair['seconds']:.0f} s.\nThe line for LAMB at B₀ is this kernel's grid run above.")
    _show(fair, _small(grid_runs))
    button = W.Button(description="Rerun the race here, live",
                      layout=W.Layout(width="auto"))  # not "primary": the chapter's control is the explorer
    out = W.Output()

    def click(_):
        out.clear_output(wait=True)
        with out, notice_scope(object()):
            reserve()  # the clusters' banners above the race's figure, not among its lines
            race(grid_runs, fair["batch"], fair["preset"])

    button.on_click(click)
    display(W.VBox([button, out]))
    return fair


def record(path: Path = RECORD, batch: int = 2048, preset: str = "long") -> dict:
    """Run every entry of the race (none taken from a grid) and write it to ``path`` with its date,
    machine and command: what :func:`recorded` shows until its button is pressed."""
    load = round(os.getloadavg()[0], 2)
    fair = _run({}, batch, preset)
    fair |= {"date": datetime.date.today().isoformat(), "nproc": os.cpu_count(), "load_1min": load,
             "machine": f"{platform.system()} {platform.machine()}", "command": COMMAND}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(fair, indent=1) + "\n")  # a diverged run's loss is written Infinity
    return fair
