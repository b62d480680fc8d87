"""Our data-parallel step against torch DDP's, on the same ranks, model, data and Adam, interleaved.

Ours four ways: one flat all-reduce after the backward or buckets during it, by our ring or the
backend's all_reduce; DDP gets the same bucket size. A ratio is the median over steps of ours / DDP's
(the slowest rank's step; > 1: ours is slower).
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from lesson_lib import comm
from lesson_lib.data import batch_indices, shard, teacher_classification
from lesson_lib.metrics import sync
from lesson_lib.milestones import data_parallel as dp
from lesson_lib.models import mlp
from lesson_lib.runtime import Cluster, context


def time_against_ddp(hidden_sizes: list[int], steps: int = 12, global_batch: int = 256,
                     bucket_mb: float = 4.0) -> dict:
    """On every rank: seconds of our data-parallel step and of ``DistributedDataParallel``'s, on the
    same model, data and Adam, interleaved step by step. The first step of each is dropped (warm-up).
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    ctx = context()
    rank, n, device = ctx.rank, ctx.world_size, ctx.device
    out = {}
    for hidden in hidden_sizes:
        cfg = dp.Config(world_size=n, hidden=hidden, global_batch=global_batch, steps=1,
                     samples=max(4096, global_batch)).validate()
        ours = {}
        for allreduce in ("ring", "library"):
            for mb in (0, bucket_mb):
                model, flat, optimizer = dp.build(cfg, device)
                overlap = dp.overlapped(model, flat, mb, allreduce, n) if mb else None
                ours[allreduce + ("+buckets" if mb else "")] = (model, flat, optimizer, allreduce, overlap)
        ddp = DDP(mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed).to(device),
                  bucket_cap_mb=bucket_mb)
        ddp_opt = torch.optim.Adam(ddp.parameters(), lr=cfg.lr)
        x_all, y_all = teacher_classification(cfg.samples, cfg.d_in, cfg.classes)
        names = [*ours, "ddp"]
        times: dict = {k: [] for k in names}
        for step in range(steps + 1):
            idx = shard(batch_indices(cfg.samples, cfg.global_batch, step, cfg.seed), rank, n)
            x, y = x_all[idx].to(device), y_all[idx].to(device)
            k = step % len(names)
            for name in names[k:] + names[:k]:  # take turns: load falls on all alike
                torch.distributed.barrier()
                t0 = time.perf_counter()
                if name == "ddp":
                    ddp_opt.zero_grad()
                    F.cross_entropy(ddp(x), y).backward()  # DDP all-reduces its buckets in here
                    ddp_opt.step()
                else:  # the library's train() step, without its meters and recorders
                    model, flat, optimizer, allreduce, overlap = ours[name]
                    optimizer.zero_grad(set_to_none=overlap is not None)
                    if overlap is not None:
                        overlap.start()
                    F.cross_entropy(model(x), y).backward()
                    if overlap is not None:
                        overlap.wait()
                    else:
                        comm.all_reduce(flat, allreduce, op="bench")
                        flat.div_(n)
                    optimizer.step()
                sync(device)
                times[name].append(time.perf_counter() - t0)
        for *_, overlap in ours.values():
            if overlap is not None:
                overlap.close()
        out[hidden] = {"params": ours["ring"][1].numel(), **{k: v[1:] for k, v in times.items()}}
    return out


def measure(hidden_sizes=(512, 1536, 2048), world_size: int = 2, steps: int = 12,
        bucket_mb: float = 4.0) -> list[dict]:
    """Our data-parallel step against torch DDP's on the same 2-rank cluster (about 0.55M, 4.8M and
    8.5M parameters, Adam, global batch 256), interleaved. Ours: one flat all-reduce after the
    backward, or buckets of ``bucket_mb`` MiB during it (DDP gets the same bucket size); by our ring
    or the library's all_reduce. Per size and variant: the median step of the slowest rank, and the
    median over steps of ours / DDP's (a paired ratio; > 1: ours is slower).
    """
    with Cluster(world_size, quiet=True) as cluster:
        outs = cluster.run(time_against_ddp, list(hidden_sizes), steps, bucket_mb=bucket_mb)
    rows = []
    for h in hidden_sizes:
        names = [k for k in outs[0][h] if k != "params"]
        slowest = {k: [max(o[h][k][i] for o in outs) for i in range(steps)] for k in names}
        for k in names[:-1]:
            rows.append({"hidden": h, "params": outs[0][h]["params"], "variant": k, "bucket_mb": bucket_mb,
                         "ours_s": statistics.median(slowest[k]), "ddp_s": statistics.median(slowest["ddp"]),
                         "ratio": statistics.median(a / b for a, b in zip(slowest[k], slowest["ddp"])),
                         "oversubscribed": cluster.oversubscribed})
    return rows


def show(rows: list[dict]) -> None:
    print(f"data-parallel step, ours vs torch DDP (buckets of {rows[0]['bucket_mb']:g} MiB "
          "during the backward)")
    print(f"{'params':>9} {'ours':>16} {'ours ms':>8} {'DDP ms':>8} {'ours/DDP':>9}")
    for r in rows:
        print(f"{r['params']:>9,} {r['variant']:>16} {1e3 * r['ours_s']:>8.2f} {1e3 * r['ddp_s']:>8.2f} "
              f"{r['ratio']:>9.2f}")
    if rows[0]["oversubscribed"]:
        print("note: more ranks than cores on this machine; times include time-sharing")
