"""Pipeline schedules, stage balancing and the bubble (chapter 3), as pure functions.

A schedule is, per stage, a list of actions ``("F", i)`` / ``("B", i)`` (forward / backward of
micro-batch i). Stage k's F(i) needs stage k−1's F(i); its B(i) needs stage k+1's B(i).

* naive: the whole batch is one micro-batch.
* GPipe (Huang et al., 2019): all M forwards, then all M backwards.
* 1F1B / PipeDream-Flush (Narayanan et al., 2021): P−k−1 warm-up forwards, then one forward one
  backward; same bubble as GPipe, at most P−k micro-batches' activations held.

With equal stages the bubble is (P−1)/(M+P−1) (:func:`lesson_lib.costmodel.terms.bubble_formula`).
"""

from __future__ import annotations

SCHEDULES = ("naive", "gpipe", "1f1b")
Action = tuple[str, int]


def microbatches_run(schedule: str, microbatches: int) -> int:
    """Micro-batches a schedule really uses: naive takes the whole batch at once."""
    return 1 if schedule == "naive" else microbatches


def stage_actions(schedule: str, stages: int, microbatches: int, stage: int) -> list[Action]:
    """The ordered actions of ``stage`` (0-based) in one training step."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if not 0 <= stage < stages:
        raise ValueError(f"stage must be in 0..{stages - 1}, got {stage}")
    m = microbatches_run(schedule, microbatches)
    if schedule in ("naive", "gpipe"):
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warmup = min(stages - stage - 1, m)
    actions = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):  # steady state: one forward, then the oldest backward
        actions += [("F", warmup + i), ("B", i)]
    return actions + [("B", i) for i in range(m - warmup, m)]


def all_actions(schedule: str, stages: int, microbatches: int) -> list[list[Action]]:
    return [stage_actions(schedule, stages, microbatches, k) for k in range(stages)]


def max_in_flight(actions: list[Action]) -> int:
    """Most micro-batches whose forward is done and backward is not (activations held)."""
    live = peak = 0
    for kind, _ in actions:
        live += 1 if kind == "F" else -1
        peak = max(peak, live)
    return peak


def paced_bubble(stages: int, microbatches: int, pace: float) -> float:
    """GPipe's idle share with unequal stages: 1 − M/(P + (M−1)·pace).

    ``pace``: slowest forward + slowest backward over the mean stage's (1 for equal stages); the
    slowest stage sets the pace of a flow shop."""
    return 1 - microbatches / (stages + (microbatches - 1) * pace)


def stage_pace(per_stage: list[dict]) -> float:
    """The ``pace`` of :func:`paced_bubble` from each stage's mean ``forward`` and ``backward``."""
    mean = sum(s["forward"] + s["backward"] for s in per_stage) / len(per_stage)
    return (max(s["forward"] for s in per_stage) + max(s["backward"] for s in per_stage)) / mean


# --------------------------------------------------------------------------- balancing


def partition(costs: list[float], stages: int) -> list[tuple[int, int]]:
    """Cut ``costs`` (one per layer, in order) into ``stages`` contiguous, non-empty runs that
    minimise the most expensive stage; returns [lo, hi) per stage. Dynamic programming, O(P·L²)."""
    n = len(costs)
    if isinstance(stages, bool) or not isinstance(stages, int) or not 1 <= stages <= n:
        raise ValueError(f"stages must be between 1 and the {n} layers, got {stages!r}")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[j][i]: the smallest possible largest stage when the first i layers form j stages
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for j in range(1, stages + 1):
        for i in range(j, n - (stages - j) + 1):
            for lo in range(j - 1, i):
                v = max(best[j - 1][lo], prefix[i] - prefix[lo])
                if v < best[j][i] - 1e-12:
                    best[j][i], cut[j][i] = v, lo
    bounds, i = [], n
    for j in range(stages, 0, -1):
        bounds.append((cut[j][i], i))
        i = cut[j][i]
    return bounds[::-1]


# --------------------------------------------------------------------------- time


def replay(actions: list[list[Action]], durations: dict, latency: dict | None = None) -> dict:
    """Run a schedule on an ideal machine (a core per stage, free communication).

    ``durations[(stage, kind, i)]``: seconds; ``latency[(stage, kind, i)]``, optional: seconds the
    action's input message takes after the neighbour's action ends. Returns
    ``{(stage, kind, i): (start, end)}``; raises ``ValueError`` if the schedule deadlocks.
    """
    n = len(actions)

    def deps(key):
        k, kind, i = key
        need = [(k - 1, "F", i)] if kind == "F" else [(k, "F", i), (k + 1, "B", i)]
        return [d for d in need if 0 <= d[0] < n]

    def lag(key, dep):  # a neighbour's message; an action's own stage's earlier work has none
        return (latency or {}).get(key, 0.0) if dep[0] != key[0] else 0.0

    return run_in_order([[(k, *a) for a in acts] for k, acts in enumerate(actions)], deps, durations,
                        lag, "stages")


def run_in_order(queues: list[list[tuple]], deps, durations: dict, lag=None, who: str = "stages") -> dict:
    """The one replay loop: queue k runs its actions in order on its own core; an action starts
    when its queue is free and every ``deps(key)`` has ended (plus ``lag(key, dep)``).
    Keys are ``(queue, *action)``. Returns ``{key: (start, end)}``; ``ValueError`` on deadlock."""
    pos, free, done = [0] * len(queues), [0] * len(queues), {}
    remaining = sum(len(q) for q in queues)
    while remaining:
        progressed = False
        for k, queue in enumerate(queues):
            while pos[k] < len(queue):
                key = queue[pos[k]]
                need = deps(key)
                if any(d not in done for d in need):
                    break
                start = max([free[k]] + [done[d][1] + (lag(key, d) if lag else 0) for d in need])
                done[key] = (start, start + durations[key])
                free[k] = done[key][1]
                pos[k] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {k: q[pos[k]][1:] for k, q in enumerate(queues) if pos[k] < len(q)}
            raise ValueError(f"the schedule deadlocks: {who} wait at {stuck}")
    return done


def idle_share(spans: dict) -> float:
    """1 − work / (stages × makespan) for ``{(stage, kind, i): (start, end)}`` of one step."""
    if not spans:
        return 0.0
    stages = {key[0] for key in spans}
    makespan = _makespan(spans)
    work = sum(e - s for s, e in spans.values())
    return 1.0 - work / (len(stages) * makespan) if makespan > 0 else 0.0


def _makespan(spans: dict) -> float:
    return max(e for _, e in spans.values()) - min(s for s, _ in spans.values())


def span_key(event: dict) -> tuple[int, str, int]:
    """A measured event's key in a replay: (stage, "F" or "B", micro-batch)."""
    return event["rank"], event["kind"][0].upper(), event["microbatch"]


def _compute(events: list[dict], step: int) -> list[dict]:
    return [e for e in events if e["step"] == step and e["kind"] in ("forward", "backward")]


def measured_spans(events: list[dict], step: int) -> dict:
    """One step's forwards and backwards as measured: {(stage, kind, i): (start, end)}."""
    return {span_key(e): (e["start"], e["end"]) for e in _compute(events, step)}


def replay_busy(actions: list[list[Action]], events: list[dict], step: int) -> dict:
    """One step replayed with each action's measured busy (CPU) time."""
    return replay(actions, {span_key(e): e["busy"] for e in _compute(events, step)})


def step_bubbles(actions: list[list[Action]], events: list[dict], step: int) -> dict:
    """One step's idle share: measured on the wall clock, and replayed from busy time."""
    return {"step": step, "wall": idle_share(measured_spans(events, step)),
            "busy": idle_share(replay_busy(actions, events, step))}


def replayed_events(actions: list[list[Action]], events: list[dict], step: int) -> list[dict]:
    """The step's forwards and backwards moved to where :func:`replay_busy` puts them."""
    spans = replay_busy(actions, events, step)
    return [{**e, "start": spans[span_key(e)][0], "end": spans[span_key(e)][1]}
            for e in _compute(events, step)]


# --------------------------------------------------------------------------- where the idle goes


def _replay_with(actions: list[list[Action]], comp: list[dict], duration) -> float:
    return idle_share(replay(actions, {span_key(e): duration(e) for e in comp}))


def message_delays(events: list[dict], step: int) -> dict:
    """Per action, seconds from the neighbour's action ending to its message landing
    (``arrive_*`` events), keyed like :func:`replay`'s ``latency``."""
    ends = {span_key(e): e["end"] for e in _compute(events, step)}
    out = {}
    for e in events:
        if e["step"] == step and e["kind"] in ("arrive_activation", "arrive_grad"):
            k, i = e["rank"], e["microbatch"]
            mine, theirs = ((k, "F", i), (k - 1, "F", i)) if e["kind"] == "arrive_activation" else \
                ((k, "B", i), (k + 1, "B", i))
            if theirs in ends:
                out[mine] = max(0.0, e["end"] - ends[theirs])
    return out


def bubble_breakdown(actions: list[list[Action]], events: list[dict], step: int) -> dict:
    """One step's bubble rebuilt one cause at a time (idle shares):

    * ``stages``: replayed with each stage's mean busy times (unequal stages; ``pace``:
      :func:`stage_pace`); ``busy``: each action's own busy time (variation between micro-batches),
      within ``busy_bounds`` (every action at its stage's fastest / slowest);
    * ``messages``: plus measured message delays (wall-clock, so it may exceed ``wall`` on a
      loaded machine); ``wall``: measured.

    ``per_stage``: mean ``forward``/``backward`` busy seconds, and shares of the step's window:
    ``off_core`` (wall minus busy), ``recv`` (waiting for a message), ``between`` (neither).
    """
    comp = _compute(events, step)
    by: dict[tuple[int, str], list[float]] = {}
    for e in comp:
        by.setdefault((e["rank"], e["kind"]), []).append(e["busy"])
    mean = {k: sum(v) / len(v) for k, v in by.items()}
    window = max(max(e["end"] for e in comp) - min(e["start"] for e in comp), 1e-12)
    stages = []
    for k in sorted({e["rank"] for e in comp}):
        mine = [e for e in comp if e["rank"] == k]
        t0, t1 = min(e["start"] for e in mine), max(e["end"] for e in mine)
        wall = sum(e["end"] - e["start"] for e in mine)
        recv = sum(max(0.0, min(e["end"], t1) - max(e["start"], t0)) for e in events
                   if e["step"] == step and e["rank"] == k and e["kind"] == "recv")
        stages.append({"stage": k, "forward": mean.get((k, "forward"), 0.0),
                       "backward": mean.get((k, "backward"), 0.0),
                       "off_core": (wall - sum(e["busy"] for e in mine)) / window,
                       "recv": recv / window, "between": max(0.0, t1 - t0 - wall - recv) / window})
    delays = message_delays(events, step)
    work, n = sum(e["busy"] for e in comp), len(stages)
    bounds = tuple(1 - work / (n * _makespan(replay(actions, {span_key(e): pick(by[e["rank"], e["kind"]])
                                                              for e in comp}))) for pick in (min, max))
    return {"step": step, "stages": _replay_with(actions, comp, lambda e: mean[e["rank"], e["kind"]]),
            "pace": stage_pace(stages),
            "busy": _replay_with(actions, comp, lambda e: e["busy"]), "busy_bounds": bounds,
            "messages": idle_share(replay(actions, {span_key(e): e["busy"] for e in comp}, delays)),
            "wall": idle_share(measured_spans(events, step)), "per_stage": stages}
