"""Chapter 3 — pipeline parallelism (notebooks/03_pipeline_parallelism.ipynb).

One function per notebook cell: each runs the pipeline milestone in real processes on warm
clusters, displays its figures and returns what the notebook asserts.
"""

from __future__ import annotations

import statistics
from fractions import Fraction

from IPython.display import display

from .. import plots, widgets
from ..costmodel.terms import bubble_formula
from ..exercises import Exercise
from ..experiments import Result, run_warm
from ..milestones import pipeline as pp
from ..milestones.pipeline import interleaved as il
from ..milestones.pipeline import torch_ref
from ..milestones.pipeline.schedules import (
    SCHEDULES,
    all_actions,
    replayed_events,
)
from ..runtime import warm_cluster
from .ch03_exercises import exercises as _exercises
from .ch03_gpipe import microbatch_indices, stage_setup  # noqa: F401  (the notebook's cells use them)
from .ch03_memory import activation_memory, print_table, recomputation  # noqa: F401  (§6's cells)
from .ch03_zero_bubble import zero_bubble, zero_bubble_run  # noqa: F401  (§5's zero-bubble cells)


def _cfg(stages: int, microbatches: int, schedule: str, preset: str = "laptop", **options) -> pp.Config:
    return pp.Config.from_preset(preset, stages=stages, microbatches=microbatches, schedule=schedule,
                                 **options)


def _shown_step(r: Result) -> int:
    """The step drawn as 'one step': the one whose busy-time bubble is the median (not step 0)."""
    steps = r["bubble_per_step"][1:] or r["bubble_per_step"]
    return sorted(steps, key=lambda s: s["busy"])[len(steps) // 2]["step"]


def timeline(r: Result, title: str):
    """One step of ``r`` as measured; when ranks outnumber cores, also replayed from busy time."""
    cfg = pp.Config(**r.config)
    step = _shown_step(r)
    panels = {f"measured: wall clock, step {step} (bubble {r['bubble_per_step'][step]['wall']:.0%})":
              [e for e in r["events"] if e["step"] == step]}
    if r.oversubscribed:
        label = (f"replayed from each action's busy (CPU) time, as if every stage had its own core "
                 f"(bubble {r['bubble_per_step'][step]['busy']:.0%})")
        actions = all_actions(cfg.schedule, cfg.stages, cfg.m)
        panels[label] = replayed_events(actions, r["events"], step)
    return plots.pipeline.pipeline_gantt(panels, cfg.stages, title, plots.common.oversubscription_note([r]))


def split(stages: int = 4, balance: str = "params") -> dict:
    """Which layers each stage holds, and the parameter memory each stage measures."""
    r = run_warm(_cfg(stages, 4, "1f1b", steps=2, balance=balance))
    mem = r["stage_memory"]
    costs = ", ".join(f"{c:.3g}" for c in r["layer_costs"])
    print(f"cost per layer ({'parameters' if balance == 'params' else 'busy seconds, measured'}): {costs}")
    for m in mem:
        print(f"stage {m['stage']}: layers {m['layers'][0]}–{m['layers'][1] - 1}, "
              f"{m['param_bytes'] / 1e6:.1f} MB of parameters")
    print(f"the unsplit model: {r['unsplit_param_bytes'] / 1e6:.1f} MB")
    how = "parameter count" if balance == "params" else "measured time"
    display(plots.pipeline.stage_params(mem, r["unsplit_param_bytes"],
                                        f"Parameter memory per stage, {stages} stages (balanced by {how})"))
    return {"stage_bytes": [m["param_bytes"] for m in mem], "unsplit_bytes": r["unsplit_param_bytes"]}


def equivalence(stages: int = 4, microbatches: int = 4) -> dict:
    """Every schedule against single-process SGD of the unsplit model on the whole batch."""
    out = {}
    for schedule in SCHEDULES:
        out[schedule] = g = pp.verify(_cfg(stages, microbatches, schedule, "tiny"), warm_cluster(stages))
        print(f"{schedule:>6}: largest difference from one process — losses {g['losses']:.1e}, "
              f"gradients {g['grads']:.1e}, parameters {g['params']:.1e}")
    return out


def live(stages: int = 4, microbatches: int = 4, schedule: str = "gpipe") -> Result:
    """The timeline drawn live as the stages report each step, then one step up close. The
    configuration is checked before the figure is drawn: bad input raises with no empty figure."""
    cfg = _cfg(stages, microbatches, schedule).validate()
    gantt = plots.pipeline.LiveGantt(stages, f"{schedule}: {stages} stages, {microbatches} micro-batches, "
                                             "every step as it is measured (live)")
    display(gantt)
    r = run_warm(cfg, on_event=gantt.track())
    gantt.done()
    display(timeline(r, f"{schedule}, one step up close: numbers are micro-batches"))
    return r


def schedules(stages: int = 4, microbatches: int = 4) -> dict[str, Result]:
    """naive, GPipe and 1F1B on the same model and batch, one step of each."""
    runs = {}
    for schedule in SCHEDULES:
        runs[schedule] = r = run_warm(_cfg(stages, microbatches, schedule))
        m = r["microbatches_run"]
        display(timeline(r, f"{schedule}: {stages} stages, {m} micro-batch{'es' if m > 1 else ''} — "
                            f"formula bubble {r['bubble_formula']:.0%}"))
    return runs


def bubble_sweep(stages=(2, 4), microbatches=(1, 2, 4, 8), schedule: str = "1f1b",
                 steps: int = 3) -> list[dict]:
    """The measured bubble against M for each P, beside (P−1)/(M+P−1): the median of ``steps`` − 1
    steps (step 0 left out). The busy-time bubbles of neighbouring M differ by 9 points or more, so
    two steps a run tell them apart; eight runs of the preset's 5 steps cost Run All seconds
    (benchmarks/cell-times.md)."""
    rows, runs = [], []
    for p in stages:
        for m in microbatches:
            r = run_warm(_cfg(p, m, schedule, steps=steps))
            runs.append(r)
            rows.append({"stages": p, "microbatches": m, "wall": r["bubble_wall"],
                         "busy": r["bubble_busy"], "formula": r["bubble_formula"],
                         "step_ms": 1e3 * r.median_step_time()})
            print(f"P={p} M={m}: formula {rows[-1]['formula']:.0%}, measured {rows[-1]['wall']:.0%} "
                  f"(wall clock), {rows[-1]['busy']:.0%} (busy time); step {rows[-1]['step_ms']:.0f} ms")
    display(plots.pipeline.bubble_vs_microbatches(
        rows, f"The busy-time bubble shrinks as micro-batches grow ({schedule}); the wall clock adds "
              "waits for shared cores",
        plots.common.oversubscription_note(runs)))
    return rows


# Step 0 is left out and the one step after it is measured and drawn: each of the 4 runs costs
# Run All seconds (benchmarks/cell-times.md), and the cell's checks hold for any one step.
CAUSES_STEPS = 2


def bubble_causes(microbatches=(4, 8), schedule: str = "gpipe") -> list[dict]:
    """Where the idle time goes at P = 2 on the compute-dominated preset (``Config.from_preset("bubble")``):
    the bubble rebuilt one cause at a time, every rung measured in the same run
    (:func:`~lesson_lib.milestones.pipeline.schedules.bubble_breakdown`); then the same model with one
    hidden layer fewer, which 2 stages can only cut 7 + 8: unequal stages."""
    rows, runs, table, detail = [], [], [], []
    models = {"balanced": {}, "7 + 8 layers": {"depth": pp.Config.PRESETS["bubble"]["depth"] - 1}}
    for model, change in models.items():
        for m in microbatches:
            r = run_warm(_cfg(2, m, schedule, "bubble", steps=CAUSES_STEPS, **change))
            runs.append(r)
            b, f = r["bubble_breakdown"], r["bubble_formula"]
            rows.append({"label": f"{model}, M={m}", "model": model, "microbatches": m, "formula": f,
                         "pace": b["pace"],
                         **{k: b[k] for k in ("stages", "busy", "busy_bounds", "wall", "per_stage")}})
            d = [1e3 * x for x in r["message_delays_s"]]  # sorted
            fwd = statistics.median(e["busy"] for e in r["events"] if e["kind"] == "forward" and e["step"])
            per = b["per_stage"]
            lo, hi = b["busy_bounds"]
            table.append([f"{model}, M={m}", f"{f:.1%}", f"{b['stages']:.1%}",
                          f"{b['busy']:.1%} ({max(lo, 0):.0%}–{hi:.0%})",
                          f"{b['wall']:.1%}", f"{b['pace']:.3f}"])
            detail.append([f"{model}, M={m}", " / ".join(f"{1e3 * s['forward']:.1f}+{1e3 * s['backward']:.1f}"
                                                         for s in per),
                           " / ".join(f"{s['off_core']:.0%}" for s in per),
                           f"{statistics.median(d):.2f} / {d[int(0.9 * (len(d) - 1))]:.2f} / {d[-1]:.2f}",
                           f"{1e3 * fwd:.1f}"])
    print("The bubble, one cause at a time, as a share of the step.\n"
          "pace = (slowest F + slowest B) ÷ (the mean stage's F + B)")
    print_table(["run", "formula", "+ unequal", "+ variation (range)", "wall", "pace"], table)
    print("\nPer stage (0 / 1): busy ms of a forward + a backward, and the share off its core.\n"
          "Messages: ms from the neighbour finishing to the message landing (median / p90 / max).")
    print_table(["run", "F + B busy ms", "off its core", "message ms", "one F ms"], detail)
    display(plots.pipeline.bubble_causes(
        rows, f"{schedule}, 2 stages: the bubble rebuilt one cause at a time",
        plots.common.oversubscription_note(runs)))
    return rows


def interleaving(stages: int = 4, microbatches: int = 8, chunks=(1, 2, 4), shown: int = 2) -> dict:
    """Interleaved 1F1B (Narayanan et al., 2021) on the ideal machine, F = 1 and B = 2 per whole
    stage (1/v and 2/v per chunk): 1F1B's replayed timeline beside v = ``shown``'s, then per v the
    replayed bubble, the formula, the messages and what each rank holds — all from the schedule."""
    P, M, rows, panels = stages, microbatches, [], {}
    for v in chunks:
        acts = il.all_interleaved(P, M, v)
        spans = il.replay_interleaved(acts, il.equal_durations(acts, v))
        n = il.messages(acts, v)
        rows.append({"chunks": v, "replayed": il.exact_idle_share(spans),
                     "formula": bubble_formula(P, M, v),
                     "makespan": max(e for _, e in spans.values()),
                     "per_microbatch": {k: Fraction(c, M) for k, c in n.items()},
                     "in_flight": [il.max_in_flight(a) for a in acts],
                     "bound": [il.in_flight_bound(P, M, v, r) for r in range(P)]})
        if v in (1, shown):
            name = "1F1B" if v == 1 else f"interleaved 1F1B, v = {v} chunks per rank"
            panels[f"{name}: replayed, bubble {float(rows[-1]['replayed']):.1%}"] = il.replayed_events(spans)
    print("v: chunks per rank. bubble: replayed, and the formula (P−1)/(vM+P−1). step: in units of one\n"
          "whole stage's F. messages: per micro-batch, each way. held: chunks in flight, ranks 0 … P−1;\n"
          "rank 0's, in whole stages.")
    print_table(["v", "replayed", "formula", "step", "messages", "held", "rank 0, stages"],
                [[str(r["chunks"]), f"{float(r['replayed']):.2%}", f"{r['formula']:.2%}",
                  f"{float(r['makespan']):.3g}", str(r["per_microbatch"]["activations"]),
                  " ".join(map(str, r["in_flight"])), f"{r['in_flight'][0] / r['chunks']:.3g}"]
                 for r in rows])
    display(plots.pipeline.pipeline_gantt(
        panels, P, f"{P} stages, {M} micro-batches on the ideal machine: numbers are micro-batches, "
                   "shades are chunks", unit="time, in forwards of one whole stage (F = 1, B = 2)"))
    return {"stages": P, "microbatches": M, "rows": rows}


def against_torch(stages: int = 4, microbatches: int = 4) -> dict:
    """Our GPipe and 1F1B beside ``torch.distributed.pipelining``'s, same stages and batches."""
    out = {}
    for schedule in ("gpipe", "1f1b"):
        cfg = _cfg(stages, microbatches, schedule, "tiny")
        out[schedule] = c = torch_ref.compare(cfg, warm_cluster(stages))
        if "error" in c:
            print(f"{schedule}: torch.distributed.pipelining failed here: {c['error']}")
            continue
        g, t = c["ours_vs_torch"], c["torch_vs_reference"]
        print(f"{schedule:>5}: ours vs torch — losses {g['losses']:.1e}, gradients {g['grads']:.1e}, "
              f"parameters {g['params']:.1e};\n       torch vs one process — parameters {t['params']:.1e}")
    return out


def explorer():
    import ipywidgets as W

    def go(stages, microbatches, schedule, balance):
        r = run_warm(_cfg(stages, microbatches, schedule, balance=balance))
        display(timeline(r, f"{schedule}: {stages} stages, {r['microbatches_run']} micro-batch(es)"))
        print(f"bubble: formula {r['bubble_formula']:.0%}; median over the steps after the first "
              f"{r['bubble_wall']:.0%} (wall clock), {r['bubble_busy']:.0%} (busy time)\n(the figure "
              f"draws one step, its own bubble in its title); peak activations per stage "
              f"{[round(s['activation_peak'] / 1e6, 2) for s in r['stage_memory']]} MB")

    return widgets.run_button("Run", {
        "stages": W.IntSlider(value=4, min=1, max=4, description="stages P"),
        "microbatches": W.Dropdown(options=[1, 2, 4, 8, 16], value=4, description="micro-batches"),
        "schedule": W.ToggleButtons(options=list(SCHEDULES), value="1f1b", description="schedule"),
        "balance": W.ToggleButtons(options=["params", "time"], value="params", description="balance by"),
    }, go)


def exercises(stages: int = 4) -> dict[str, Exercise]:
    """The chapter's exercises (defined in :mod:`.ch03_exercises`); smallest_m checks with a real run."""
    return _exercises(stages)
