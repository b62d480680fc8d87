"""The counted layer under every collective: point-to-point, the link emulator and scratch buffers.

Every call through :mod:`lesson_lib.comm` adds calls, bytes sent and received, and seconds to the
rank's :func:`lesson_lib.metrics.counters`, by op name; the hand-built collectives go through
:func:`exchange`.
"""

from __future__ import annotations

import collections
import time

import torch
import torch.distributed as dist

from ..metrics import counters, sync
from ..runtime import context


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
    """Emulate a slower link on this rank: each transfer then takes at least
    ``latency_s + bytes / (gbps · 10⁹ / 8)`` seconds; ``None`` turns it off.

    An emulation: the real transfer runs, then the rank sleeps for the rest. A send and a receive
    posted together overlap (full duplex). Every rank must set the same link; it lasts until the job ends.
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
    from ..runtime.hygiene import undo_after_job

    undo_after_job("comm.set_link", lambda: set_link(None))  # in a rank, for this job only


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
            # Gloo: dropping a Work right after waiting puts a hand-off with Gloo's I/O thread on
            # every step's critical path (``bench allreduce``), so the last two exchanges' works linger.
            _RECENT.append(self.works)


_RECENT: collections.deque = collections.deque(maxlen=2)


def exchange(send_t: torch.Tensor | None, dst: int | None, recv_t: torch.Tensor | None,
             src: int | None, group=None, op: str = "exchange", tag: int = 0) -> Pending:
    """Post a send to ``dst`` and a receive from ``src`` at once (either may be None); ``tag`` keeps
    two streams between the same ranks apart."""
    send_t = send_t if send_t is not None and send_t.numel() else None
    recv_t = recv_t if recv_t is not None and recv_t.numel() else None
    sent = _nbytes(send_t) if send_t is not None else 0
    recv_b = _nbytes(recv_t) if recv_t is not None else 0
    if context().backend == "nccl":
        # NCCL must see the send and the receive of one step as one group, or a ring deadlocks.
        ops = [dist.P2POp(fn, t, _global(group, peer), group, tag)
               for fn, t, peer in ((dist.isend, send_t, dst), (dist.irecv, recv_t, src)) if t is not None]
        works = dist.batch_isend_irecv(ops) if ops else []
    else:
        # Gloo: call the process group directly (group-local ranks), skipping dist.isend's checks.
        pg = group if group is not None else dist.group.WORLD
        works = []
        if send_t is not None:
            works.append(pg.send([send_t], dst, tag))
        if recv_t is not None:
            works.append(pg.recv([recv_t], src, tag))
        return Pending(works, op, sent, recv_b, linger=True)
    return Pending(works, op, sent, recv_b)


def recv_any(tensor: torch.Tensor, op: str = "recv") -> int:
    """Blocking receive from whichever rank sends first; returns the sender's rank (chapter 1)."""
    with _Timed(op, recv=_nbytes(tensor)):
        return dist.recv(tensor)


# --------------------------------------------------------------------------- shared by the collectives

_SCRATCH: dict[str, torch.Tensor] = {}


def _scratch(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A receive buffer kept between calls (one per device, grown on demand): a fresh one per call
    costs page faults comparable to the additions (``bench allreduce``)."""
    nbytes = numel * dtype.itemsize
    buf = _SCRATCH.get(str(device))
    if buf is None or buf.numel() < nbytes:
        buf = _SCRATCH[str(device)] = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)
    return buf[:nbytes].view(dtype)


def release_buffers() -> None:
    """Drop the kept receive buffers and lingering works, so each measured run (``PeakMemory``) pays
    for its own buffers, as in a fresh process."""
    _SCRATCH.clear()
    _RECENT.clear()


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
