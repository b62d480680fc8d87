"""The pipeline bubble at P = 2 on the compute-dominated preset, against (P−1)/(M+P−1).

Interleaved 1F1B (2 chunks per rank) against (P−1)/(v·M+P−1). Busy time and wall clock side by side.
"""

from __future__ import annotations

from lesson_lib.runtime import Cluster


def measure(schedules=("gpipe", "1f1b", "interleaved"), microbatches=(4, 8), repeats: int = 3,
           steps: int | None = None) -> list[dict]:
    """The pipeline bubble at P = 2 on the compute-dominated preset, against (P−1)/(M+P−1) —
    interleaved 1F1B (2 chunks per rank) against its (P−1)/(v·M+P−1), without the rungs.

    ``repeats`` runs of every (schedule, M), interleaved on one warm 2-rank cluster. Per run, the
    medians over its steps (step 0 skipped) of the bubble replayed from busy time, measured on the
    wall clock, and the rungs of :func:`~lesson_lib.milestones.pipeline.schedules.bubble_breakdown`.
    One row per (schedule, M, run); ``busy_ratio`` and ``wall_ratio`` are bubble / formula.
    """
    from lesson_lib.experiments import run
    from lesson_lib.milestones import pipeline as pp

    preset = {"steps": steps} if steps else {}
    rows = []
    with Cluster(2, quiet=True) as cluster:
        for rep in range(repeats):
            for schedule in schedules:
                for m in microbatches:
                    chunks = {"chunks": 2} if schedule == "interleaved" else {}
                    cfg = pp.Config.from_preset("bubble", stages=2, microbatches=m, schedule=schedule,
                                                **chunks, **preset)
                    r = run("pipeline", cfg, cluster=cluster)
                    f, busy, wall = r["bubble_formula"], r["bubble_busy"], r["bubble_wall"]
                    b = {"stages": None, "messages": None, "per_stage": []} if schedule == "interleaved" \
                        else r["bubble_breakdown"]
                    rows.append({"schedule": schedule, "microbatches": m, "run": rep, "formula": f,
                                 "stages": b["stages"], "busy": busy, "messages": b["messages"], "wall": wall,
                                 "busy_ratio": busy / f, "wall_ratio": wall / f, "per_stage": b["per_stage"],
                                 "step_s": r.median_step_time(), "oversubscribed": cluster.oversubscribed})
    return rows


def show(rows: list[dict]) -> None:
    print("pipeline bubble, 2 stages, compute-dominated preset 'bubble', median over steps; interleaved: "
          "2 chunks per rank, formula (P−1)/(v·M+P−1), no rungs.\n"
          "  stages: replayed with each stage's mean forward and backward; busy: each action's busy time;\n"
          "  msgs: busy + each message's measured delay; wall: measured on the wall clock;\n"
          "  per stage, as shares of the step's window: off its core while computing, waiting in recv, "
          "between actions")
    print(f"{'schedule':>8} {'M':>2} {'run':>3} {'formula':>7} {'stages':>7} {'busy':>7} {'msgs':>7} "
          f"{'wall':>7} {'busy/f':>7} {'wall/f':>7} {'step ms':>8}  stage 0 / stage 1: off-core recv between")
    for r in rows:
        shares = " / ".join(f"{s['off_core']:.2f} {s['recv']:.2f} {s['between']:.2f}" for s in r["per_stage"])
        rung = {k: "      –" if r[k] is None else f"{r[k]:>7.3f}" for k in ("stages", "messages")}
        print(f"{r['schedule'][:8]:>8} {r['microbatches']:>2} {r['run']:>3} {r['formula']:>7.3f} "
              f"{rung['stages']} {r['busy']:>7.3f} {rung['messages']} {r['wall']:>7.3f} "
              f"{r['busy_ratio']:>7.2f} {r['wall_ratio']:>7.2f} {1e3 * r['step_s']:>8.0f}   {shares}")
    for key in dict.fromkeys((r["schedule"], r["microbatches"]) for r in rows):
        mine = [r for r in rows if (r["schedule"], r["microbatches"]) == key]
        lo_hi = {k: f"{min(r[k] for r in mine):.2f}–{max(r[k] for r in mine):.2f}"
                 for k in ("busy_ratio", "wall_ratio")}
        print(f"{key[0]:>8} M={key[1]}: busy/formula {lo_hi['busy_ratio']}, "
              f"wall/formula {lo_hi['wall_ratio']} over {len(mine)} runs")
    if rows and rows[0]["oversubscribed"]:
        print("note: more ranks than cores on this machine; wall-clock times include time-sharing")
