"""ZB-H1 (Qi et al., 2024, "Zero Bubble Pipeline Parallelism"), as pure functions beside 1F1B.

A backward splits into **B** (gradient w.r.t. the stage's input, which stage k−1 waits for) and
**W** (weight gradients, which only the optimizer waits for). Actions: ``("F", i)``, ``("B", i)``,
``("W", i)``. ZB-H1 (§2.1): 1F1B's P − k − 1 warm-up forwards, then F and B in turn; from its k-th B
on, each B is followed by the oldest pending W, so stage k defers k W's into 1F1B's idle tail
without raising the peak memory. Same order as torch's ``ScheduleInterleavedZeroBubble`` with one
stage per rank (the tests compare them).

With F = B = W and M ≥ P the idle time per stage falls from 3(P − 1) to P − 1 (:func:`bubble`).
"""

from __future__ import annotations

from fractions import Fraction

from .schedules import run_in_order, stage_actions

SCHEDULE = "zb-h1"  # the name Config.schedule takes
Action = tuple[str, int]  # ("F" | "B" | "W", micro-batch)


def zb_h1_actions(stages: int, microbatches: int, stage: int) -> list[Action]:
    """Stage ``stage``'s ordered actions in one step of ZB-H1."""
    for name, value in (("stages", stages), ("microbatches", microbatches)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if not 0 <= stage < stages:
        raise ValueError(f"stage must be in 0..{stages - 1}, got {stage}")
    M, warmup = microbatches, min(stages - stage - 1, microbatches)
    actions, w = [("F", i) for i in range(warmup)], 0
    for j in range(M):  # the j-th B: after a forward while forwards remain, then alone (cool-down)
        if warmup + j < M:
            actions.append(("F", warmup + j))
        actions.append(("B", j))
        if j >= stage:  # stage k holds k W's back, to fill the tail
            actions.append(("W", w))
            w += 1
    return actions + [("W", i) for i in range(w, M)]


def all_zb_h1(stages: int, microbatches: int) -> list[list[Action]]:
    return [zb_h1_actions(stages, microbatches, k) for k in range(stages)]


def split_1f1b(stages: int, microbatches: int) -> list[list[Action]]:
    """1F1B with each backward written as its B then its W, at once: 1F1B's order, in ZB's actions."""
    return [[a for x, i in stage_actions("1f1b", stages, microbatches, k)
             for a in ([(x, i)] if x == "F" else [("B", i), ("W", i)])] for k in range(stages)]


def replay(actions: list[list[Action]], durations: dict, whole_backward: bool = False) -> dict:
    """Run a schedule of F, B and W on the ideal machine (a core per stage, free messages).
    ``durations[(stage, kind, i)]``; ``whole_backward``: 1F1B as run, so stage k's B(i) waits for
    stage k+1's W(i). Returns ``{(stage, kind, i): (start, end)}``; ``ValueError`` on deadlock."""
    n, sent_after = len(actions), "W" if whole_backward else "B"

    def deps(key):
        k, kind, i = key
        need = {"F": [(k - 1, "F", i)], "B": [(k, "F", i), (k + 1, sent_after, i)], "W": [(k, "B", i)]}[kind]
        return [d for d in need if 0 <= d[0] < n]

    return run_in_order([[(k, *a) for a in acts] for k, acts in enumerate(actions)], deps, durations)


def equal_durations(actions: list[list[Action]], f=1, b=1, w=1) -> dict:
    """The paper's assumption by default: F = B = W = 1 unit (a whole backward is 2)."""
    t = {"F": f, "B": b, "W": w}
    return {(k, x, i): t[x] for k, a in enumerate(actions) for x, i in a}


def idle(spans: dict) -> dict:
    """A replay's ``makespan``, each stage's ``idle`` time, the step's ``idle_share`` (what Qi et al.,
    2023, §5.3 call the *bubble rate*, (cost − work)/cost) and ``idle_over_work``, exact where the
    durations are fractions."""
    start = min(s for s, _ in spans.values())
    makespan = max(e for _, e in spans.values()) - start
    work = {}
    for (k, _, _), (s, e) in spans.items():
        work[k] = work.get(k, 0) + (e - s)
    per_stage = [makespan - work[k] for k in sorted(work)]
    share = Fraction(sum(per_stage)) / (len(work) * makespan)
    return {"makespan": makespan, "idle": per_stage, "idle_share": share,
            "idle_over_work": Fraction(sum(per_stage)) / sum(work.values())}


def bubble(stages: int, microbatches: int, f=1, b=1, w=1) -> dict:
    """The paper's bubbles per stage at M ≥ P: 1F1B's (P − 1)(F + B + W), ZB-H1's (P − 1)(F + B − W)."""
    P, M = stages, microbatches
    return {"1f1b": (P - 1) * (f + b + w), SCHEDULE: (P - 1) * (f + b - w), "work": M * (f + b + w)}


def max_in_flight(actions: list[Action]) -> int:
    """Most micro-batches whose F is done and W is not (a stage keeps each one's graph until its W)."""
    live = peak = 0
    for kind, _ in actions:
        live += {"F": 1, "B": 0, "W": -1}[kind]
        peak = max(peak, live)
    return peak


def messages(actions: list[list[Action]]) -> dict:
    """Messages of one step: an activation per F but the last stage's, a gradient per B but the first's."""
    P = len(actions)
    return {"activations": sum(1 for k, a in enumerate(actions) for x, _ in a if x == "F" and k < P - 1),
            "grads": sum(1 for k, a in enumerate(actions) for x, _ in a if x == "B" and k > 0)}


# --------------------------------------------------------------------------- a run on real ranks


def _key(e: dict) -> tuple[int, str, int]:
    return e["rank"], e["kind"][0].upper(), e["microbatch"]  # forward, backward (B), weight (W)


def measured_bubbles(actions: list[list[Action]], events: list[dict], step: int) -> dict:
    """One step on real ranks: wall-clock and busy-time replayed idle shares (as
    :func:`.schedules.step_bubbles`)."""
    comp = [e for e in events if e["step"] == step and e["kind"] in ("forward", "backward", "weight")]
    wall = {_key(e): (e["start"], e["end"]) for e in comp}
    busy = replay(actions, {_key(e): e["busy"] for e in comp})
    return {"step": step, "wall": float(idle(wall)["idle_share"]), "busy": float(idle(busy)["idle_share"])}


def replayed_events(spans: dict) -> list[dict]:
    """A replay as timeline events for :func:`lesson_lib.plots.pipeline.pipeline_gantt`."""
    kind = {"F": "forward", "B": "backward", "W": "weight"}
    return [{"rank": k, "kind": kind[x], "microbatch": i, "step": 0, "start": float(s), "end": float(e),
             "busy": float(e - s)} for (k, x, i), (s, e) in sorted(spans.items(), key=lambda kv: kv[1][0])]
