"""The ring's rivals (chapter 2): the same in-place SUM by naive reduce-to-one + broadcast (the
parameter-server pattern) and by recursive halving-doubling, built like the ring from the counted
point-to-point calls of :mod:`.p2p`, so their bytes are exact too.
"""

from __future__ import annotations

import torch

from ..metrics import counters
from .p2p import _finish, _flat, _nbytes, _rank_world, _scratch, exchange
from .schedules import chunk_bounds, halving_doubling_schedule, power_of_two_below, span


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
    two; otherwise the extra ranks first fold into their partners (:mod:`lesson_lib.comm.schedules`).
    """
    rank, n = _rank_world(group)
    if n == 1:
        return tensor
    flat = _flat(tensor)
    bounds = chunk_bounds(flat.numel(), power_of_two_below(n))
    part = lambda chunks: flat[slice(*span(bounds, chunks))] if chunks else None
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
