"""Our PowerSGD DDP hook against torch's ``powerSGD_hook``: time per step, interleaved.

Ours twice, all-reducing by our counted ring and by Gloo's all_reduce (the collective torch's hook
uses); a ratio is the median over rounds of ours / torch's (< 1: ours is faster).
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from lesson_lib.data import teacher_classification
from lesson_lib.milestones.compression import PowerSGD, ddp_hook
from lesson_lib.models import mlp
from lesson_lib.runtime import Cluster


def time_powersgd_hooks(rank: int = 2, steps: int = 20, rounds: int = 7, hidden: int = 256) -> list[dict]:
    """On each rank: seconds for ``steps`` DDP steps with our PowerSGD hook (all-reducing by our ring,
    ``ours``, and by the backend's all_reduce, ``ours_library``: torch's hook uses the backend's) and
    with torch's, per round, taking turns.

    The model (142k parameters, 570 KB) fits DDP's first 1 MB bucket: one bucket per step. With
    several buckets on Gloo, torch's hook chains all-reduces from callbacks while the next bucket's
    starts; two ranks then crashed in Gloo with mismatched message sizes on this machine.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel as DDP

    x, y = teacher_classification(64, 32, 10)
    models = {}
    for name in ("ours", "ours_library", "torch"):
        ddp = DDP(mlp(32, hidden, 3, 10, seed=0))
        if name == "torch":
            ddp.register_comm_hook(psgd.PowerSGDState(None, matrix_approximation_rank=rank,
                                                      start_powerSGD_iter=2), psgd.powerSGD_hook)
        else:
            algorithm = "library" if name == "ours_library" else "ring"
            ddp.register_comm_hook(None, ddp_hook(PowerSGD(rank=rank, start_iter=2, algorithm=algorithm)))
        models[name] = (ddp, torch.optim.SGD(ddp.parameters(), lr=0.01))

    def go(name: str) -> float:
        ddp, opt = models[name]
        t0 = time.perf_counter()
        for _ in range(steps):
            opt.zero_grad()
            F.cross_entropy(ddp(x), y).backward()
            opt.step()
        return time.perf_counter() - t0

    for name in models:  # past start_iter and the bucket rebuild, outside the timing
        go(name)
    return [{name: go(name) for name in models} for _ in range(rounds)]


def measure(world_size: int = 2, rank: int = 2, steps: int = 20, rounds: int = 7) -> dict:
    """Our PowerSGD DDP hook against torch's ``powerSGD_hook``: time per step, interleaved; ours twice,
    all-reducing by our counted ring and by Gloo's all_reduce (the collective torch's hook uses).

    Each round times ``steps`` steps of each hook back to back on the same ranks; a ratio is the
    median over rounds of ours / torch's (the slowest rank's time), robust to load that drifts. With
    the same collective on both sides the ratio is the hooks' own work; the gap between our two is
    our ring against Gloo's (``bench allreduce`` measures that alone).
    """
    with Cluster(world_size, quiet=True) as c:
        outs = c.run(time_powersgd_hooks, rank, steps, rounds)
        oversubscribed = c.oversubscribed
    names = ("ours", "ours_library", "torch")
    per_round = [{k: max(o[i][k] for o in outs) for k in names} for i in range(rounds)]
    return {"world_size": world_size, "rank": rank, "steps": steps, "rounds": per_round,
            **{f"{k}_s": statistics.median(r[k] for r in per_round) / steps for k in names},
            "ratio": statistics.median(r["ours"] / r["torch"] for r in per_round),
            "ratio_library": statistics.median(r["ours_library"] / r["torch"] for r in per_round),
            "oversubscribed": oversubscribed}


def show(r: dict) -> None:
    print(f"PowerSGD rank {r['rank']} in DDP on {r['world_size']} ranks, {r['steps']} steps x "
          f"{len(r['rounds'])} interleaved rounds")
    print(f"  ours, our counted ring:       {1e3 * r['ours_s']:.2f} ms/step   ours / torch's = "
          f"{r['ratio']:.2f}")
    print(f"  ours, Gloo's all_reduce:      {1e3 * r['ours_library_s']:.2f} ms/step   ours / torch's = "
          f"{r['ratio_library']:.2f}")
    print(f"  torch's powerSGD_hook (Gloo): {1e3 * r['torch_s']:.2f} ms/step")
    print("  (ratios: median over rounds; < 1: ours is faster)")
    if r["oversubscribed"]:
        print("note: more ranks than cores on this machine; times include time-sharing")
