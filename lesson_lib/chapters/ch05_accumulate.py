"""Chapter 5, §7 — gradient accumulation (notebooks/05_large_batch.ipynb): one global batch on 2
ranks with each rank's share in k = 1, 2, 4 micro-batches (``large_batch.Config`` preset
``accumulate``), beside torch DDP's ``no_sync()``; and the write-it-yourself ``accumulate_step``,
judged on real ranks by what its communication did.

Nothing here runs at import; :func:`compare` is one notebook cell's figure work.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .. import plots
from ..comm import ring_bytes_sent
from ..data import batch_indices, shard, teacher_classification
from ..exercises import (
    Exercise,
    Property,
    Verdict,
    judge,
    observe,
    on_ranks,
    pair,
    solution_text,
    summary,
    unobserved,
)
from ..experiments import run_warm
from ..milestones import accumulation
from ..milestones import data_parallel as dp
from ..milestones import large_batch as lb
from ..models import mlp
from ..numerics import max_gap, sum_order_tolerance
from ..runtime import warm_cluster


def compare(ks=(1, 2, 4), preset: str = "accumulate") -> dict:
    """``preset``'s run once per k in ``ks``, and by DDP at the largest k with and without ``no_sync()``:
    the loss gaps to k = 1 (and the rounding tolerance), the counted all-reduce bytes per step and
    their formula, each rank's measured peak, the median step time; DDP's all-reduces per step
    (counted by its comm hook). Prints a table, draws the peaks."""
    from IPython.display import display

    cfgs = {k: lb.Config.from_preset(preset, accumulate=k) for k in ks}  # all validated before any run
    runs = {k: run_warm(cfg) for k, cfg in cfgs.items()}
    base = runs[ks[0]].losses
    cluster = warm_cluster(cfgs[ks[-1]].world_size)
    ddp = {sync: cluster.run(accumulation.ddp_worker, cfgs[ks[-1]], lb.lr_at, sync)[0]
           for sync in (True, False)}
    n, psi = cfgs[ks[0]].world_size, runs[ks[0]]["param_count"]
    rows = [{"k": k, "micro_batch": cfgs[k].global_batch // n // k, "loss_gap": max_gap(base, r.losses),
             "grad_bytes_per_step": r["grad_bytes_per_step"],
             "peak": [p.memory["measured_peak"] for p in r.per_rank],
             "at_first_step": [p.memory["measured_at_reset"] for p in r.per_rank],
             "step_s": r.median_step_time()} for k, r in runs.items()]
    out = {"rows": rows, "tolerance": sum_order_tolerance(base), "steps": len(base),
           # one ring all-reduce of the Ψ float32 gradients and the loss per step, the busiest rank
           "grad_bytes_formula": max(ring_bytes_sent(psi + 1, 4, n, r) for r in range(n)),
           "ddp_loss_gap": max(max_gap(base, d["losses"]) for d in ddp.values()), "param_bytes": 4 * psi,
           # per step, the bytes of each all-reduce DDP launched: with no_sync(), then without
           "ddp_no_sync": ddp[True]["all_reduce_bytes"],
           "ddp_every_micro_batch": ddp[False]["all_reduce_bytes"]}
    print(f"global batch {cfgs[ks[0]].global_batch} on {n} ranks, {len(base)} SGD steps; loss gaps to k = "
          f"{ks[0]} (rounding allows {out['tolerance']:.1e}):")
    print(f"{'k':>3} {'micro-batch':>12} {'loss gap':>9} {'all-reduce B/step':>18} {'peak MB/rank':>13} "
          f"{'step ms':>8}")
    for r in rows:
        print(f"{r['k']:>3} {r['micro_batch']:>12} {r['loss_gap']:>9.1e} {r['grad_bytes_per_step']:>18,.0f} "
              f"{max(r['peak']) / 1e6:>13.2f} {1e3 * r['step_s']:>8.1f}")
    for name, key in (("with no_sync()", "ddp_no_sync"), ("without it", "ddp_every_micro_batch")):
        calls = sorted({len(c) for c in out[key]})
        print(f"DDP at k = {ks[-1]} {name}: all-reduces per step {', '.join(map(str, calls))}, of "
              f"{out[key][0][0]:,} bytes each (the {psi:,} gradients)")
    print(f"DDP's largest loss gap to k = {ks[0]}: {out['ddp_loss_gap']:.1e}")
    display(plots.large_batch.accumulation(rows))
    return out


# --------------------------------------------------------------------------- the exercise

TASK = {"steps": 6, "global_batch": 48, "hidden": 32, "depth": 2, "lr": 0.05}  # chapter 0's, SGD
CASES = ((2, 4), (3, 2))  # (ranks, micro-batches per step): 24 samples in 4 × 6, 16 in 2 × 8
TIMEOUT_S = 15.0


def accumulate_job(fn: Callable, k: int, task: dict) -> dict:
    """On every rank: SGD with momentum on this rank's share of each global batch, handed to the
    learner's ``fn(model, batches)`` as ``k`` micro-batches; ``fn`` leaves the whole batch's gradient
    in ``p.grad``. Observed: the loss of each step (a forward of its own, all-reduced outside the
    log), the learner's communication, and marks at each step's start, each forward's start, each
    backward's end (the first layer's weight gradient, autograd's last) and ``fn``'s return."""
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = dp.Config(world_size=world, optimizer="sgd", **task)
    model = mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    x_all, y_all = teacher_classification(cfg.samples, cfg.d_in, cfg.classes)
    reduce, losses = unobserved(dist.all_reduce), []  # the loop's own sum of the losses, not logged
    whole = mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed)  # step 0's model, unhooked
    at0 = batch_indices(cfg.samples, cfg.global_batch, 0, cfg.seed)
    F.cross_entropy(whole(x_all[at0]), y_all[at0]).backward()  # the whole global batch's gradient
    first, seen, resets = next(model.parameters()), {"prev": None, "incoming": None}, []

    def accumulated(p):  # after each backward: did p.grad add this micro-batch's gradient to the last?
        log.mark("backward")
        got, prev, new = p.grad.detach(), seen["prev"], seen["incoming"]
        if prev is not None and new is not None and torch.allclose(got, new) \
                and not torch.allclose(got, prev + new):
            resets.append(len(losses) - 1)  # the gradient was reset between two micro-batches
        seen["prev"] = got.clone()

    with observe() as log:
        model.register_forward_pre_hook(lambda m, a: log.mark("forward"))
        first.register_hook(lambda g: seen.__setitem__("incoming", g.detach().clone()))
        first.register_post_accumulate_grad_hook(accumulated)
        for step in range(cfg.steps):
            idx = shard(batch_indices(cfg.samples, cfg.global_batch, step, cfg.seed), rank, world)
            with torch.no_grad():
                total = F.cross_entropy(model(x_all[idx]), y_all[idx]).reshape(1)
            reduce(total)
            losses.append(float(total) / world)
            optimizer.zero_grad(set_to_none=False)
            seen["prev"] = None
            log.mark("step")
            fn(model, [(x_all[m], y_all[m]) for m in idx.chunk(k)])
            log.mark("returned", settle=True)
            if step == 0:
                scale = _scale(model, whole)
            optimizer.step()
    grad_bytes = 4 * sum(p.numel() for p in model.parameters())
    return {"losses": losses, **log.as_data(), "k": k, "grad_bytes": grad_bytes, "resets": resets,
            "world": world, **scale}


def _scale(model, whole) -> dict:
    """Step 0's p.grad against the whole global batch's gradient: ``ratio`` (the least-squares
    multiple) and whether p.grad is that multiple of it (``parallel``), to float32 rounding."""
    def flat(m):
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in m.parameters()])

    got, want = flat(model), flat(whole)
    ratio = float(got @ want / (want @ want))
    off = float((got - ratio * want).norm())
    return {"ratio": ratio, "parallel": off <= 1e-3 * abs(ratio) * float(want.norm())}


def _steps(o: dict) -> list[dict]:
    """Per step: the forward and backward marks in order, and the calls made between the step's
    start and fn's return."""
    starts = [m["at"] for m in o["marks"] if m["label"] == "step"]
    ends = [m["at"] for m in o["marks"] if m["label"] == "returned"]
    passes = [m for m in o["marks"] if m["label"] in ("forward", "backward")]
    return [{"passes": [m for m in passes if a < m["at"] < b], "end": b,
             "calls": [c for c in o["calls"] if a <= c["start"] <= b]} for a, b in zip(starts, ends)]


def _k_backwards(outs: list[dict]) -> str | None:
    for r, o in enumerate(outs):
        for s, step in enumerate(_steps(o)):
            order = "".join(m["label"][0].upper() for m in step["passes"])
            if order != "FB" * o["k"]:
                return (f"on rank {r}, step {s} ran forward (F) and backward (B) passes in the order "
                        f"{order or 'none'} for {o['k']} micro-batches: one forward, then its backward, for "
                        "each in turn, so that only one micro-batch's activations are alive at a time")


def _none_before_last(outs: list[dict]) -> str | None:
    for r, o in enumerate(outs):
        for s, step in enumerate(_steps(o)):
            last = step["passes"][-2]["at"]  # the last micro-batch's forward began
            early = [c for c in step["calls"] if c["start"] < last]
            if early:
                after = sorted({sum(m["label"] == "backward" and m["at"] < c["start"] for m in step["passes"])
                                for c in early})
                right = o["parallel"] and abs(o["ratio"] - 1) < 1e-3
                sent = sum(c["bytes"] for c in step["calls"])
                return (f"on rank {r}, step {s}: {summary(early)} ran after micro-batch "
                        f"{', '.join(map(str, after))} of {o['k']}, before the last one; the step sent "
                        f"{sent:,} bytes, {sent / o['grad_bytes']:.3g}× the gradients' {o['grad_bytes']:,}: "
                        "all-reducing as the micro-batches go sends the whole gradient again each time — let "
                        "backward add the k gradients up in p.grad, then all-reduce once, after the last"
                        + (" (the gradient it leaves is right: only the traffic is wrong)" if right else
                           "; and the gradient it leaves is not the whole batch's either"))


def _once(outs: list[dict]) -> str | None:
    for r, o in enumerate(outs):
        for s, step in enumerate(_steps(o)):
            sent = sum(c["bytes"] for c in step["calls"] if c["op"] == "all_reduce")
            if not sent:
                return (f"on rank {r}, step {s} ran {summary(step['calls'])}, no all-reduce: each rank then "
                        "steps on its own micro-batches only")
            if not o["grad_bytes"] <= sent < 2 * o["grad_bytes"]:
                return (f"on rank {r}, step {s} handed {sent:,} bytes to all-reduce "
                        f"({summary(step['calls'])}); the gradients are {o['grad_bytes']:,} bytes, each "
                        "to be all-reduced once")
            late = [c for c in step["calls"] if c["done"] is None or c["done"] > step["end"]]
            if late:
                return (f"on rank {r}, accumulate_step returned while {summary(late)} had not been waited "
                        "for: wait for every handle before the optimizer uses the gradients")


def _adds_up(outs: list[dict]) -> str | None:
    for r, o in enumerate(outs):
        if o["resets"]:
            return (f"on rank {r}, step {o['resets'][0]}: a micro-batch's backward found the gradient reset "
                    "— zero_grad() inside the micro-batch loop? Then only the last micro-batch reaches the "
                    "step: zero the gradients once, before the first micro-batch, and let backward add up")


def _scaled(outs: list[dict]) -> str | None:
    for r, o in enumerate(outs):
        ratio, k, n = o["ratio"], o["k"], o["world"]
        if not o["parallel"] or abs(ratio - 1) < 1e-3:
            continue  # right, or not a multiple of it: the losses below say how far training went
        named = {k: f"the k = {k} micro-batch losses, each a mean over its own samples, add up to k × the "
                    "mean: divide each loss (or the summed gradient) by k",
                 1 / k: f"divided by k = {k} twice: once is enough, each loss or the summed gradient",
                 n: f"all_reduce sums the N = {n} ranks' gradients: divide the sum by N",
                 1 / n: f"divided by N = {n} twice: once, after the all-reduce, is enough",
                 k * n: f"divided neither by k = {k} (the micro-batches) nor by N = {n} (the ranks)"}
        why = next((w for x, w in named.items() if abs(ratio - x) < 1e-3 * x),
                   f"the whole batch's mean is the sum over micro-batches and ranks divided by k·N = {k * n}")
        return (f"on rank {r}, after step 0 p.grad is {ratio:.4g}× the gradient single-process training "
                f"takes on the whole global batch: {why}")


def _whole_batch(outs: list[dict]) -> str | None:
    ref = dp.reference(dp.Config(world_size=1, optimizer="sgd", **TASK))
    tol, got = sum_order_tolerance(ref), outs[0]["losses"]
    gaps = [abs(a - b) for a, b in zip(got, ref)]
    if max(gaps) > tol:
        s = next(i for i, g in enumerate(gaps) if g > tol)
        a, b = pair(got[s], ref[s])
        return (f"at step {s} the loss is {a}, single-process training's {b} (within {tol:.1e}): each "
                "micro-batch's loss is a mean over len(batch)/k samples — how often is it divided by k, and "
                "the sum by the ranks?")


def check_accumulate(fn: Callable) -> Verdict:
    if not callable(fn):
        return Verdict(False, "submit your function, e.g. ex.submit(accumulate_step)")
    cases = [on_ranks(f"{n} ranks, {k} micro-batches", n, accumulate_job, fn, k, TASK, timeout_s=TIMEOUT_S)
             for n, k in CASES]
    return judge(cases, [
        Property("one forward and backward per micro-batch", _k_backwards),
        Property("no communication before the last micro-batch", _none_before_last),
        Property("the micro-batches' gradients add up in p.grad", _adds_up),
        Property("each gradient all-reduced once per step, finished when accumulate_step returns", _once),
        Property("p.grad holds the whole global batch's gradient (its mean loss's)", _scaled),
        Property("training equals single-process training on the whole batch", _whole_batch)],
        done="The bytes per step are those of one all-reduce, whatever k.")


def accumulate_step(model, batches):
    k, world = len(batches), dist.get_world_size()
    for x, y in batches:  # k micro-batches: p.grad adds up their gradients
        (F.cross_entropy(model(x), y) / k).backward()
    for p in model.parameters():  # then one all-reduce per gradient, as chapter 0
        dist.all_reduce(p.grad)
        p.grad /= world


def exercise() -> Exercise:
    return Exercise(
        key="accumulate", title="write it: gradient accumulation, on real ranks",
        prompt="Write <code>accumulate_step(model, batches)</code>, run on every rank once per step: "
               "<code>batches</code> is this rank's share of the global batch as a list of k equal "
               "micro-batches <code>(x, y)</code>. Afterwards every <code>p.grad</code> must hold the "
               "whole global batch's gradient (the mean cross-entropy), so that the optimizer takes the "
               "large batch's step — with one backward per micro-batch and the gradients all-reduced "
               "once per step, not once per micro-batch. The check trains a few SGD steps on "
               f"{' and '.join(f'{n} ranks with k = {k}' for n, k in CASES)} and records your "
               f"communication ({TIMEOUT_S:.0f} s timeout).",
        check=check_accumulate,
        hint="<code>backward()</code> adds into <code>p.grad</code>; scale each micro-batch's loss by 1/k. "
             "After the last micro-batch: <code>dist.all_reduce(p.grad)</code> and divide by the ranks.",
        solution=solution_text(accumulate_step), reference=lambda: accumulate_step)
