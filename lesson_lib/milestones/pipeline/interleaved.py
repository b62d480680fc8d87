"""Interleaved 1F1B (Narayanan et al., 2021 — Megatron-LM's "virtual pipeline"), as pure functions.

The model is cut into v·P virtual stages; rank r's chunk c is virtual stage c·P + r. An action is
``("F", c, i)`` or ``("B", c, i)``. The bubble falls to (P−1)/(v·M + P − 1)
(:func:`lesson_lib.costmodel.terms.bubble_formula`) at the price of v·P − 1 boundaries per
micro-batch (:func:`messages`) and more activations in flight (:func:`in_flight_bound`).
Follows Megatron-LM's orders and warm-up; how and where it differs: docs/design.md, "Interleaved 1F1B".
"""

from __future__ import annotations

from fractions import Fraction

from .schedules import run_in_order

Action = tuple[str, int, int]  # ("F" | "B", chunk, micro-batch)


def _check(stages: int, microbatches: int, chunks: int, rank: int | None = None) -> None:
    for name, value in (("stages", stages), ("microbatches", microbatches), ("chunks", chunks)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if chunks > 1 and microbatches % stages:
        raise ValueError(f"microbatches={microbatches} must be a multiple of stages={stages} for the "
                         f"interleaved schedule (micro-batches run in groups of P), e.g. "
                         f"{stages * max(1, round(microbatches / stages))}")
    if rank is not None and not 0 <= rank < stages:
        raise ValueError(f"rank must be in 0..{stages - 1}, got {rank}")


def virtual_stage(stages: int, rank: int, chunk: int) -> int:
    """Which of the v·P pieces of the model rank ``rank``'s chunk ``chunk`` is: chunk·P + rank."""
    return chunk * stages + rank


def warmup_forwards(stages: int, microbatches: int, chunks: int, rank: int) -> int:
    """Forwards rank ``rank`` runs before its first backward (Megatron-LM's count, capped at v·M):
    at v = 1, P − r − 1 (plain 1F1B); else (P − r − 1)·2 + (v − 1)·P."""
    if chunks == 1:
        return min(stages - rank - 1, microbatches)
    return min((stages - rank - 1) * 2 + (chunks - 1) * stages, chunks * microbatches)


def action_order(stages: int, microbatches: int, chunks: int, forward: bool) -> list[tuple[int, int]]:
    """The (chunk, micro-batch) of the k-th forward (or backward): groups of P micro-batches, each
    through every chunk in turn (backwards: the chunks in reverse)."""
    out = []
    for g in range(0, microbatches, stages):
        for c in range(chunks):
            out += [(c if forward else chunks - 1 - c, i) for i in range(g, min(g + stages, microbatches))]
    return out


def interleaved_actions(stages: int, microbatches: int, chunks: int, rank: int) -> list[Action]:
    """Rank ``rank``'s ordered actions in one step of interleaved 1F1B: warm-up forwards, then one
    forward and one backward in turn, then the remaining backwards."""
    _check(stages, microbatches, chunks, rank)
    fwd = [("F", c, i) for c, i in action_order(stages, microbatches, chunks, True)]
    bwd = [("B", c, i) for c, i in action_order(stages, microbatches, chunks, False)]
    w = warmup_forwards(stages, microbatches, chunks, rank)
    actions = fwd[:w]
    for k in range(len(fwd) - w):  # steady state
        actions += [fwd[w + k], bwd[k]]
    return actions + bwd[len(fwd) - w:]


def all_interleaved(stages: int, microbatches: int, chunks: int) -> list[list[Action]]:
    return [interleaved_actions(stages, microbatches, chunks, r) for r in range(stages)]


def max_in_flight(actions: list[Action]) -> int:
    """Most (chunk, micro-batch) pairs whose forward is done and backward is not."""
    live = peak = 0
    for kind, *_ in actions:
        live += 1 if kind == "F" else -1
        peak = max(peak, live)
    return peak


def in_flight_bound(stages: int, microbatches: int, chunks: int, rank: int) -> int:
    """Most chunk activations rank ``rank`` holds: min(w + 1, v·M) for w warm-up forwards."""
    return min(warmup_forwards(stages, microbatches, chunks, rank) + 1, chunks * microbatches)


def messages(actions: list[list[Action]], chunks: int) -> dict:
    """Messages of one step, counted from the schedule: an activation leaves every forward but the
    last virtual stage's, a gradient every backward but the first's."""
    P = len(actions)
    last = chunks * P - 1
    where = [(x, virtual_stage(P, r, c)) for r, a in enumerate(actions) for x, c, _ in a]
    return {"activations": sum(1 for x, s in where if x == "F" and s < last),
            "grads": sum(1 for x, s in where if x == "B" and s > 0)}


# --------------------------------------------------------------------------- time


def replay_interleaved(actions: list[list[Action]], durations: dict) -> dict:
    """As :func:`.schedules.replay`, with virtual stage s = c·P + r in place of stage k: each rank
    one core, its chunks in schedule order, free messages. ``durations[(rank, kind, chunk, i)]``:
    seconds (or slots). Returns ``{(rank, kind, chunk, i): (start, end)}``; ``ValueError`` on deadlock."""
    P = len(actions)
    S = P * (1 + max((c for a in actions for _, c, _ in a), default=0))

    def where(s: int, kind: str, i: int) -> tuple[int, str, int, int]:
        return s % P, kind, s // P, i

    def deps(key):
        r, kind, c, i = key
        s = virtual_stage(P, r, c)
        if kind == "F":
            return [where(s - 1, "F", i)] if s > 0 else []
        return [(r, "F", c, i)] + ([where(s + 1, "B", i)] if s + 1 < S else [])

    return run_in_order([[(r, *a) for a in acts] for r, acts in enumerate(actions)], deps, durations,
                        who="ranks")


def equal_durations(actions: list[list[Action]], chunks: int, forward=1, backward=2) -> dict:
    """Each chunk's forward and backward as exact fractions of a whole stage's (1/v each)."""
    f, b = Fraction(forward, chunks), Fraction(backward, chunks)
    return {(r, x, c, i): f if x == "F" else b for r, a in enumerate(actions) for x, c, i in a}


def exact_idle_share(spans: dict) -> Fraction:
    """1 − work / (ranks × makespan), exactly, for a replay with fractional durations."""
    ranks = {key[0] for key in spans}
    start = min(s for s, _ in spans.values())
    end = max(e for _, e in spans.values())
    return 1 - Fraction(sum(e - s for s, e in spans.values())) / (len(ranks) * (end - start))


def replayed_events(spans: dict) -> list[dict]:
    """A replay as timeline events (``{rank, kind, chunk, microbatch, start, end, busy}``) for
    :func:`lesson_lib.plots.pipeline.pipeline_gantt`; times as floats."""
    return [{"rank": r, "kind": "forward" if x == "F" else "backward", "chunk": c, "microbatch": i,
             "step": 0, "start": float(s), "end": float(e), "busy": float(e - s)}
            for (r, x, c, i), (s, e) in sorted(spans.items(), key=lambda kv: kv[1][0])]


def measured_bubbles(actions: list[list[Action]], events: list[dict], step: int) -> dict:
    """One step on real ranks: idle share on the wall clock and replayed from busy time, as
    :func:`.schedules.step_bubbles`."""
    comp = [e for e in events if e["step"] == step and e["kind"] in ("forward", "backward")]
    key = lambda e: (e["rank"], e["kind"][0].upper(), e.get("chunk", 0), e["microbatch"])
    wall = {key(e): (e["start"], e["end"]) for e in comp}
    busy = replay_interleaved(actions, {key(e): e["busy"] for e in comp})
    return {"step": step, "wall": _share(wall), "busy": _share(busy)}


def _share(spans: dict) -> float:
    start, end = min(s for s, _ in spans.values()), max(e for _, e in spans.values())
    ranks = len({k[0] for k in spans})
    return 1.0 - sum(e - s for s, e in spans.values()) / (ranks * (end - start)) if end > start else 0.0
