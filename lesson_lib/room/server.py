"""The parameter server, played by the room: the instructor's kernel is rank 0 and serves, every
learner's kernel is a worker that pulls the weights and pushes gradients of chapter 1's model
(``notebooks/01_parameter_server.ipynb``, ``milestones/parameter_server``).

Synchronous: each step the server sends the weights to every worker, receives every gradient, and
applies their mean. Asynchronous: the server applies each gradient as it arrives (``dist.recv``
from any rank) and sends that worker fresh weights; a gradient's staleness is how many updates the
weights moved while its worker computed it. The server counts its bytes and times its steps, so
the room sees its load grow with the room: 2 · N · S bytes per synchronous step.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..data import batch_indices, shard, teacher_classification
from ..models import flat_views, mlp
from .rank import RankContext

DEFAULTS = {"mode": "sync", "steps": 8, "hidden": 64, "depth": 1, "batch": 32, "lr": 0.1, "seed": 0}
D_IN, CLASSES, SAMPLES = 32, 10, 2048  # chapter 1's task: a teacher-labelled classification


def _opts(ctx: RankContext) -> dict:
    return {**DEFAULTS, **ctx.opts}


def _model(o: dict):
    return flat_views(mlp(D_IN, o["hidden"], o["depth"], CLASSES, o["seed"]))


def server(ctx: RankContext) -> dict:
    """Rank 0, the instructor's kernel."""
    o = _opts(ctx)
    flat, _ = _model(o)
    n_workers, buf = ctx.world - 1, torch.empty_like(flat)
    nbytes = flat.numel() * flat.element_size()
    step_s, staleness, bytes_in, bytes_out = [], [], 0, 0
    started = time.perf_counter()
    if o["mode"] == "sync":
        for _ in range(o["steps"]):
            t0 = time.perf_counter()
            ctx.status("sending weights")
            for handle in [dist.isend(flat, w) for w in range(1, ctx.world)]:
                handle.wait()
            ctx.status("waiting", "the workers")
            total = torch.zeros_like(flat)
            for w in range(1, ctx.world):
                dist.recv(buf, w)
                total += buf
            flat -= o["lr"] * total / n_workers
            bytes_out, bytes_in = bytes_out + n_workers * nbytes, bytes_in + n_workers * nbytes
            step_s.append(time.perf_counter() - t0)
    else:
        version, got = 0, {}
        for w in range(1, ctx.world):
            dist.send(flat, w)
            got[w], bytes_out = 0, bytes_out + nbytes
        left = {w: o["steps"] for w in range(1, ctx.world)}
        t0 = time.perf_counter()
        while any(left.values()):
            ctx.status("waiting", "any worker")
            src = dist.recv(buf)
            staleness.append(version - got[src])
            flat -= o["lr"] * buf
            version, left[src], bytes_in = version + 1, left[src] - 1, bytes_in + nbytes
            if left[src]:
                dist.send(flat, src)
                got[src], bytes_out = version, bytes_out + nbytes
            if version % n_workers == 0:  # one "step" = as many updates as there are workers
                step_s.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
    ctx.status("done")
    return {"mode": o["mode"], "workers": n_workers, "params": flat.numel(), "step_s": step_s,
            "wall_s": time.perf_counter() - started, "bytes_in": bytes_in, "bytes_out": bytes_out,
            "bytes_per_step": (bytes_in + bytes_out) / max(1, o["steps"]), "staleness": staleness,
            "checksum": float(flat.double().sum())}


def worker(ctx: RankContext) -> dict:
    """A learner's rank: pull, compute a gradient on its shard of the batch, push."""
    o = _opts(ctx)
    model = mlp(D_IN, o["hidden"], o["depth"], CLASSES, o["seed"])
    flat, grads = flat_views(model)
    x, y = teacher_classification(SAMPLES, D_IN, CLASSES, seed=1234)
    n_workers, me = ctx.world - 1, ctx.rank - 1
    work = max(1, int(ctx.mine.get("work", 1)))  # a straggler really computes its gradient more times
    losses, compute_s = [], []
    for step in range(o["steps"]):
        if o["mode"] == "sync" or step == 0:
            ctx.status("waiting", "instructor", step=step)
            dist.recv(flat, 0)
        ctx.status("computing", step=step)
        t0 = time.perf_counter()
        idx = shard(batch_indices(SAMPLES, o["batch"] * n_workers, step, o["seed"]), me, n_workers)
        for _ in range(work):
            grads.zero_()
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
        compute_s.append(time.perf_counter() - t0)
        losses.append(loss.item())
        dist.send(grads, 0)
        if o["mode"] == "async" and step < o["steps"] - 1:
            ctx.status("waiting", "instructor", step=step)
            dist.recv(flat, 0)
    ctx.status("done")
    return {"losses": losses, "compute_s": compute_s}


def summarize(names: list[str], server_result: dict, results: dict[str, dict]) -> dict:
    """The round in numbers: the server's load and the workers' losses."""
    s = server_result
    first = [results[m]["losses"][0] for m in names if m in results]
    last = [results[m]["losses"][-1] for m in names if m in results]
    med = sorted(s["step_s"])[len(s["step_s"]) // 2] if s["step_s"] else float("nan")
    verdict = (f"{s['mode']}: {s['workers']} workers, the server moved {s['bytes_per_step'] / 1e3:,.1f} kB "
               f"a step "
               f"(2 · N · {s['params'] * 4 / 1e3:,.1f} kB), median step {med * 1e3:.1f} ms; mean loss "
               f"{sum(first) / len(first):.3f} → {sum(last) / len(last):.3f}")
    if s["staleness"]:
        mean = sum(s["staleness"]) / len(s["staleness"])
        verdict += f"; staleness mean {mean:.2f}, max {max(s['staleness'])}"
    return {"ok": True, "verdict": verdict, "median_step_s": med, **s}
