"""Chapter 3 §5, zero bubble (notebooks/03_pipeline_parallelism.ipynb): ZB-H1 (Qi et al., 2024)
replayed beside 1F1B on the ideal machine, then run on real ranks and checked against one process.
"""

from __future__ import annotations

import statistics
from fractions import Fraction

from IPython.display import display

from .. import numerics, plots
from ..experiments import Result, run_warm
from ..milestones import pipeline as pp
from ..milestones.pipeline import zero_bubble as zb
from ..runtime import warm_cluster
from .ch03_memory import print_table


def _replays(P: int, M: int) -> dict:
    """One step at F = B = W = 1, replayed three ways: 1F1B as it runs (one backward call: the
    gradient leaves after W), 1F1B's order with the gradient sent after B, and ZB-H1."""
    one, z = zb.split_1f1b(P, M), zb.all_zb_h1(P, M)
    return {"1f1b": zb.replay(one, zb.equal_durations(one), whole_backward=True),
            "1f1b, B sent first": zb.replay(one, zb.equal_durations(one)),
            zb.SCHEDULE: zb.replay(z, zb.equal_durations(z))}


def zero_bubble(stages: int = 4, microbatches=(2, 4, 8), shown: int = 8) -> dict:
    """ZB-H1 beside 1F1B at the paper's F = B = W = 1 (a whole backward is 2): per M, each stage's
    idle time, the step, the idle share (the paper's bubble rate) and idle over work, replayed; the
    micro-batches each stage holds and the messages, counted in the schedules. Draws M = ``shown``."""
    P, rows, panels = stages, [], {}
    for M in microbatches:
        spans = _replays(P, M)
        got = {name: zb.idle(s) for name, s in spans.items()}
        ideal = zb.bubble(P, M)
        rows.append({"microbatches": M, **got, "paper": ideal,
                     "third": Fraction(got[zb.SCHEDULE]["idle"][0], got["1f1b"]["idle"][0]),
                     "in_flight": {"1f1b": [zb.max_in_flight(a) for a in zb.split_1f1b(P, M)],
                                   zb.SCHEDULE: [zb.max_in_flight(a) for a in zb.all_zb_h1(P, M)]},
                     "messages": {"1f1b": zb.messages(zb.split_1f1b(P, M)),
                                  zb.SCHEDULE: zb.messages(zb.all_zb_h1(P, M))}})
        if M == shown:  # drawn: 1F1B as it runs beside ZB-H1
            for name, label in (("1f1b", "1F1B: one backward, B then W, the gradient sent after both"),
                                (zb.SCHEDULE, "ZB-H1: B sent at once, W held back to fill the tail")):
                panels[f"{label} — each stage idle {got[name]['idle'][0]} of {got[name]['makespan']}"] = \
                    zb.replayed_events(spans[name])
    print(f"P = {P} stages, F = B = W = 1 (one whole backward = 2). Idle: per stage, in units of F, for\n"
          "1F1B, 1F1B with B's gradient sent first, and ZB-H1. step and idle ÷ work:\n"
          "1F1B → ZB-H1. held: micro-batches each stage keeps from F to W, 1F1B / ZB-H1.")
    print_table(["M", "1F1B", "B first", "ZB-H1", "ZB-H1/1F1B", "step", "idle ÷ work", "held"],
                [[str(r["microbatches"]), str(r["1f1b"]["idle"][0]), str(r["1f1b, B sent first"]["idle"][0]),
                  str(r[zb.SCHEDULE]["idle"][0]), str(r["third"]),
                  f"{r['1f1b']['makespan']} → {r[zb.SCHEDULE]['makespan']}",
                  f"{r['1f1b']['idle_over_work']} → {r[zb.SCHEDULE]['idle_over_work']}",
                  " / ".join(" ".join(map(str, r["in_flight"][name])) for name in ("1f1b", zb.SCHEDULE))]
                 for r in rows])
    display(plots.pipeline.pipeline_gantt(
        panels, P, f"{P} stages, {shown} micro-batches on the ideal machine, F = B = W = 1: "
                   "blue F, green B (the input's gradient), purple W (the weights')",
        unit="time, in units of one F (F = B = W)"))
    return {"stages": P, "rows": rows}


def _messages(r: Result) -> dict:
    """Messages sent per micro-batch, summed over the ranks, as the link counted them."""
    calls = {op: sum(p.ops.get(op, {"calls": 0})["calls"] for p in r.per_rank)
             for op in ("send_activation", "send_grad")}
    return {op: n / (r.config["steps"] * r["microbatches_run"]) for op, n in calls.items()}


def timeline(r: Result, title: str):
    """One step of a ZB-H1 run as measured; when ranks outnumber cores, also replayed from busy time."""
    cfg = pp.Config(**r.config)
    steps = r["bubble_per_step"][1:] or r["bubble_per_step"]
    step = sorted(steps, key=lambda s: s["busy"])[len(steps) // 2]["step"]  # the median step
    comp = [e for e in r["events"] if e["step"] == step]
    panels = {f"measured: wall clock, step {step} (bubble {r['bubble_per_step'][step]['wall']:.0%})": comp}
    if r.oversubscribed:
        busy = {(e["rank"], e["kind"][0].upper(), e["microbatch"]): e["busy"] for e in comp
                if e["kind"] in ("forward", "backward", "weight")}
        spans = zb.replay(zb.all_zb_h1(cfg.stages, cfg.m), busy)
        label = (f"replayed from each action's busy (CPU) time, as if every stage had its own core "
                 f"(bubble {r['bubble_per_step'][step]['busy']:.0%})")
        panels[label] = [{**e, "busy": e["end"] - e["start"]} for e in zb.replayed_events(spans)]
    return plots.pipeline.pipeline_gantt(panels, cfg.stages, title, plots.common.oversubscription_note([r]))


def zero_bubble_run(stages: int = 4, microbatches: int = 4, against: Result | None = None) -> dict:
    """ZB-H1 on real ranks: the ``tiny`` model against one process (and against 1F1B, bit for bit),
    then the ``laptop`` model timed, its messages counted beside ``against`` (a 1F1B run of the same
    shape, e.g. §4's)."""
    P, M = stages, microbatches
    cfg = pp.Config.tiny(stages=P, microbatches=M, schedule=zb.SCHEDULE)
    outs = warm_cluster(P).run(pp.worker, cfg)
    ours, ref = pp.state(outs), pp.reference(cfg)
    gaps = pp.gaps(ours, ref)
    one = pp.state(warm_cluster(P).run(pp.worker, cfg.replace(schedule="1f1b")))
    same = {key: pp.gaps(ours, one)[key] == 0 for key in ("losses", "params", "grads")}
    tol = numerics.pipeline_tolerance(microbatches=M, steps=cfg.steps, depth=cfg.depth)
    print(f"zb-h1, {P} ranks, M = {M}: largest difference from one process — losses {gaps['losses']:.1e}, "
          f"gradients {gaps['grads']:.1e},\nparameters {gaps['params']:.1e} (tolerance {tol:.1e}); "
          f"bit for bit 1F1B's: {all(same.values())}")
    # three steps: step 0 pays one-off costs, the bubble is the median of steps 1 and 2
    r = run_warm(pp.Config.from_preset("laptop", stages=P, microbatches=M, schedule=zb.SCHEDULE, steps=3))
    msgs = {zb.SCHEDULE: _messages(r), **({"1f1b": _messages(against)} if against is not None else {})}
    for name, m in msgs.items():
        print(f"{name:>5}: messages per micro-batch, all ranks — activations {m['send_activation']:g}, "
              f"gradients {m['send_grad']:g}")
    one_line = (f"\n1F1B (§4's run): {against['bubble_wall']:.0%} wall, {against['bubble_busy']:.0%} busy"
                if against is not None else "")
    busy = {x: 1e3 * statistics.median(e["busy"] for e in r["events"] if e["kind"] == kind and e["step"])
            for x, kind in (("F", "forward"), ("B", "backward"), ("W", "weight"))}
    print("busy time per action, median over stages and steps: " + ", ".join(f"{x} {t:.2f} ms"
                                                                             for x, t in busy.items()))
    print(f"bubble, median step: zb-h1 {r['bubble_wall']:.0%} on the wall clock, {r['bubble_busy']:.0%} "
          f"replayed from busy time (F = B = W: {r['bubble_formula']:.0%}){one_line}")
    display(timeline(r, f"zb-h1 on real ranks, {P} stages, {M} micro-batches: one step (green B, purple W)"))
    return {"gaps": gaps, "tolerance": tol, "same_as_1f1b": same, "messages": msgs, "run": r, "busy_ms": busy,
            "max_in_flight": [o["max_in_flight"] for o in outs]}
