"""Stragglers and failures, played by the room: every learner's kernel trains one data-parallel
replica of chapter 1's model, each step's gradients all-reduced (chapter 0), so the room's step is
as slow as its slowest member. A learner who leaves mid-round fails the round's all-reduce: the
round is discarded (nobody keeps its steps) and the next round goes on without them. A learner who
comes back, or joins late, is healed from a live peer at the start of their next round: the ranks
all-gather how many steps each has, and the first rank with the most broadcasts its weights
(chapter 10's heal, ``notebooks/10_resilience.ipynb``).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..data import batch_indices, shard, teacher_classification
from ..models import flat_views, mlp
from .rank import RankContext

DEFAULTS = {"steps": 6, "hidden": 256, "depth": 2, "batch": 128, "lr": 0.1, "seed": 0}
D_IN, CLASSES, SAMPLES = 32, 10, 4096


def learner(ctx: RankContext) -> dict:
    o = {**DEFAULTS, **ctx.opts}
    kept = ctx.mine.setdefault("steps", {"step": 0, "params": None, "candidate": None})
    cand = kept["candidate"]
    if cand is not None and cand["round"] in o.get("accepted", []):  # last round counted: keep it
        kept.update(step=cand["step"], params=cand["params"])
    kept["candidate"] = None
    model = mlp(D_IN, o["hidden"], o["depth"], CLASSES, o["seed"])
    flat, grads = flat_views(model)
    if kept["params"] is not None:
        flat.copy_(kept["params"])
    n, me = ctx.world, ctx.rank
    ctx.status("healing")
    counts = [torch.zeros(1, dtype=torch.int64) for _ in range(n)]
    dist.all_gather(counts, torch.tensor([kept["step"]]))
    counts = [int(c) for c in counts]
    src = counts.index(max(counts))
    healed_from = None
    if len(set(counts)) > 1:
        dist.broadcast(flat, src)
        if counts[me] < counts[src]:
            healed_from = ctx.names[src]
    step = counts[src]
    x, y = teacher_classification(SAMPLES, D_IN, CLASSES, seed=1234)
    work = max(1, int(ctx.mine.get("work", 1)))  # a straggler really computes its gradient more times
    records = []
    for _ in range(o["steps"]):
        ctx.status("computing", step=step)
        t0, c0 = time.perf_counter(), time.thread_time()
        idx = shard(batch_indices(SAMPLES, o["batch"] * n, step, o["seed"]), me, n)
        for _ in range(work):
            grads.zero_()
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
        t1, cpu = time.perf_counter(), time.thread_time() - c0
        ctx.status("waiting", "the room", step=step)
        dist.all_reduce(grads)
        flat -= o["lr"] * grads / n
        t2 = time.perf_counter()
        step += 1
        records.append({"step": step, "compute_s": t1 - t0, "cpu_s": cpu, "wait_s": t2 - t1,
                        "loss": loss.item()})
    kept["candidate"] = {"round": ctx.round, "step": step, "params": flat.clone()}
    ctx.status("done")
    return {"records": records, "start_step": counts[me], "end_step": step, "healed_from": healed_from,
            "work": work, "checksum": float(flat.double().sum())}


def summarize(names: list[str], results: dict[str, dict]) -> dict:
    """Each step's time is set by its slowest member: step time ≈ max over members of compute."""
    steps = len(results[names[0]]["records"])
    rows = []
    for i in range(steps):
        compute = {m: results[m]["records"][i]["compute_s"] for m in names}
        total = {m: results[m]["records"][i]["compute_s"] + results[m]["records"][i]["wait_s"] for m in names}
        slowest = max(compute, key=compute.get)
        rows.append({"step": results[names[0]]["records"][i]["step"], "compute_s": compute,
                     "step_s": max(total.values()), "slowest": slowest})
    slow = [r["slowest"] for r in rows]
    # the straggler: the most CPU time computing over the round (on a shared machine one step's wall
    # time also holds the time the others' processes had the core)
    total = {m: sum(r["compute_s"][m] for r in rows) for m in names}
    cpu = {m: sum(rec["cpu_s"] for rec in results[m]["records"]) for m in names}
    who = max(cpu, key=cpu.get)
    healed = {m: results[m]["healed_from"] for m in names if results[m]["healed_from"]}
    same = len({round(results[m]["checksum"], 4) for m in names}) == 1
    med = sorted(r["step_s"] for r in rows)[len(rows) // 2]
    verdict = (f"{len(names)} learners, {steps} steps: median step {med * 1e3:.0f} ms, set by the slowest "
               f"member, {who} ({total[who] * 1e3:.0f} ms of compute in all, slowest in {slow.count(who)} of "
               f"{steps} steps)")
    if healed:
        verdict += "; healed from a live peer: " + ", ".join(f"{m} from {src}" for m, src in healed.items())
    verdict += "; every replica holds the same weights" if same else "; REPLICAS DIFFER"
    return {"ok": same, "verdict": verdict, "rows": rows, "slowest": who, "compute_s": total, "cpu_s": cpu,
            "healed": healed, "end_step": results[names[0]]["end_step"]}
