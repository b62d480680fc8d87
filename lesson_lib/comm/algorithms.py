"""The all-reduce algorithms by name (chapter 2's experiment and bench), and the bytes each sends —
exact, from its schedule, and the textbook formula.

For ``algorithm="library"`` torch does not report its traffic, so the ring's 2(N-1)/N·S is recorded
(Patarasuk & Yuan, 2009), under an op name ending in ``[library]``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .p2p import _nbytes, _rank_world, _Timed
from .ring import pipelined_ring_all_reduce, ring_all_reduce
from .rivals import halving_doubling_all_reduce, naive_all_reduce
from .schedules import halving_doubling_bytes_sent, naive_bytes_sent, power_of_two_below, ring_bytes_sent

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


BYTES_SENT = {"ring": ring_bytes_sent, "pipelined-ring": ring_bytes_sent,  # the same chunks, in segments
              "halving-doubling": halving_doubling_bytes_sent, "naive": naive_bytes_sent}


def formula_bytes_sent(algorithm: str, nbytes: float, world_size: int, rank: int, root: int = 0) -> float:
    """The textbook per-rank volume, without chunk rounding: 2(N−1)/N·S for the ring, halving-
    doubling (N a power of two) and the library's collective; S or (N−1)·S for naive."""
    n = world_size
    if algorithm == "naive":
        return 0.0 if n == 1 else float((n - 1) * nbytes if rank == root else nbytes)
    if algorithm == "halving-doubling" and n & (n - 1):
        # Not a power of two: the first 2e ranks fold in pairs; the even one sends S once, its odd
        # partner sends the result back (S) on top of the p-rank core's 2(p−1)/p·S.
        p = power_of_two_below(n)
        core = 2 * (p - 1) * nbytes / p
        if rank < 2 * (n - p):
            return float(nbytes) if rank % 2 == 0 else core + nbytes
        return core
    return 2 * (n - 1) * nbytes / n
