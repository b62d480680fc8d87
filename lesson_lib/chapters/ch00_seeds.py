"""Chapter 0's seeding lesson (notebooks/00_why_distributed.ipynb): which random numbers the ranks
draw, measured on real ranks. A seed shared by every rank makes them all draw the same numbers (right
for replicated weights, wrong for dropout masks, shuffling or weight shards that must differ);
``torch.manual_seed(base + rank)`` gives each rank its own stream.

Nothing here imports IPython: :func:`draws_job` and :func:`seed_job` run inside the workers.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..runtime import Cluster, warm_cluster

# how each rank seeds before drawing: None, not seeded in this job; else whether it adds its rank
CASES = {
    "not seeded": None,
    "torch.manual_seed(base) on every rank": False,
    "torch.manual_seed(base + rank)": True,
}


def draws_job(seed: int | None, per_rank: bool, n: int = 4) -> list[float]:
    """On every rank: seed as told (``seed + rank`` with ``per_rank``), then ``torch.rand(n)``."""
    if seed is not None:
        torch.manual_seed(seed + dist.get_rank() if per_rank else seed)
    return torch.rand(n).tolist()


def seed_job(seed: int) -> None:
    """On every rank: seed the generator and draw nothing (does the seed reach the next job?)."""
    torch.manual_seed(seed)


def _same(draws: list[list[float]]) -> bool:
    return all(d == draws[0] for d in draws)


def seeding(world_size: int = 4, base: int = 1234, n: int = 4, cluster: Cluster | None = None,
            show: bool = True) -> dict:
    """Draw ``torch.rand(n)`` on every rank: not seeded, seeded with ``base`` everywhere, and seeded
    with ``base + rank``; then seed in one job and draw unseeded in the next, to see whether the seed
    carried over. Prints each rank's draws; returns them and whether the ranks agreed."""
    c = cluster or warm_cluster(world_size)
    draws = {label: c.run(draws_job, None if per_rank is None else base, bool(per_rank), n)
             for label, per_rank in CASES.items()}
    c.run(seed_job, base)  # the job after it draws unseeded: a fresh generator, or base's numbers?
    after = c.run(draws_job, None, False, n)
    seeded = torch.Generator().manual_seed(base)
    base_draws = torch.rand(n, generator=seeded).tolist()
    out = {"draws": draws, "same": {k: _same(d) for k, d in draws.items()},
           "carried_over": any(d == base_draws for d in after), "next_job": after}
    if show:
        for label, ds in draws.items():
            print(f"{label}: {'the same on every rank' if out['same'][label] else 'different on each rank'}")
            for r, d in enumerate(ds):
                print(f"  rank {r}: " + "  ".join(f"{v:.4f}" for v in d))
        print(f"a job after one that called torch.manual_seed({base}): "
              + ("drew base's numbers (the seed carried over)" if out["carried_over"] else
                 "fresh numbers on every rank (no seed carries from one job to the next)"))
    return out
