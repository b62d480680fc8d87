"""All-reduce schedules (chapter 2): who sends which chunk to whom, step by step.

Pure functions of the world size, shared by :mod:`lesson_lib.comm`, the animations, the exercises
and the byte counts.

* Ring (Patarasuk & Yuan, 2009): N−1 reduce-scatter steps, then N−1 all-gather steps.
* Recursive halving-doubling (Rabenseifner, 2004; Thakur, Rabenseifner & Gropp, 2005); with N not
  a power of two, the first 2·(N−p) ranks fold into p.
* Naive reduce-to-one + broadcast needs no schedule.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

PHASES = ("reduce-scatter", "all-gather")


def chunk_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """Split ``n`` elements into ``parts`` contiguous chunks differing by at most one element."""
    base, extra = divmod(n, parts)
    bounds, start = [], 0
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        bounds.append((start, start + size))
        start += size
    return bounds


# --------------------------------------------------------------------------- ring


class RingStep(NamedTuple):
    """What ``rank`` does at ``step`` of ``phase``: send one chunk right, receive one from the left."""

    phase: str  # "reduce-scatter" (the receiver adds) or "all-gather" (the receiver copies)
    step: int  # 0 … N−2 within the phase
    rank: int
    send_to: int
    send_chunk: int
    recv_from: int
    recv_chunk: int


@lru_cache(maxsize=64)
def ring_schedule(n: int) -> tuple[RingStep, ...]:
    """Every rank's steps of a ring all-reduce over ``n`` ranks, ordered by phase, step, rank.

    Reduce-scatter step s: rank r sends chunk r−s and adds the arriving chunk r−s−1. All-gather
    step s: rank r sends chunk r+1−s and receives chunk r−s (indices mod N).
    """
    if n < 1:
        raise ValueError(f"world_size must be at least 1, got {n}")
    steps = []
    for phase, first in (("reduce-scatter", 0), ("all-gather", 1)):
        for s in range(n - 1):
            for r in range(n):
                steps.append(RingStep(phase, s, r, (r + 1) % n, (r + first - s) % n,
                                      (r - 1) % n, (r + first - s - 1) % n))
    return tuple(steps)


def ring_states(n: int) -> list[dict]:
    """Replay :func:`ring_schedule` on sets of contributions, one frame per step (plus the start):
    ``phase``, ``step``, ``moves`` (src, dst, chunk), ``state[rank][chunk]`` = contributing ranks.
    Asserts that every receiver expects the chunk its sender sends."""
    state = [[{r} for _ in range(n)] for r in range(n)]
    frames = [{"phase": "start", "step": -1, "moves": [], "state": _freeze(state)}]
    sched = ring_schedule(n)
    for phase in PHASES:
        for s in range(n - 1):
            here = [st for st in sched if st.phase == phase and st.step == s]
            before = [[set(c) for c in row] for row in state]
            for st in here:
                sender = next(x for x in here if x.rank == st.recv_from)
                assert sender.send_chunk == st.recv_chunk, "schedule mismatch"
                incoming = before[st.recv_from][st.recv_chunk]
                state[st.rank][st.recv_chunk] = (before[st.rank][st.recv_chunk] | incoming
                                                 if phase == "reduce-scatter" else set(incoming))
            frames.append({"phase": phase, "step": s, "state": _freeze(state),
                           "moves": [(st.rank, st.send_to, st.send_chunk) for st in here]})
    return frames


def _freeze(state):
    return [[sorted(c) for c in row] for row in state]


def ring_bytes_sent(numel: int, element_size: int, world_size: int, rank: int) -> int:
    """Exact bytes ``rank`` sends in a ring all-reduce: 2S minus two chunks (≈ 2(N−1)/N·S)."""
    if world_size == 1:
        return 0
    bounds = chunk_bounds(numel, world_size)
    size = lambda i: bounds[i % world_size][1] - bounds[i % world_size][0]
    return element_size * (2 * numel - size(rank + 1) - size(rank + 2))


# --------------------------------------------------------------------------- pipelined ring


class SegmentStep(NamedTuple):
    """One segment of one :class:`RingStep`; ``slot``: when it crosses the link."""

    phase: str
    step: int
    segment: int  # 0 … segments−1, a contiguous piece of the chunk (``chunk_bounds(len, segments)``)
    slot: int  # time slot of the transfer: one segment per link per slot
    rank: int
    send_to: int
    send_chunk: int
    recv_from: int
    recv_chunk: int


def check_segments(segments) -> int:
    if isinstance(segments, bool) or not isinstance(segments, int) or segments < 1:
        raise ValueError(f"segments must be a positive int, got {segments!r}")
    return segments


@lru_cache(maxsize=64, typed=True)  # typed: True (== 1) must still be refused, not found in the cache
def pipelined_ring_schedule(n: int, segments: int) -> tuple[SegmentStep, ...]:
    """The ring's steps with each chunk sent as ``segments`` pieces.

    Segment k of the next step leaves once segment k of this step has landed (and, in the
    reduce-scatter, been added, one slot later), so additions overlap transfers. Each link carries
    one segment per slot, in the order :func:`lesson_lib.comm.pipelined_ring_all_reduce` posts them.
    """
    check_segments(segments)
    out, link = [], -1
    ready = [0] * segments  # the first slot segment k of the next step may cross
    for phase in PHASES:
        for s in range(n - 1):
            here = [st for st in ring_schedule(n) if st.phase == phase and st.step == s]
            for k in range(segments):
                link = max(link + 1, ready[k])
                ready[k] = link + (2 if phase == "reduce-scatter" else 1)  # land (+ add), then forward
                out += [SegmentStep(phase, s, k, link, st.rank, st.send_to, st.send_chunk,
                                    st.recv_from, st.recv_chunk) for st in here]
    return tuple(out)


def pipelined_ring_slots(n: int, segments: int) -> list[dict]:
    """Replay :func:`pipelined_ring_schedule` slot by slot on sets of contributions.

    One frame per slot (plus the start): ``phase``, ``step``, ``slot``, ``moves`` (src, dst, chunk,
    segment), ``adding`` (rank, chunk, segment) and ``state[rank][chunk][segment]``.
    """
    state = [[[{r} for _ in range(segments)] for _ in range(n)] for r in range(n)]
    frames = [{"phase": "start", "step": -1, "slot": -1, "moves": [], "adding": [], "state": _freeze2(state)}]
    sched = pipelined_ring_schedule(n, segments)
    landed: list = []  # reduce-scatter segments that arrived last slot: added in this one
    for t in range(max((x.slot for x in sched), default=-2) + 2):  # + 1: the last add (K = 1)
        here = [x for x in sched if x.slot == t]
        before = [[[set(c) for c in ch] for ch in row] for row in state]
        adding = [(x.rank, x.recv_chunk, x.segment, inc) for x, inc in landed]
        for r, c, k, inc in adding:
            state[r][c][k] |= inc
        landed = []
        for x in here:
            incoming = before[x.recv_from][x.recv_chunk][x.segment]
            if x.phase == "reduce-scatter":
                landed.append((x, incoming))  # added next slot, while the next segment crosses
            else:
                state[x.rank][x.recv_chunk][x.segment] = set(incoming)
        if not here and not adding:
            continue
        ref = max((x for x in sched if x.slot <= t), key=lambda x: x.slot)
        frames.append({"phase": ref.phase, "step": ref.step, "slot": t, "state": _freeze2(state),
                       "moves": [(x.rank, x.send_to, x.send_chunk, x.segment) for x in here],
                       "adding": [(r, c, k) for r, c, k, _ in adding]})
    return frames


def _freeze2(state):
    return [[[sorted(s) for s in c] for c in row] for row in state]


# --------------------------------------------------------------------------- halving-doubling


class PairStep(NamedTuple):
    """``rank`` exchanges chunk ranges [lo, hi) with ``peer``: ``send``/``recv`` index
    ``chunk_bounds(numel, p)`` (p: largest power of two ≤ N) or are None; ``reduce``: add or copy."""

    phase: str  # "fold", "reduce-scatter", "all-gather", "unfold"
    step: int
    rank: int
    peer: int
    send: tuple[int, int] | None
    recv: tuple[int, int] | None
    reduce: bool


def power_of_two_below(n: int) -> int:
    return 1 << (n.bit_length() - 1)


@lru_cache(maxsize=64)
def halving_doubling_schedule(n: int) -> tuple[PairStep, ...]:
    """Every rank's steps of recursive halving (reduce-scatter) then doubling (all-gather)."""
    if n < 1:
        raise ValueError(f"world_size must be at least 1, got {n}")
    p = power_of_two_below(n)
    extra = n - p
    real = lambda v: 2 * v + 1 if v < extra else v + extra
    out: list[PairStep] = []
    for r in range(0, 2 * extra, 2):  # fold: even ranks hand everything to their odd partner
        out += [PairStep("fold", 0, r, r + 1, (0, p), None, False),
                PairStep("fold", 0, r + 1, r, None, (0, p), True)]
    ranges = {v: (0, p) for v in range(p)}
    mask, step = p // 2, 0
    while mask:  # halving: keep one half of the range, send the other to the partner
        new = {}
        for v in range(p):
            lo, hi = ranges[v]
            mid = (lo + hi) // 2
            keep, give = ((mid, hi), (lo, mid)) if v & mask else ((lo, mid), (mid, hi))
            out.append(PairStep("reduce-scatter", step, real(v), real(v ^ mask), give, keep, True))
            new[v] = keep
        ranges, mask, step = new, mask // 2, step + 1
    mask, step = 1, 0
    while mask < p:  # doubling: swap the ranges you own, so each rank's range doubles
        new = {}
        for v in range(p):
            mine, theirs = ranges[v], ranges[v ^ mask]
            out.append(PairStep("all-gather", step, real(v), real(v ^ mask), mine, theirs, False))
            new[v] = (min(mine[0], theirs[0]), max(mine[1], theirs[1]))
        ranges, mask, step = new, mask * 2, step + 1
    for r in range(0, 2 * extra, 2):  # unfold: the odd partner returns the result
        out += [PairStep("unfold", 0, r + 1, r, (0, p), None, False),
                PairStep("unfold", 0, r, r + 1, None, (0, p), False)]
    return tuple(out)


def span(bounds: list[tuple[int, int]], chunks: tuple[int, int]) -> tuple[int, int]:
    """Element range [start, end) covered by the chunk range ``chunks``."""
    return bounds[chunks[0]][0], bounds[chunks[1] - 1][1]


def halving_doubling_bytes_sent(numel: int, element_size: int, world_size: int, rank: int) -> int:
    """Exact bytes ``rank`` sends in halving-doubling: 2(N−1)/N·S when N is a power of two."""
    bounds = chunk_bounds(numel, power_of_two_below(world_size))
    total = 0
    for st in halving_doubling_schedule(world_size):
        if st.rank == rank and st.send is not None:
            lo, hi = span(bounds, st.send)
            total += hi - lo
    return element_size * total


# --------------------------------------------------------------------------- naive


def naive_bytes_sent(numel: int, element_size: int, world_size: int, rank: int, root: int = 0) -> int:
    """Reduce-to-one + broadcast: each rank sends S to the root, the root sends S to each (N−1)."""
    if world_size == 1:
        return 0
    s = numel * element_size
    return (world_size - 1) * s if rank == root else s
