"""One rank grid for every kind of parallelism, passed explicitly (no global singleton; chapter 8).

As picotron's ``process_group_manager.py``: ``torch.arange(world).view(dp, pp, tp)``; a rank's
tensor-parallel group is its row (on a real cluster, one node's GPUs). A :class:`Layout` is
checked in the notebook (:meth:`Layout.check`); a :class:`Grid` is built from it on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

_GROUPS: dict[tuple[int, ...], object] = {}  # per worker: a group is made once, then reused


@dataclass(frozen=True)
class Layout:
    """How many ranks each kind of parallelism gets; dp · pp · tp must be the world size."""

    dp: int = 1
    """Data-parallel replicas (each its share of the batch)."""
    tp: int = 1
    """Tensor-parallel ranks (each heads / tp heads and ffn / tp hidden units)."""
    pp: int = 1
    """Pipeline stages (the grid has the axis; chapter 3 trains with it)."""
    sequence_parallel: bool = False
    """Norms and residuals hold seq / tp tokens per rank (Korthikanti et al., 2022)."""

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.tp

    def check(self, world_size: int | None = None, cfg=None) -> "Layout":
        """Raise ValueError naming the parameter when the layout cannot run ``cfg`` on ``world_size``."""
        for name in ("dp", "tp", "pp"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a whole number ≥ 1, got {v!r}")
        if world_size is not None and self.world_size != world_size:
            raise ValueError(f"dp × pp × tp = {self.dp} × {self.pp} × {self.tp} = {self.world_size}, but "
                             f"world_size is {world_size}: every rank needs one place in the grid")
        if cfg is not None:
            need = {"heads": cfg.heads, "ffn": cfg.ffn}
            if self.sequence_parallel:
                need["seq"] = cfg.seq
            for name, value in need.items():
                if value % self.tp:
                    raise ValueError(f"{name} = {value} does not divide among tp = {self.tp} ranks")
            if cfg.batch % self.dp:
                raise ValueError(f"batch = {cfg.batch} does not divide among dp = {self.dp} replicas")
        return self


def _group(ranks: list[int]):
    key = tuple(ranks)
    if key not in _GROUPS:
        _GROUPS[key] = dist.new_group(list(ranks))
    return _GROUPS[key]


class Grid:
    """On a rank: its coordinates (``dp_rank``, ``pp_rank``, ``tp_rank``) and its groups
    (``dp_group``, ``pp_group``, ``tp_group``). Every rank builds every group, in one order."""

    def __init__(self, layout: Layout):
        world, rank = dist.get_world_size(), dist.get_rank()
        layout.check(world)
        self.layout = layout
        self.ranks = torch.arange(world).view(layout.dp, layout.pp, layout.tp)
        (self.dp_rank, self.pp_rank, self.tp_rank), = (self.ranks == rank).nonzero().tolist()
        d, p, t = self.dp_rank, self.pp_rank, self.tp_rank
        groups = {}
        for axis, name in ((2, "tp"), (0, "dp"), (1, "pp")):  # every group, in the same order everywhere
            lines = self.ranks.movedim(axis, -1).reshape(-1, self.ranks.shape[axis]).tolist()
            for line in lines:
                made = _group(line)
                if rank in line:
                    groups[name] = (made, line)
        (self.tp_group, self.tp_ranks), (self.dp_group, self.dp_ranks), (self.pp_group, self.pp_ranks) = \
            groups["tp"], groups["dp"], groups["pp"]
        assert self.tp_ranks[t] == rank and self.dp_ranks[d] == rank and self.pp_ranks[p] == rank

    def __repr__(self) -> str:
        return (f"Grid(rank {dist.get_rank()}: dp {self.dp_rank}, pp {self.pp_rank}, tp {self.tp_rank}; "
                f"tp group {self.tp_ranks}, dp group {self.dp_ranks})")
