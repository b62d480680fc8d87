"""The zero-bubble schedule ZB-H1 (Qi et al., 2024, ICLR, "Zero Bubble Pipeline Parallelism"), as pure
functions beside :mod:`.schedules`' 1F1B. Chapter 3 §5 replays it and runs it on real ranks
(:mod:`.zero_bubble_stage`).

A backward is two jobs: **B**, the gradient of the loss w.r.t. the stage's *input* — what stage k−1
waits for — and **W**, the gradients w.r.t. the stage's *weights*, which no other stage waits for
(only the optimizer step, at the end). An action is ``("F", i)``, ``("B", i)`` or ``("W", i)``:
stage k's F(i) needs stage k−1's F(i); its B(i) its own F(i) and stage k+1's B(i); its W(i) its own
B(i). In 1F1B one action does both, so stage k−1 also waits for stage k's W.

ZB-H1, the paper's "memory efficient schedule" (§2.1): stage k runs 1F1B's P − k − 1 warm-up
forwards, then one forward and one B in turn, then its remaining B's. Its j-th B (j = 0, 1, …) is
followed by a W — the oldest one not yet done — from j = k on, so stage k keeps k W's back; those W's
fill the tail of the step, where 1F1B idles. Every stage then has at most P micro-batches between
their F and their W, the number stage 0 holds in 1F1B, so the peak over the stages does not grow.
This is the order torch's ``ScheduleInterleavedZeroBubble`` builds with one stage per rank (its
``_get_1f1b_rank_ops`` with ``enable_zero_bubble``; the tests compare the two).

Under the paper's assumption F = B = W (a whole backward is 2 units) and M ≥ P, 1F1B — B and W one
action of 2 — leaves each stage idle for (P − 1)(F + B + W) = 3(P − 1); ZB-H1 for
(P − 1)(F + B − W) = P − 1: a third. Against the M·(F + B + W) of work, the paper's bubble rate
falls from (P − 1)/M to (P − 1)/(3M); as the idle share of each stage's step, from (P − 1)/(M + P − 1)
to (P − 1)/(3M + P − 1) (:func:`bubble`). :func:`replay` measures both on the ideal machine.
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
    """Run a schedule of F, B and W on the ideal machine: each stage its own core, messages free.
    ``durations[(stage, kind, i)]``; with ``whole_backward`` (1F1B as it is run: one backward call)
    a stage sends its input's gradient only once its W is done too, so stage k's B(i) waits for stage
    k+1's W(i). Returns ``{(stage, kind, i): (start, end)}``, or raises ``ValueError`` if the schedule
    deadlocks."""
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
    """What a replay measures, exactly (fractions where the durations are): the ``makespan``, each
    stage's ``idle`` time (makespan − its work), the ``idle_share`` of the step (idle / makespan) and
    the paper's ``bubble_rate`` (idle / work)."""
    start = min(s for s, _ in spans.values())
    makespan = max(e for _, e in spans.values()) - start
    work = {}
    for (k, _, _), (s, e) in spans.items():
        work[k] = work.get(k, 0) + (e - s)
    per_stage = [makespan - work[k] for k in sorted(work)]
    share = Fraction(sum(per_stage)) / (len(work) * makespan)
    return {"makespan": makespan, "idle": per_stage, "idle_share": share,
            "bubble_rate": Fraction(sum(per_stage)) / sum(work.values())}


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
    """Messages of one step, from the schedule: an activation leaves every F but the last stage's, a
    gradient every B but the first stage's; a W sends nothing."""
    P = len(actions)
    return {"activations": sum(1 for k, a in enumerate(actions) for x, _ in a if x == "F" and k < P - 1),
            "grads": sum(1 for k, a in enumerate(actions) for x, _ in a if x == "B" and k > 0)}


# --------------------------------------------------------------------------- a run on real ranks


def _key(e: dict) -> tuple[int, str, int]:
    return e["rank"], e["kind"][0].upper(), e["microbatch"]  # forward, backward (B), weight (W)


def measured_bubbles(actions: list[list[Action]], events: list[dict], step: int) -> dict:
    """One step on real ranks: its idle share on the wall clock, and replayed from each action's
    busy time (every stage its own core, messages free), as :func:`.schedules.step_bubbles`."""
    comp = [e for e in events if e["step"] == step and e["kind"] in ("forward", "backward", "weight")]
    wall = {_key(e): (e["start"], e["end"]) for e in comp}
    busy = replay(actions, {_key(e): e["busy"] for e in comp})
    return {"step": step, "wall": float(idle(wall)["idle_share"]), "busy": float(idle(busy)["idle_share"])}


def replayed_events(spans: dict) -> list[dict]:
    """A replay as timeline events for :func:`lesson_lib.plots.pipeline.pipeline_gantt`."""
    kind = {"F": "forward", "B": "backward", "W": "weight"}
    return [{"rank": k, "kind": kind[x], "microbatch": i, "step": 0, "start": float(s), "end": float(e),
             "busy": float(e - s)} for (k, x, i), (s, e) in sorted(spans.items(), key=lambda kv: kv[1][0])]
