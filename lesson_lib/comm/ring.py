"""Our ring all-reduce (Patarasuk & Yuan, 2009): plain, pipelined (chunks sent in segments), and its
two phases alone (reduce-scatter, all-gather; ZeRO's). Built on the counted calls of :mod:`.p2p`,
with the steps of :mod:`.schedules`.
"""

from __future__ import annotations

import torch

from ..metrics import counters
from ..runtime import context
from .p2p import _RECENT, _finish, _flat, _nbytes, _rank_world, _scratch, _Timed, exchange
from .schedules import chunk_bounds, pipelined_ring_schedule, ring_schedule


def ring_all_reduce(tensor: torch.Tensor, group=None, op: str = "ring_all_reduce") -> torch.Tensor:
    """In-place SUM over all ranks, like ``dist.all_reduce(tensor)``: reduce-scatter, then all-gather.

    Each rank sends 2(N−1) chunks of about S/N bytes to its right neighbour: 2(N−1)/N·S in all, the
    bandwidth-optimal volume. Steps from :func:`lesson_lib.comm.schedules.ring_schedule`.
    """
    if _rank_world(group)[1] == 1:
        return tensor
    flat = _flat(tensor)
    return _finish(tensor, flat, op, _ring_steps(flat, None, group, op, shift=0))


def _ring_steps(flat: torch.Tensor, phase: str | None, group, op: str, shift: int) -> int:
    """Run this rank's steps of the ring schedule (one phase, or both when ``phase`` is None).

    Chunk i of the schedule is slice (i − shift) of ``flat``. Returns the scratch bytes used.
    """
    rank, n = _rank_world(group)
    bounds = chunk_bounds(flat.numel(), n)
    chunk = lambda i: flat[bounds[(i - shift) % n][0]:bounds[(i - shift) % n][1]]
    scratch = _scratch(bounds[0][1] - bounds[0][0], flat.dtype, flat.device)
    counters().scratch(_nbytes(scratch))
    for st in ring_schedule(n):
        if st.rank != rank or (phase is not None and st.phase != phase):
            continue
        if st.phase == "reduce-scatter":  # receive into scratch, then add into our copy
            incoming = chunk(st.recv_chunk)
            buf = scratch[: incoming.numel()]
            exchange(chunk(st.send_chunk), st.send_to, buf, st.recv_from, group, op + ".step").wait()
            incoming.add_(buf)
        else:  # all-gather: the summed chunk lands directly in place
            exchange(chunk(st.send_chunk), st.send_to, chunk(st.recv_chunk), st.recv_from, group,
                     op + ".step").wait()
    return _nbytes(scratch)


# Both tuned against Gloo's all_reduce with ``bench allreduce``; why: docs/design.md, "Ring all-reduce".
SEGMENT_BYTES = 2 << 20
RECV_AHEAD = 1


def pipelined_ring_all_reduce(tensor: torch.Tensor, group=None, segment_bytes: int = SEGMENT_BYTES,
                               op: str = "pipelined_ring_all_reduce") -> torch.Tensor:
    """:func:`ring_all_reduce` with each chunk sent in segments of at most ``segment_bytes``.

    Segment k of the next step leaves as soon as segment k of this step has landed (and been added),
    so additions overlap transfers. On Gloo each receive is posted one step early (``RECV_AHEAD``).
    Same bytes, 2(N−1)/N·S. Order from :func:`lesson_lib.comm.schedules.pipelined_ring_schedule`.
    """
    if isinstance(segment_bytes, bool) or not isinstance(segment_bytes, int) or segment_bytes < 1:
        raise ValueError(f"segment_bytes must be a positive int, got {segment_bytes!r}")
    rank, n = _rank_world(group)
    if n == 1:
        return tensor
    flat = _flat(tensor)
    bounds = chunk_bounds(flat.numel(), n)
    chunk = lambda i: flat[bounds[i][0]:bounds[i][1]]
    k = max(1, -(-_nbytes(chunk(0)) // segment_bytes))  # chunk 0 is the largest, on every rank
    mine = [x for x in pipelined_ring_schedule(n, k) if x.rank == rank]  # in the order they cross
    width = bounds[0][1] - bounds[0][0]
    # Receives early on Gloo only: NCCL must see a step's send and receive posted together.
    early = RECV_AHEAD if context().backend == "gloo" else 0
    halves = min(early + 1, n - 1)  # reduce-scatter steps whose segments may land at once
    scratch = _scratch(halves * width, flat.dtype, flat.device)
    counters().scratch(_nbytes(scratch))
    pieces = [chunk(c).tensor_split(k) for c in range(n)]  # views, made once per call
    # Segment j of a reduce-scatter step lands in the step's half of scratch, so what may be in
    # flight at once never shares memory. All-gather segments land in place.
    at = [lo for lo, _ in chunk_bounds(width, k)]

    def into(x):
        inc = pieces[x.recv_chunk][x.segment]
        if x.phase == "all-gather":
            return inc
        lo = (x.step % halves) * width + at[x.segment]
        return scratch[lo:lo + inc.numel()]

    bufs: dict = {}  # item -> where its segment lands
    pending: dict = {}  # item -> its posted works

    def post(j, send, recv):  # item j's send and/or its receive, as one exchange
        if j < len(mine):
            x = mine[j]
            out = pieces[x.send_chunk][x.segment] if send else None
            inc = bufs.setdefault(j, into(x)) if recv else None
            pending.setdefault(j, []).extend(exchange(out, x.send_to, inc, x.recv_from, group).works)

    sent = sum(pieces[x.send_chunk][x.segment].numel() for x in mine) * flat.element_size()
    recv = sum(pieces[x.recv_chunk][x.segment].numel() for x in mine) * flat.element_size()
    ahead = (1 + early) * k  # receives posted this many items before their turn
    with _Timed(op + ".step", sent=sent, recv=recv):
        for j in range(ahead):  # the first step's segments all at once, and the receives ahead
            post(j, j < k, True)
        works = []
        for i, x in enumerate(mine):
            w = pending.pop(i)
            for one in w:
                one.wait()
            works += w
            if x.phase == "reduce-scatter":
                pieces[x.recv_chunk][x.segment].add_(bufs[i])  # while the other segments are on the wire
            del bufs[i]
            if early:
                post(i + ahead, False, True)  # into the half this segment just left
            # the same segment, next step: its data is ready (and its receive, unless posted early)
            post(i + k, True, not early)
    _RECENT.append(works)  # Gloo: let the works outlive the call (see Pending.wait)
    return _finish(tensor, flat, op, _nbytes(scratch))


def _ring_phase(flat: torch.Tensor, phase: str, group, op: str) -> None:
    """One phase of the ring schedule on ``flat``, shifted so that rank r owns chunk r (ZeRO's shard r)."""
    _finish(flat, flat, op, _ring_steps(flat, phase, group, op, shift=1))


def ring_reduce_scatter(flat: torch.Tensor, group=None, op: str = "ring_reduce_scatter") -> torch.Tensor:
    """In place: afterwards rank r's chunk r of ``flat`` holds the SUM of everyone's chunk r
    (other chunks hold partial sums). Sends (N-1)/N·S bytes. Returns that chunk (a view)."""
    rank, n = _rank_world(group)
    if n > 1:
        _ring_phase(flat, "reduce-scatter", group, op)
    lo, hi = chunk_bounds(flat.numel(), n)[rank]
    return flat[lo:hi]


def ring_all_gather(flat: torch.Tensor, group=None, op: str = "ring_all_gather") -> torch.Tensor:
    """In place: from rank r's chunk r of ``flat`` on every rank, every rank gets every chunk.
    Sends (N-1)/N·S bytes."""
    if _rank_world(group)[1] > 1:
        _ring_phase(flat, "all-gather", group, op)
    return flat
