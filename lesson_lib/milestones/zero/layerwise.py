"""LARS and LAMB under ZeRO (chapters 4 and 5): layer norms from sharded layers.

A rank holds only a slice of each layer, so it sums the squares of its slice and the ranks
all-reduce the partial sums (``norm_all_reduce``: a few bytes per tensor per step). The optimizer
runs on *pieces* — the possibly empty part of each tensor in this rank's slice — so every rank
calls the same all-reduces in the same order.
"""

from __future__ import annotations

import torch

from ... import comm, optim
from ...comm.schedules import ring_bytes_sent


def sharded_norm(t: torch.Tensor) -> torch.Tensor:
    """‖t‖ over the whole tensor, of which every rank holds a slice (possibly empty)."""
    squares = t.float().square().sum().reshape(1)
    comm.ring_all_reduce(squares, op="norm_all_reduce")
    return squares[0].sqrt()


class PieceOptimizer:
    """LARS or LAMB over each rank's pieces of the parameter tensors, fed from ZeRO's shards.

    ``masters`` are ZeRO's per-layer tensors the step updates (a layer's slice [lo, hi) of its
    flat buffer, or the whole buffer at stage 0); ``layouts`` give, per layer, each parameter's
    [start, end) in that flat buffer and whether it is a weight (adapted, decayed) or not.
    """

    def __init__(self, name: str, masters: list, spans: list[tuple[int, int]], layouts: list,
                 lr: float, weight_decay: float, sharded: bool):
        self.masters = masters
        self.pieces, weights, others = [], [], []
        for m, (lo, hi), layout in zip(masters, spans, layouts):
            for start, end, is_weight in layout:
                a, b = max(start, lo) - lo, max(min(end, hi), max(start, lo)) - lo
                piece = m[a:b]
                self.pieces.append((m, a, b, piece))
                (weights if is_weight else others).append(piece)
        groups = [{"params": weights, "weight_decay": weight_decay, "adapt": True},
                  {"params": others, "weight_decay": 0.0, "adapt": False}]
        norm = sharded_norm if sharded else None
        cls = {"lars": optim.LARS, "lamb": optim.LAMB}[name]
        self.inner = cls(groups, lr=lr, norm=norm, record_stats=False)
        self.tensors_per_step = len(self.pieces)  # norms all-reduced: two per tensor per step

    @property
    def state(self):
        return self.inner.state

    def step(self) -> None:
        for m, a, b, piece in self.pieces:  # each piece's gradient is the same slice of m.grad
            piece.grad = m.grad[a:b]
        self.inner.step()
        for *_, piece in self.pieces:
            piece.grad = None


def layouts(units) -> list[list[tuple[int, int, bool]]]:
    """Per ZeRO unit, each parameter's [start, end) in the unit's flat buffer and if it is a weight."""
    out = []
    for u in units:
        offset, layout = 0, []
        for p in u.params:
            layout.append((offset, offset + p.numel(), p.ndim > 1))
            offset += p.numel()
        out.append(layout)
    return out


def norm_traffic(tensors: int, world_size: int, rank: int) -> int:
    """Bytes ``rank`` sends per step for the norms: two 4-byte ring all-reduces per tensor."""
    return 2 * tensors * ring_bytes_sent(1, 4, world_size, rank)
