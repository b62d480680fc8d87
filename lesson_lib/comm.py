"""Instrumented communication: point-to-point, collectives, and our own ring all-reduce.

Every call made through this module adds to the calling rank's counters
(:func:`lesson_lib.metrics.counters`): calls, bytes sent, bytes received and seconds, by op name.

* Point-to-point bytes are exact: the bytes of the tensors handed to the wire.
* ``ring_all_reduce`` is built from point-to-point calls, so its bytes are exact too.
* For the library's own collectives (``algorithm="library"``) torch does not say what went over
  the wire, so we record the bandwidth-optimal ring volume, 2(N-1)/N·S for all-reduce and
  (N-1)/N·S for all-gather / reduce-scatter (Patarasuk & Yuan, 2009). The op name ends in
  ``[library]`` so a chart can tell counted from modelled traffic.

Used by chapter 0 (data parallel) and chapter 2 (ring all-reduce) onwards.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from .metrics import counters, sync
from .runtime import context


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
        counters().record(self.op, self.sent, self.recv, time.perf_counter() - self.t0)


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

    def __init__(self, works: list, op: str, sent: int, recv: int):
        self.works, self.op, self.sent, self.recv = works, op, sent, recv

    def wait(self) -> None:
        with _Timed(self.op, self.sent, self.recv):
            for w in self.works:
                w.wait()


def exchange(send_t: torch.Tensor | None, dst: int | None, recv_t: torch.Tensor | None,
             src: int | None, group=None, op: str = "exchange") -> Pending:
    """Post a send to ``dst`` and a receive from ``src`` at once (either may be None)."""
    ops = []
    sent = recv_b = 0
    if send_t is not None and send_t.numel():
        ops.append(dist.P2POp(dist.isend, send_t, _global(group, dst), group))
        sent = _nbytes(send_t)
    if recv_t is not None and recv_t.numel():
        ops.append(dist.P2POp(dist.irecv, recv_t, _global(group, src), group))
        recv_b = _nbytes(recv_t)
    works = dist.batch_isend_irecv(ops) if ops else []
    return Pending(works, op, sent, recv_b)


# --------------------------------------------------------------------------- ring all-reduce


def chunk_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """Split ``n`` elements into ``parts`` contiguous chunks differing by at most one element."""
    base, extra = divmod(n, parts)
    bounds, start = [], 0
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        bounds.append((start, start + size))
        start += size
    return bounds


def ring_all_reduce(tensor: torch.Tensor, group=None, op: str = "ring_all_reduce") -> torch.Tensor:
    """In-place SUM over all ranks, like ``dist.all_reduce(tensor)``: reduce-scatter, then all-gather.

    Each rank talks only to its ring neighbours and sends 2(N-1) chunks of about S/N bytes,
    i.e. 2(N-1)/N·S in all — the bandwidth-optimal volume (Patarasuk & Yuan, 2009).
    Defined for chapter 0 (data-parallel gradients) and studied in chapter 2.
    """
    rank, n = _rank_world(group)
    if n == 1:
        return tensor
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)
    bounds = chunk_bounds(flat.numel(), n)
    chunk = lambda i: flat[bounds[i % n][0]:bounds[i % n][1]]  # noqa: E731
    right, left = (rank + 1) % n, (rank - 1) % n
    scratch = torch.empty(bounds[0][1] - bounds[0][0], dtype=flat.dtype, device=flat.device)
    counters().scratch(_nbytes(scratch))
    inner = op + ".step"
    # Reduce-scatter: after step s, chunk (rank - s - 1) holds the sum of s + 2 ranks' values.
    for s in range(n - 1):
        incoming = chunk(rank - s - 1)
        buf = scratch[: incoming.numel()]
        exchange(chunk(rank - s), right, buf, left, group, op=inner).wait()
        incoming.add_(buf)
    # All-gather: each rank now owns the full sum of chunk (rank + 1); pass them round.
    for s in range(n - 1):
        exchange(chunk(rank + 1 - s), right, chunk(rank - s), left, group, op=inner).wait()
    counters().scratch(-_nbytes(scratch))
    # Fold the 2(N-1) steps into one entry, so a chart shows one ring_all_reduce call.
    steps = counters().ops.pop(inner)
    counters().record(op, steps.bytes_sent, steps.bytes_recv, steps.seconds)
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view_as(tensor))
    return tensor


# --------------------------------------------------------------------------- library collectives


def all_reduce(tensor: torch.Tensor, algorithm: str = "ring", group=None, op: str | None = None):
    """SUM all-reduce with our ring (``algorithm="ring"``) or the backend's (``"library"``)."""
    if algorithm == "ring":
        return ring_all_reduce(tensor, group, op=op or "ring_all_reduce")
    if algorithm != "library":
        raise ValueError(f"algorithm must be 'ring' or 'library', got {algorithm!r}")
    _, n = _rank_world(group)
    model = 2 * (n - 1) * _nbytes(tensor) // n
    with _Timed(op or "all_reduce[library]", sent=model, recv=model):
        dist.all_reduce(tensor, group=group)
    return tensor


def all_gather_into(output: torch.Tensor, shard: torch.Tensor, group=None, op: str = "all_gather[library]"):
    _, n = _rank_world(group)
    model = (n - 1) * _nbytes(shard)
    with _Timed(op, sent=model, recv=model):
        dist.all_gather_into_tensor(output, shard, group=group)
    return output


def reduce_scatter_into(shard: torch.Tensor, full: torch.Tensor, group=None,
                        op: str = "reduce_scatter[library]"):
    _, n = _rank_world(group)
    model = (n - 1) * _nbytes(shard)
    with _Timed(op, sent=model, recv=model):
        dist.reduce_scatter_tensor(shard, full, group=group)
    return shard


def barrier(group=None) -> None:
    with _Timed("barrier"):
        dist.barrier(group=group)


def ring_bytes_sent(numel: int, element_size: int, world_size: int, rank: int) -> int:
    """Exact bytes rank ``rank`` sends in :func:`ring_all_reduce` of ``numel`` elements.

    Reduce-scatter sends every chunk but chunk rank+1, all-gather every chunk but chunk rank+2,
    so the total is 2S minus two chunks: 2(N-1)/N·S up to the rounding of uneven chunks.
    """
    if world_size == 1:
        return 0
    bounds = chunk_bounds(numel, world_size)
    size = lambda i: bounds[i % world_size][1] - bounds[i % world_size][0]  # noqa: E731
    return element_size * (2 * numel - size(rank + 1) - size(rank + 2))


def recv_any(tensor: torch.Tensor, op: str = "recv") -> int:
    """Blocking receive from whichever rank sends first; returns the sender's rank (chapter 1)."""
    with _Timed(op, recv=_nbytes(tensor)):
        return dist.recv(tensor)
