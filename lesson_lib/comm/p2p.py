"""Instrumented communication: point-to-point, collectives, and our own ring all-reduce.

Every call made through this module adds to the calling rank's counters
(:func:`lesson_lib.metrics.counters`): calls, bytes sent, bytes received and seconds, by op name.

* Point-to-point bytes are exact: the bytes of the tensors handed to the wire.
* ``ring_all_reduce`` — and its rivals ``naive_all_reduce`` (reduce-to-one + broadcast) and
  ``halving_doubling_all_reduce`` — are built from point-to-point calls, so their bytes are exact
  too. Their step-by-step schedules live in :mod:`lesson_lib.schedules`.
* For the library's own collectives (``algorithm="library"``) torch does not say what went over
  the wire, so we record the bandwidth-optimal ring volume, 2(N-1)/N·S for an all-reduce
  (Patarasuk & Yuan, 2009). The op name ends in
  ``[library]`` so a chart can tell counted from modelled traffic.

Used by chapter 0 (data parallel) and chapter 2 (ring all-reduce) onwards.
"""

from __future__ import annotations

import collections
import time

import torch
import torch.distributed as dist

from .metrics import counters, sync
from .runtime import context
from .schedules import (
    chunk_bounds,
    halving_doubling_schedule,
    pipelined_ring_schedule,
    power_of_two_below,
    ring_bytes_sent,  # noqa: F401  (re-exported: chapter 0 and the tests use it here)
    ring_schedule,
    span,
)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _device() -> torch.device:
    return context().device


class _Timed:
    """Times a blocking section on the rank's device and records it under ``op``."""

    def __init__(self, op: str, sent: int = 0, recv: int = 0):
        self.op, self.sent, self.recv = op, sent, recv

    def __enter__(self):
        sync(_device())
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        sync(_device())
        if _LINK is not None:
            _hold(self.t0, max(self.sent, self.recv))
        counters().record(self.op, self.sent, self.recv, time.perf_counter() - self.t0)


# --------------------------------------------------------------------------- link emulator (chapter 6)

_LINK: tuple[float, float] | None = None  # (bytes per second, latency in seconds), or None: off


def set_link(gbps: float | None, latency_s: float = 0.0) -> None:
    """Emulate a slower link on this rank: every transfer through this module then takes at least
    ``latency_s + bytes / (gbps · 10⁹ / 8)`` seconds. ``None`` turns it off (the default).

    An EMULATION, not a network: the real transfer (a memory copy between processes here) runs
    first, then the rank sleeps for what is left of that time. A send and a receive posted together
    (``exchange``) overlap, as on a full-duplex link: the larger of the two counts. Every rank must
    set the same link; figures that use it say "emulated link". Chapter 6 (compression) uses it.
    """
    global _LINK
    if gbps is None:
        _LINK = None
        return
    if not (isinstance(gbps, (int, float)) and gbps > 0 and gbps != float("inf")):
        raise ValueError(f"gbps must be a positive number of gigabits per second, got {gbps!r}")
    if not (isinstance(latency_s, (int, float)) and 0 <= latency_s < 10):
        raise ValueError(f"latency_s must be in [0, 10) seconds, got {latency_s!r}")
    _LINK = (gbps * 1e9 / 8, float(latency_s))


def link() -> tuple[float, float] | None:
    """The emulated link as (bytes per second, latency in seconds), or None when off."""
    return _LINK


def _hold(t0: float, nbytes: int) -> None:
    rate, latency = _LINK
    left = t0 + latency + nbytes / rate - time.perf_counter()
    if left > 0:
        time.sleep(left)  # sleeping leaves the core to the other ranks, as waiting on a NIC would


def _global(group, rank: int) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)


def _rank_world(group) -> tuple[int, int]:
    return dist.get_rank(group), dist.get_world_size(group)


# --------------------------------------------------------------------------- point-to-point


def send(tensor: torch.Tensor, dst: int, group=None, op: str = "send") -> None:
    with _Timed(op, sent=_nbytes(tensor)):
        dist.send(tensor, _global(group, dst), group=group)


def recv(tensor: torch.Tensor, src: int, group=None, op: str = "recv") -> None:
    with _Timed(op, recv=_nbytes(tensor)):
        dist.recv(tensor, _global(group, src), group=group)


class Pending:
    """A non-blocking send/recv; time is charged when you wait for it."""

    def __init__(self, works: list, op: str, sent: int, recv: int, linger: bool = False):
        self.works, self.op, self.sent, self.recv, self.linger = works, op, sent, recv, linger

    def wait(self) -> None:
        with _Timed(self.op, self.sent, self.recv):
            for w in self.works:
                w.wait()
        if self.linger:
            # Gloo: dropping a Work right after waiting for it (as a loop of exchange(...).wait()
            # does) put a hand-off with Gloo's I/O thread on the critical path of every step; a
            # ring on 4 ranks sharing 2 cores ran 3x slower than with each step's works released
            # one step later (measured, chapter 2). So the last two exchanges' works linger.
            _RECENT.append(self.works)


_RECENT: collections.deque = collections.deque(maxlen=2)


def exchange(send_t: torch.Tensor | None, dst: int | None, recv_t: torch.Tensor | None,
             src: int | None, group=None, op: str = "exchange") -> Pending:
    """Post a send to ``dst`` and a receive from ``src`` at once (either may be None)."""
    send_t = send_t if send_t is not None and send_t.numel() else None
    recv_t = recv_t if recv_t is not None and recv_t.numel() else None
    sent = _nbytes(send_t) if send_t is not None else 0
    recv_b = _nbytes(recv_t) if recv_t is not None else 0
    if context().backend == "nccl":
        # NCCL must see the send and the receive of one step as one group, or a ring deadlocks.
        ops = [dist.P2POp(fn, t, _global(group, peer), group)
               for fn, t, peer in ((dist.isend, send_t, dst), (dist.irecv, recv_t, src)) if t is not None]
        works = dist.batch_isend_irecv(ops) if ops else []
    else:
        # Gloo posts each op on its own, so call the process group directly (group-local ranks):
        # it skips dist.isend's per-call checks, a measurable share of a small ring step.
        pg = group if group is not None else dist.group.WORLD
        works = []
        if send_t is not None:
            works.append(pg.send([send_t], dst, 0))
        if recv_t is not None:
            works.append(pg.recv([recv_t], src, 0))
        return Pending(works, op, sent, recv_b, linger=True)
    return Pending(works, op, sent, recv_b)


# --------------------------------------------------------------------------- all-reduce by hand

_SCRATCH: dict[str, torch.Tensor] = {}


def _scratch(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A receive buffer kept between calls (one per device, grown on demand).

    Allocating a fresh 32 MB buffer per call cost page faults comparable to the additions
    themselves; reusing one is what the library does too. ``counters().scratch`` still records
    the bytes while an all-reduce uses them.
    """
    nbytes = numel * dtype.itemsize
    buf = _SCRATCH.get(str(device))
    if buf is None or buf.numel() < nbytes:
        buf = _SCRATCH[str(device)] = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)
    return buf[:nbytes].view(dtype)


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)


def _finish(tensor: torch.Tensor, flat: torch.Tensor, op: str, scratch_bytes: int) -> torch.Tensor:
    counters().scratch(-scratch_bytes)
    # Fold the steps into one entry, so a chart shows one call of ``op``.
    steps = counters().ops.pop(op + ".step", None)
    if steps is not None:
        counters().record(op, steps.bytes_sent, steps.bytes_recv, steps.seconds)
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view_as(tensor))
    return tensor


def ring_all_reduce(tensor: torch.Tensor, group=None, op: str = "ring_all_reduce") -> torch.Tensor:
    """In-place SUM over all ranks, like ``dist.all_reduce(tensor)``: reduce-scatter, then all-gather.

    Each rank talks only to its ring neighbours and sends 2(N-1) chunks of about S/N bytes,
    i.e. 2(N-1)/N·S in all — the bandwidth-optimal volume (Patarasuk & Yuan, 2009). The steps
    come from :func:`lesson_lib.schedules.ring_schedule`, the same schedule the animation draws.
    Defined for chapter 0 (data-parallel gradients) and studied in chapter 2.
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
    chunk = lambda i: flat[bounds[(i - shift) % n][0]:bounds[(i - shift) % n][1]]  # noqa: E731
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


# Chosen by measurement (paired with Gloo's all_reduce, 30 rounds a run, quiet 2-core machine, 2 ranks):
# at 16 MiB, 2 MiB segments gave 1.04-1.19x Gloo's speed over 7 runs, 1 MiB ones 0.98-1.10x over 5; at 4
# MiB (a 2 MiB chunk whole, or two 1 MiB segments) both 0.79-1.10x, Gloo's own time moving between 2.2
# and 4.0 ms from run to run; at 64 MiB both 1.11-1.31x. Each message costs a round of notice in Gloo (a
# send leaves only once the receiver has posted its receive), so fewer, larger segments win until the
# addition no longer hides.
SEGMENT_BYTES = 2 << 20


def pipelined_ring_all_reduce(tensor: torch.Tensor, group=None, segment_bytes: int = SEGMENT_BYTES,
                               op: str = "pipelined_ring_all_reduce") -> torch.Tensor:
    """The ring of :func:`ring_all_reduce` with each chunk sent in segments of ``segment_bytes``
    at most (chapter 2): a chunk up to that size goes whole, as in the plain ring.

    A segment does not wait for the rest of its step: as soon as segment k has landed (and, in
    the reduce-scatter, been added), segment k of the next step leaves, while the other segments
    are still on the wire — the addition of one overlaps the transfer of the others, the way the
    library's own ring hides its additions. Same chunks and bytes (2(N−1)/N·S), and the same
    scratch, reused from call to call; only the messages are smaller and more numerous. The order
    comes from :func:`lesson_lib.schedules.pipelined_ring_schedule`, the schedule the chapter animates.
    """
    if isinstance(segment_bytes, bool) or not isinstance(segment_bytes, int) or segment_bytes < 1:
        raise ValueError(f"segment_bytes must be a positive int, got {segment_bytes!r}")
    rank, n = _rank_world(group)
    if n == 1:
        return tensor
    flat = _flat(tensor)
    bounds = chunk_bounds(flat.numel(), n)
    chunk = lambda i: flat[bounds[i][0]:bounds[i][1]]  # noqa: E731
    k = max(1, -(-_nbytes(chunk(0)) // segment_bytes))  # chunk 0 is the largest, on every rank
    mine = [x for x in pipelined_ring_schedule(n, k) if x.rank == rank]  # in the order they cross
    scratch = _scratch(bounds[0][1] - bounds[0][0], flat.dtype, flat.device)
    counters().scratch(_nbytes(scratch))
    pieces = [chunk(c).tensor_split(k) for c in range(n)]  # views, made once per call
    # Segment j of any chunk lands in scratch at the offset of segment j of the largest chunk, so
    # segments of different steps in flight at once never share scratch.
    at = [lo for lo, _ in chunk_bounds(scratch.numel(), k)]

    def post(x):
        out, inc = pieces[x.send_chunk][x.segment], pieces[x.recv_chunk][x.segment]
        buf = scratch[at[x.segment]:at[x.segment] + inc.numel()] if x.phase == "reduce-scatter" else inc
        return x, exchange(out, x.send_to, buf, x.recv_from, group).works, buf, inc

    sent = sum(pieces[x.send_chunk][x.segment].numel() for x in mine) * flat.element_size()
    recv = sum(pieces[x.recv_chunk][x.segment].numel() for x in mine) * flat.element_size()
    with _Timed(op + ".step", sent=sent, recv=recv):
        flight = collections.deque(post(x) for x in mine[:k])  # the first step: all segments at once
        works = []
        for i in range(len(mine)):
            x, w, buf, target = flight.popleft()
            for one in w:
                one.wait()
            works += w
            if x.phase == "reduce-scatter":
                target.add_(buf)  # while the other segments are still on the wire
            if i + k < len(mine):
                flight.append(post(mine[i + k]))  # the same segment, next step: its data is ready
    _RECENT.append(works)  # Gloo: let the works outlive the call (see Pending.wait)
    return _finish(tensor, flat, op, _nbytes(scratch))


def naive_all_reduce(tensor: torch.Tensor, group=None, root: int = 0,
                     op: str = "naive_all_reduce") -> torch.Tensor:
    """In-place SUM the parameter-server way: everyone sends everything to ``root``, which adds
    and sends the sum back. Each rank sends S, but the root sends and receives (N−1)·S each:
    its link carries 2(N−1)·S while the others idle — the traffic jam the ring removes (chapter 2).
    """
    rank, n = _rank_world(group)
    if n == 1:
        return tensor
    flat = _flat(tensor)
    inner = op + ".step"
    if rank != root:
        exchange(flat, root, None, None, group, inner).wait()
        exchange(None, None, flat, root, group, inner).wait()
        return _finish(tensor, flat, op, 0)
    others = [r for r in range(n) if r != root]
    scratch = _scratch((n - 1) * flat.numel(), flat.dtype, flat.device)
    counters().scratch(_nbytes(scratch))
    bufs = scratch.view(n - 1, flat.numel())
    # All N−1 messages are in flight at once; add each as it lands.
    pending = [exchange(None, None, bufs[i], r, group, inner) for i, r in enumerate(others)]
    for p, buf in zip(pending, bufs):
        p.wait()
        flat.add_(buf)
    for p in [exchange(flat, r, None, None, group, inner) for r in others]:
        p.wait()
    return _finish(tensor, flat, op, _nbytes(scratch))


def halving_doubling_all_reduce(tensor: torch.Tensor, group=None,
                                op: str = "halving_doubling_all_reduce") -> torch.Tensor:
    """In-place SUM by recursive halving then doubling (Thakur, Rabenseifner & Gropp, 2005).

    2·log₂N steps instead of the ring's 2(N−1), the same 2(N−1)/N·S bytes when N is a power of
    two; otherwise the extra ranks first fold into their partners (:mod:`lesson_lib.schedules`).
    """
    rank, n = _rank_world(group)
    if n == 1:
        return tensor
    flat = _flat(tensor)
    bounds = chunk_bounds(flat.numel(), power_of_two_below(n))
    part = lambda chunks: flat[slice(*span(bounds, chunks))] if chunks else None  # noqa: E731
    mine = [st for st in halving_doubling_schedule(n) if st.rank == rank]
    biggest = max((part(st.recv).numel() for st in mine if st.reduce), default=0)
    scratch = _scratch(biggest, flat.dtype, flat.device)
    counters().scratch(_nbytes(scratch))
    for st in mine:
        target = part(st.recv)
        if st.reduce:
            buf = scratch[: target.numel()]
            exchange(part(st.send), st.peer, buf, st.peer, group, op + ".step").wait()
            target.add_(buf)
        else:
            exchange(part(st.send), st.peer, target, st.peer, group, op + ".step").wait()
    return _finish(tensor, flat, op, _nbytes(scratch))


# --------------------------------------------------------------------------- library collectives


ALGORITHMS = ("ring", "pipelined-ring", "halving-doubling", "naive", "library")
_BY_HAND = {"ring": ring_all_reduce, "pipelined-ring": pipelined_ring_all_reduce,
            "halving-doubling": halving_doubling_all_reduce, "naive": naive_all_reduce}


def all_reduce(tensor: torch.Tensor, algorithm: str = "ring", group=None, op: str | None = None):
    """SUM all-reduce with one of ours (``ring``, ``pipelined-ring``, ``halving-doubling``,
    ``naive``: counted exactly) or the backend's (``library``: bytes modelled)."""
    if algorithm in _BY_HAND:
        fn = _BY_HAND[algorithm]
        return fn(tensor, group, op=op or fn.__name__)
    if algorithm != "library":
        raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
    _, n = _rank_world(group)
    model = 2 * (n - 1) * _nbytes(tensor) // n
    with _Timed(op or "all_reduce[library]", sent=model, recv=model):
        dist.all_reduce(tensor, group=group)
    return tensor


def recv_any(tensor: torch.Tensor, op: str = "recv") -> int:
    """Blocking receive from whichever rank sends first; returns the sender's rank (chapter 1)."""
    with _Timed(op, recv=_nbytes(tensor)):
        return dist.recv(tensor)


def _ring_phase(flat: torch.Tensor, phase: str, group, op: str) -> None:
    """Run one phase of the ring schedule on ``flat`` with rank r owning chunk r (chapter 4).

    The schedule's reduce-scatter leaves rank r with chunk r+1; we label chunks one lower, so
    that rank r owns chunk r — a ZeRO rank owns shard r.
    """
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
