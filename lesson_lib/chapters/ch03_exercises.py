"""Chapter 3's exercises (notebooks/03_pipeline_parallelism.ipynb); the GPipe stage written on real
ranks is judged in :mod:`.ch03_gpipe`.
"""

from __future__ import annotations

from ..costmodel.terms import bubble_formula
from ..exercises import (
    Exercise,
    Property,
    Verdict,
    close_to,
    judge,
    solution_text,
    whole_number,
)
from ..experiments import run_warm
from ..milestones import pipeline as pp
from ..milestones.pipeline.schedules import max_in_flight, replay, stage_actions
from .ch03_gpipe import check_gpipe, my_gpipe_stage

# --------------------------------------------------------------------------- paper and pencil


def parse_actions(answer) -> list[tuple[str, int]]:
    """'F0 F1 B0 ...' (any separators: commas, arrows, semicolons), ['F0', 'B0', ...] or [('F', 0), ...]
    → [('F', 0), ...]. Anything else is an :class:`AnswerError` that says what was given."""
    import re

    from ..exercises import AnswerError

    if isinstance(answer, str):
        items = re.findall(r"[A-Za-z]\s*\d+", answer)
        if not items or re.sub(r"[A-Za-z]\s*\d+|[\s,;.→>\-|/]", "", answer):
            raise AnswerError(f"you gave the text {answer!r}; write the actions in order, as 'F0 F1 B0 …'")
    else:
        items = list(answer)
    out = []
    for a in items:
        if isinstance(a, str):
            a = a.replace(" ", "")
            kind, i = a[0], a[1:]
        elif isinstance(a, (tuple, list)) and len(a) == 2:
            kind, i = a
        else:
            raise AnswerError(f"you gave {a!r} among the actions; each is 'F' or 'B' and a micro-batch, "
                              "as 'F0' or ('F', 0)")
        out.append((str(kind).upper(), int(i)))
    return out


def _slots(orders: list[list]) -> float:
    """The step's length replayed with every forward one slot and every backward two (B ≈ 2F)."""
    spans = replay(orders, {(k, a, i): 1.0 if a == "F" else 2.0 for k, o in enumerate(orders) for a, i in o})
    return max(end for _, end in spans.values())


def check_order(stages: int, microbatches: int, stage: int):
    """What 1F1B is, as properties of the order given: each action once, every backward after its
    forward, at most P−k micro-batches in flight, no deadlock beside the other stages' 1F1B orders, and
    a step as short as 1F1B's. Another order with all of these is as right as the textbook's."""
    expected = stage_actions("1f1b", stages, microbatches, stage)
    gpipe = stage_actions("gpipe", stages, microbatches, stage)
    bound, last = max_in_flight(expected), microbatches - 1
    others = [stage_actions("1f1b", stages, microbatches, k) for k in range(stages)]
    with_mine = lambda got: others[:stage] + [got] + others[stage + 1:]
    best = _slots(others)

    def once(got):
        return None if sorted(got) == sorted(expected) else f"you listed {len(got)} actions, not each once"

    def after_forward(got):
        early = next((i for n, (kind, i) in enumerate(got) if kind == "B" and ("F", i) not in got[:n]), None)
        return None if early is None else \
            f"B{early} comes before F{early}: a backward needs its forward's activations"

    def bounded(got):
        if max_in_flight(got) <= bound:
            return None
        if got == gpipe:
            return (f"that is a valid schedule, but it is GPipe's (all forwards first): it holds all "
                    f"{microbatches} micro-batches' activations; 1F1B starts the backwards as early as "
                    "it can")
        return f"it holds {max_in_flight(got)} at once, so it is not 1F1B"

    def runs(got):
        try:
            _slots(with_mine(got))
        except ValueError:
            return ("it waits for a micro-batch that its neighbour only sends after this stage's next "
                    "backward (a deadlock)")
        return None

    def as_short(got):
        mine = _slots(with_mine(got))
        return None if mine <= best else (
            f"the step takes {mine:g} slots against 1F1B's {best:g} (a forward one slot, a backward two): "
            f"it holds fewer, {max_in_flight(got)}, but starts its backwards too early, so the stages wait "
            "for each other — this is not 1F1B")

    def check(answer) -> Verdict:
        got = parse_actions(answer)
        v = judge([(f"stage {stage} of {stages}, M = {microbatches}", lambda: got)], [
            Property(f"each of F0…F{last} and B0…B{last} exactly once", once),
            Property("every backward after its own forward", after_forward),
            Property(f"at most P − k = {bound} micro-batches' activations held at once", bounded),
            Property("no stage waiting forever beside the other stages' 1F1B orders", runs),
            Property("a step as short as 1F1B's", as_short)])
        if v.ok:
            same = got == expected
            return Verdict(True, ("that is" if same else "not the textbook order, but as good as") +
                           f" stage {stage}'s 1F1B order; it holds at most {max_in_flight(got)} "
                           f"micro-batches' activations and the step takes {best:g} slots")
        return v

    return check


def smallest_m(p: int) -> int:
    return next(m for m in range(1, 10_000) if bubble_formula(p, m) < 0.1)


def measured_bubble(m: int, stages: int = 4) -> str:
    """What a real 1F1B run with ``m`` micro-batches measured (the smallest_m exercise's reward)."""
    r = run_warm(pp.Config.laptop(stages=stages, microbatches=m, schedule="1f1b", steps=3,
                                  global_batch=8 * m))
    return (f"by the formula, {r['bubble_formula']:.1%}: the answer. What a real run of it measured (not "
            f"part of the verdict): {r['bubble_busy']:.1%} replayed from busy time and "
            f"{r['bubble_wall']:.1%} on the wall clock. The formula assumes every "
            "forward and backward takes the same time; measured ones vary, and in 1F1B's steady state each "
            "stage waits for the slower of its neighbours, so the variation becomes idle time (the wall "
            "clock adds the cores the stages share)")


def check_smallest_m(stages: int, run: bool = True):
    """A correct answer is rewarded with what a real run of it measured (:func:`measured_bubble`)."""

    def check(answer) -> Verdict:
        m = whole_number(answer, "M, a whole number of micro-batches ≥ 1")
        if m < 1:
            return Verdict(False, f"you said {m}: M counts micro-batches, a whole number ≥ 1")
        if m != smallest_m(stages):
            return Verdict(False, f"with M = {m} the formula gives {bubble_formula(stages, m):.1%}; "
                                  "you want the smallest M that brings it under 10%")
        return Verdict(True, measured_bubble(m, stages) if run
                       else f"(P−1)/(M+P−1) = {bubble_formula(stages, m):.1%}")

    return check


def check_count(want: int, what: str):
    def check(answer) -> Verdict:
        got = whole_number(answer, f"a count of whole {what}")
        ok = got == want
        return Verdict(ok, f"you said {got}" + ("" if ok else "; walk through stage 0's 1F1B order "
                                                              "and count F's minus B's"))

    return check


GPIPE_SOLUTION = solution_text(my_gpipe_stage)


def exercises(stages: int = 4, run: bool = True) -> dict[str, Exercise]:
    P, M, k, order_m = stages, 8, 1, 6
    m_star = smallest_m(P)
    solution = " ".join(f"{a}{i}" for a, i in stage_actions("1f1b", P, order_m, k))
    return {
        "gpipe": Exercise(
            key="gpipe", title="write a GPipe stage, on real ranks",
            prompt=f"Write <code>my_gpipe_stage(stage, xs, ys)</code>; it runs on each of {P} ranks, rank k "
                   "holding stage k of the model (<code>stage</code>, a module). <code>xs</code> is a list "
                   "of M tensors: on stage 0 the micro-batches' inputs, on the other stages empty buffers "
                   "of the right shape to receive the activations into. <code>ys</code> holds the M targets "
                   "on the last stage (None elsewhere). Run GPipe's step with <code>dist.send</code> / "
                   "<code>dist.recv</code>: all M forwards, then all M backwards, so that every stage's "
                   "parameters end with the gradient of the whole batch's mean cross-entropy "
                   "(<code>F.cross_entropy(out, y) / M</code> per micro-batch). The check compares with "
                   "single-process backprop and stops after 10 s if stages wait for each other.",
            check=check_gpipe,
            hint="A stage's input must require grad for its gradient to exist: after receiving, call "
                 "requires_grad_(). A stage's backward needs the gradient of its output from the next stage "
                 "(out.backward(g)), then sends its input's gradient (x.grad) back.",
            solution=GPIPE_SOLUTION, reference=lambda: my_gpipe_stage),
        "bubble": Exercise(
            key="bubble", title="predict the bubble",
            prompt=f"With P = {P} stages and M = {M} micro-batches of equal cost, what share of each stage's "
                   "time is idle? Answer as a fraction (0.25 for 25%), then compare with the busy-time "
                   "bubble measured above.",
            check=close_to(bubble_formula(P, M), 0.01),
            hint="Count time slots of one forward+backward: how many does the whole step take, and in how "
                 "many of them is a given stage working?",
            solution=f"(P−1)/(M+P−1) = {P - 1}/{M + P - 1} = {bubble_formula(P, M):.3f}: the step takes "
                     "M+P−1 slots and each stage works in M of them.",
            reference=lambda: bubble_formula(P, M)),
        "order": Exercise(
            key="order", title="order the 1F1B steps",
            prompt=f"With P = {P} stages and M = {order_m} micro-batches, write the order in which stage {k} "
                   "runs its forwards and backwards under 1F1B, e.g. <code>\"F0 F1 B0 ...\"</code>.",
            check=check_order(P, order_m, k),
            hint="Stage k first runs P−k−1 forwards to fill the pipeline; then it alternates one forward "
                 "and one backward (the oldest micro-batch first); then it drains the remaining backwards.",
            solution=solution, reference=lambda: solution),
        "smallest_m": Exercise(
            key="smallest_m", title="a bubble under 10%",
            prompt=f"With P = {P} stages, what is the smallest number of micro-batches M that brings the "
                   "formula's bubble (P−1)/(M+P−1) under 10%? The check judges it by the formula, then runs "
                   "it for real (8 samples per micro-batch) and shows what the run measured: real stages "
                   "are not equal, so a measured bubble sits above the formula's (§5).",
            check=check_smallest_m(P, run), hint="Solve (P−1)/(M+P−1) < 0.1 for M.",
            solution=f"(P−1)/(M+P−1) < 0.1 ⇔ M > 9(P−1) = {9 * (P - 1)}, so M = {m_star}.",
            reference=lambda: m_star),
        "in_flight": Exercise(
            key="in_flight", title="how much does 1F1B hold?",
            prompt=f"With P = {P} stages and M = {M} micro-batches, how many micro-batches' activations does "
                   "stage 0 hold at most under 1F1B? (GPipe holds all M.)",
            check=check_count(P, "micro-batches' activations"),
            hint="Stage 0 runs P−1 warm-up forwards, then one more forward before its first backward.",
            solution=f"P = {P}: P−1 warm-up forwards plus the forward of the steady state; from then on "
                     "every new forward is matched by a backward that frees one.",
            reference=lambda: P),
    }
