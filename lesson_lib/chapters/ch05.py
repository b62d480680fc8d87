"""Chapter 5 — large-batch training (notebooks/05_large_batch.ipynb).

Each function is one notebook cell's figure work: it runs real data-parallel training on a warm
cluster (``lesson_lib.milestones.large_batch``), draws, and returns measurements for the asserts.
"""

from __future__ import annotations

import math

from IPython.display import display

from .. import plots
from ..experiments import Result, run
from ..milestones import large_batch as lb
from ..runtime import warm_cluster
from .ch05_exercises import exercises  # noqa: F401  (the notebook calls it here)

# The laptop preset: a 6-layer, 91k-parameter MLP; 8 epochs of 8,192 samples on 2 ranks.
PRESET = {"world_size": 2, "samples": 8192, "eval_samples": 2048, "epochs": 8, "hidden": 128,
          "depth": 6}
BASE_BATCH = 64
# Tuned once at B₀ = 64 for this task (a short sweep), then only scaled by the rule, never retuned.
BASE_LR = {"sgd": 0.1, "adam": 2e-3, "lars": 2.0, "lamb": 5e-3}
# SGD and LARS: the linear rule (Goyal et al., 2017; You, Gitman & Ginsburg, 2017);
# Adam and LAMB: the square-root rule (You et al., ICLR 2020 use it for LAMB).
RULE = {"sgd": "linear", "adam": "sqrt", "lars": "linear", "lamb": "sqrt"}
WEIGHT_DECAY = {"sgd": 0.0, "adam": 0.0, "lars": 5e-4, "lamb": 5e-4}


def scaled_lr(optimizer: str, batch: int, base_batch: int = BASE_BATCH) -> float:
    """The base rate scaled by the optimizer's rule: ×k (linear) or ×√k (square root), k = B/B₀."""
    k = batch / base_batch
    return BASE_LR[optimizer] * (k if RULE[optimizer] == "linear" else math.sqrt(k))


def config(optimizer: str = "lamb", batch: int = BASE_BATCH, **options) -> lb.Config:
    """The preset at ``batch`` with the scaled rate and a warm-up of a tenth of the steps."""
    base = {**PRESET, "optimizer": optimizer, "global_batch": batch,
            "lr": scaled_lr(optimizer, batch) if optimizer in BASE_LR else 1.0,
            "weight_decay": WEIGHT_DECAY.get(optimizer, 0.0), **options}
    cfg = lb.Config(**base).validate()
    if "warmup_steps" not in options:
        cfg = cfg.replace(warmup_steps=max(1, cfg.steps // 10))
    return cfg


__all__ = ["BASE_BATCH", "BASE_LR", "RULE", "config", "epoch_cost", "exercises", "explorer", "grid",
           "row", "run", "run_one", "scaled_lr", "table", "trust_ratios"]


def run_one(cfg: lb.Config, live: plots.common.LiveRuns | None = None, label: str | None = None) -> Result:
    on_event = live.track(label or f"{cfg.optimizer}, B={cfg.global_batch}", cfg.steps,
                          cfg.world_size) if live else None
    return run("large-batch", cfg, cluster=warm_cluster(cfg.world_size), on_event=on_event)


def row(name: str, batch: int, r: Result) -> dict:
    """One line of the chapter's table, from a run."""
    epochs = r["steps"] / r["steps_per_epoch"]
    wall = sum(r.step_times()) / epochs
    busy = max(sum(s["busy_s"] for s in p["steps"]) for p in r.per_rank) / epochs
    return {"optimizer": name, "batch": batch, "lr": r.config["lr"], "steps": r["steps"],
            "eval_loss": r["eval_loss"], "eval_accuracy": r["eval_accuracy"], "diverged": r["diverged"],
            "epoch_wall_s": wall, "epoch_busy_s": busy, "grad_bytes_per_epoch": r["grad_bytes_per_epoch"],
            "grad_bytes_per_epoch_formula": r["grad_bytes_per_epoch_formula"]}


def grid(optimizers=("sgd", "adam", "lars", "lamb"), batches=(64, 512, 2048), **options) -> dict:
    """Every optimizer at every batch, live; then the figures. Returns runs and table rows."""
    live = plots.common.LiveRuns("Large batches: loss per step, live")
    display(live)
    runs = {(o, b): run_one(config(o, b, **options), live) for o in optimizers for b in batches}
    rows = [row(o, b, r) for (o, b), r in runs.items()]
    note = plots.common.oversubscription_note(list(runs.values()))
    display(plots.large_batch.curves(runs, note))
    display(plots.large_batch.quality_vs_batch(rows, BASE_BATCH))
    print(table(rows))
    return {"runs": runs, "rows": rows}


def table(rows: list[dict]) -> str:
    lines = [f"{'optimizer':>9} {'batch':>6} {'lr':>9} {'steps':>6} {'held-out loss':>14} "
             f"{'accuracy':>9} {'s/epoch':>8}"]
    for r in rows:
        lines.append(f"{r['optimizer']:>9} {r['batch']:>6} {r['lr']:>9.4g} {r['steps']:>6} "
                     f"{r['eval_loss']:>14.3f} {r['eval_accuracy']:>9.3f} {r['epoch_wall_s']:>8.2f}")
    return "\n".join(lines)


def trust_ratios(result: Result, name: str):
    return plots.large_batch.trust_heatmap(
        result["trust_ratios"], f"{name}: trust ratio of each layer, every step")


def epoch_cost(rows: list[dict], optimizer: str = "lamb"):
    mine = [r for r in rows if r["optimizer"] == optimizer]
    return plots.large_batch.epoch_cost(mine)


def explorer():
    """Optimizer, batch (only batches that divide the data and the ranks), rate, warm-up → a run."""
    import ipywidgets as W

    from .. import widgets

    batches = [b for b in (32, 64, 128, 256, 512, 1024, 2048, 4096)
               if b <= PRESET["samples"] and b % PRESET["world_size"] == 0]

    def go(optimizer, batch, lr, warmup_steps):
        cfg = config(optimizer, batch, lr=lr, warmup_steps=warmup_steps)  # validated before any worker
        live = plots.common.LiveRuns(f"{optimizer}, B={batch}, lr={lr:.3g}, warm-up {warmup_steps} steps")
        display(live)
        r = run_one(cfg, live)
        print(table([row(optimizer, batch, r)]))

    return widgets.run_button("Train", {
        "optimizer": W.Dropdown(options=list(BASE_LR), value="lamb", description="optimizer"),
        "batch": W.Dropdown(options=batches, value=512, description="global batch"),
        "lr": W.FloatLogSlider(value=scaled_lr("lamb", 512), base=10, min=-4, max=1, step=0.1,
                               description="peak lr", readout_format=".3g"),
        "warmup_steps": W.IntSlider(value=12, min=0, max=200, description="warm-up steps"),
    }, go)
