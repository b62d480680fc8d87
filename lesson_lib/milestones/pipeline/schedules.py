"""Who computes what, in which order: the pipeline schedules, stage balancing and the bubble.

Pure functions — no process group, no tensors — so one schedule drives the stages in
:mod:`lesson_lib.milestones.pipeline`, the tests, the exercises and the replay that draws the
ideal timeline. Chapter 3 (pipeline parallelism) studies them.

A schedule is, per stage, a list of actions ``("F", i)`` (forward of micro-batch i) and
``("B", i)`` (its backward). Stage k's F(i) needs stage k−1's F(i); its B(i) needs stage k+1's B(i).

* naive: the whole batch is one micro-batch; F then B, so one stage is busy at a time.
* GPipe (Huang et al., 2019): all M forwards, then all M backwards. Every stage holds the
  activations of all M micro-batches at the end of its forwards.
* 1F1B, also called PipeDream-Flush (Narayanan et al., 2021): stage k does P−k−1 warm-up forwards,
  then alternates one forward and one backward, then drains its remaining backwards. Same bubble
  as GPipe, but stage k holds at most P−k micro-batches' activations at once.

With equal stage times both take (M+P−1) slots of one forward+backward, of which P·M are work:
the idle share ("bubble") of each stage is (P−1)/(M+P−1) (:func:`lesson_lib.costmodel.terms.bubble_formula`).
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
    """GPipe's idle share when the stages' times differ: 1 − M/(P + (M−1)·pace).

    ``pace`` is the slowest forward plus the slowest backward over the mean stage's forward plus
    backward (1 for equal stages). With identical micro-batches each phase is a flow shop, whose
    makespan is the sum of the stage times plus M−1 times the slowest one: the slowest stage sets
    the pace. At pace 1 this is :func:`lesson_lib.costmodel.terms.bubble_formula`."""
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
    """Run a schedule on an ideal machine: each stage its own core, communication free. Stage k's
    F(i) waits for stage k−1's F(i); its B(i) for its own F(i) and for stage k+1's B(i).

    ``durations[(stage, kind, i)]`` are seconds (e.g. the busy time measured for each action);
    ``latency[(stage, kind, i)]``, if given, the seconds the action's message from the neighbour
    takes after the neighbour's action ends (missing: free).
    Returns ``{(stage, kind, i): (start, end)}``; raises ``ValueError`` if the schedule deadlocks
    (some stage waits for an action that can never happen).
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
    """The one replay loop (GPipe, 1F1B and the interleaved schedule): queue k runs its actions in
    order on a core of its own; an action starts when its queue is free and every action
    ``deps(key)`` names has ended (plus ``lag(key, dep)``). An action's key is ``(queue, *action)``.
    Returns ``{key: (start, end)}``; raises ``ValueError`` when no queue can go on (a deadlock)."""
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
    """One step replayed with each action's measured busy (CPU) time: the timeline the schedule
    would have if every stage had a core of its own and messages were free."""
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
    """Per action, how long its input message took: from the neighbour's action ending to the
    message landing (the ``arrive_*`` events), keyed like :func:`replay`'s ``latency``."""
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
    """One step's bubble rebuilt one cause at a time, each rung measured in the same step.

    * ``stages``: the schedule replayed with each stage's mean forward and mean backward (busy
      time): what unequal stages cost over the formula, which assumes equal ones; ``pace`` (see
      :func:`stage_pace`) says how unequal, and for GPipe this rung is :func:`paced_bubble`;
    * ``busy``: replayed with each action's own busy time: adds the variation between
      micro-batches (a stage that waits for a slower neighbour turns it into idle time);
      ``busy_bounds`` is what that variation can do: the same work on the timelines with every
      action as fast, and as slow, as its stage's fastest and slowest of its kind (a replay's
      makespan only grows with any action's time, so ``busy`` lies between them in every run);
    * ``messages``: replayed with each action's busy time and each message's measured delay
      (:func:`message_delays`): adds what messages cost where a stage waits for them. The delays
      are wall-clock times, so on a loaded machine (stages often off their cores) they include
      waiting for a core and this rung can exceed the measured ``wall``;
    * ``wall``: measured on the wall clock: adds the rest — the stage's own work between actions
      and cores shared with other threads and processes.

    Beside them, per stage: its mean ``forward`` and ``backward`` busy time per micro-batch (s), and
    as shares of the step's window (first forward to last backward):
    ``off_core`` — wall minus busy time inside its forwards and backwards (its core ran something
    else meanwhile); between its own first and last action, ``recv`` — waiting for a neighbour's
    message, and ``between`` — neither computing nor waiting (handing messages over, bookkeeping).
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
