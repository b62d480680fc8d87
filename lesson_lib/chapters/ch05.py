"""Chapter 5 — large-batch training (notebooks/05_large_batch.ipynb).

Each function is one notebook cell's figure work: it runs real data-parallel training on a warm
cluster (``lesson_lib.milestones.large_batch``), draws, and returns measurements for the asserts.
"""

from __future__ import annotations

from IPython.display import display

from .. import plots
from ..experiments import Result, run, run_warm
from ..milestones import large_batch as lb
from .ch05_accumulate import compare as accumulation
from .ch05_exercises import exercises
from .ch05_race import race
from .ch05_race import recorded as race_recorded

__all__ = ["GRID", "accumulation", "epoch_cost", "exercises", "explorer", "grid", "noise_scale", "race",
           "race_recorded", "row", "run", "table", "trust_ratios"]

# The chapter's main experiment, on 2 ranks: LAMB at B₀, 32·B₀ and at 64·B₀ and 128·B₀, where its
# advantage ends; LARS at 32·B₀ (its trust ratios). LAMB's B₀ run also measures the noise scale. The
# other optimizers race at 32·B₀ on the same tuning budget (ch05_race).
GRID = {"lamb": (64, 2048, 4096, 8192), "lars": (2048,)}


def row(name: str, batch: int, r: Result) -> dict:
    """One line of the chapter's table, from a run."""
    epochs = r["steps"] / r["steps_per_epoch"]
    wall = sum(r.step_times()) / epochs
    busy = max(sum(s.busy_s for s in p.steps) for p in r.per_rank) / epochs
    return {"optimizer": name, "batch": batch, "lr": r.config["lr"], "steps": r["steps"],
            "eval_loss": r["eval_loss"], "eval_accuracy": r["eval_accuracy"], "diverged": r["diverged"],
            "epoch_wall_s": wall, "epoch_busy_s": busy, "grad_bytes_per_epoch": r["grad_bytes_per_epoch"],
            "grad_bytes_per_epoch_formula": r["grad_bytes_per_epoch_formula"]}


# LAMB at B₀ is 6,144 steps of 64 samples: one process takes each in about a quarter of a 2-rank
# step's time here (no all-reduce, no wait for the other rank) and trains the same model to float
# rounding (chapter 0). §4 counts the bytes on the wire per epoch, so B₀ also gets a short 2-rank run
# for it (benchmarks/cell-times.md has the cell's time before and after).
ONE_PROCESS = (("lamb", 64),)


def grid(batches: dict | None = None, preset: str = "long", noise_run=("lamb", 64),
         one_process=ONE_PROCESS, wire_epochs: int = 1, **options) -> dict:
    """Each optimizer at each of its batches (``batches``: optimizer → batches, default :data:`GRID`),
    live; then the figures. ``noise_run``'s run also measures B_simple. The runs in ``one_process``
    train on one process, each with a 2-rank run of ``wire_epochs`` epochs for the wire.

    Returns the runs, their table ``rows`` and the ``wire`` rows (§4): every row from a 2-rank run."""
    # B₀'s 6,144 steps: a redraw every 2 s (not 0.25 s) keeps the kernel's share of the 2 cores small
    live = plots.common.LiveRuns("Large batches: loss per step, live", min_interval_s=2.0)
    display(live)
    cfgs = {(o, b): lb.at_batch(o, b, preset, noise_scale=(o, b) == tuple(noise_run), **options)
            for o, mine in (batches or GRID).items() for b in mine}
    cfgs = {k: (c.replace(world_size=1) if k in one_process else c).validate() for k, c in cfgs.items()}
    wire_cfgs = {k: lb.at_batch(*k, preset, epochs=wire_epochs, eval_every=wire_epochs, **options).validate()
                 for k, c in cfgs.items() if c.world_size == 1}  # all validated before any run
    runs = {(o, b): run_warm(cfg, live, f"{o}, B={b}" + (", one process" if cfg.world_size == 1 else ""))
            for (o, b), cfg in cfgs.items()}
    wire = {k: run_warm(cfg) for k, cfg in wire_cfgs.items()}
    rows = [row(o, b, r) for (o, b), r in runs.items()]
    note = plots.common.oversubscription_note(list(runs.values()), busy_shown=False)
    display(plots.large_batch.curves(runs, note))
    noise = runs.get(tuple(noise_run))
    b_simple = noise["evals"][-1].get("b_simple") if noise is not None and noise["evals"] else None
    display(plots.large_batch.quality_vs_batch(rows, lb.BASE_BATCH, b_simple))
    print(table(rows))
    if wire:
        print(f"one process: {', '.join(f'{o} at B={b}' for o, b in wire)}; on 2 ranks for §4's wire, "
              f"{wire_epochs} epoch{'s' if wire_epochs > 1 else ''} each")
    wire_rows = [row(o, b, wire.get((o, b), r)) for (o, b), r in runs.items()]
    return {"runs": runs, "rows": rows, "wire": wire_rows}


def noise_scale(result: Result, batches=(64, 2048, 8192)):
    """B_simple = tr(Σ)/|G|² at each evaluation of ``result``'s run (one measured with noise_scale)."""
    evals = [e for e in result["evals"] if "b_simple" in e]
    display(plots.large_batch.noise_scale(evals, batches))
    return [(e["epoch"], e["b_simple"]) for e in evals]


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


def explorer(preset: str = "laptop"):
    """Optimizer, batch (only batches that divide the data and the ranks), rate, warm-up → a run
    on ``preset``'s budget (the laptop's 8 epochs: a click takes seconds; "long" is the chapter's)."""
    import ipywidgets as W

    from .. import widgets

    laptop = lb.Config.PRESETS[preset]
    batches = [b for b in (32, 64, 128, 256, 512, 1024, 2048, 4096)
               if b <= laptop["samples"] and b % laptop["world_size"] == 0]

    def go(optimizer, batch, lr, warmup_steps):
        cfg = lb.at_batch(optimizer, batch, preset, lr=lr, warmup_steps=warmup_steps)  # validated first
        live = plots.common.LiveRuns(f"{optimizer}, B={batch}, lr={lr:.3g}, warm-up {warmup_steps} steps")
        display(live)
        r = run_warm(cfg, live, f"{cfg.optimizer}, B={cfg.global_batch}")
        print(table([row(optimizer, batch, r)]))

    controls = {
        "optimizer": W.Dropdown(options=list(lb.BASE_LR), value="lamb", description="optimizer"),
        "batch": W.Dropdown(options=batches, value=512, description="global batch"),
        "lr": W.FloatLogSlider(value=lb.scaled_lr("lamb", 512), base=10, min=-4, max=3, step=0.1,
                               description="peak lr", readout_format=".3g"),
        "warmup_steps": W.IntSlider(value=12, min=0, max=200, description="warm-up steps"),
    }

    def rescale(_=None):
        """A new optimizer or batch starts from its own scaled rate and a warm-up of a tenth of the steps."""
        cfg = lb.at_batch(controls["optimizer"].value, controls["batch"].value, preset)
        controls["warmup_steps"].max = max(cfg.steps, 1)
        controls["lr"].value, controls["warmup_steps"].value = cfg.lr, cfg.warmup_steps

    for name in ("optimizer", "batch"):
        controls[name].observe(rescale, names="value")
    rescale()
    return widgets.run_button("Train", controls, go)
