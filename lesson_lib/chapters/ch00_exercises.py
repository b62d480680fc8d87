"""Chapter 0's exercises, checked on real ranks (notebooks/00_why_distributed.ipynb). The learner's
``average_gradients(model)`` runs on every rank of a warm cluster between ``backward()`` and ``step()``
(:func:`train_with`), judged against single-process training on the whole batch (``data_parallel.reference``);
``start_overlap(model)`` starts each all-reduce from a hook during the backward, and
:func:`train_overlapped_with` records whether each ``all_reduce`` came during the backward, unblocking."""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..data import batch_indices, shard, teacher_classification
from ..exercises import (
    Exercise,
    Log,
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
from ..milestones import data_parallel as dp
from ..models import mlp
from ..numerics import sum_order_tolerance

# Small and short, so a check takes well under a second per world size once the workers are warm.
# SGD, not Adam: Adam divides by the gradient's own scale, so a gradient N times too large (the
# sum instead of the mean) would train almost the same and pass unnoticed.
TASK = {"steps": 6, "global_batch": 48, "hidden": 32, "depth": 2, "lr": 0.05}
WORLD_SIZES = (2, 4)
TIMEOUT_S = 15.0  # a learner's deadlock ends here, with the runtime saying where each rank waits


def _train(setup: Callable, task: dict, all_reduce: Callable | None = None) -> dict:
    """On every rank: SGD on this rank's shard of each global batch. ``after = setup(model)`` is
    called once, and ``after()`` between every backward and optimizer step. The loss is summed
    over the ranks with ``all_reduce`` (``dist.all_reduce`` unless given).

    The model is a plain ``nn.Sequential`` (no flat bucket), so ``p.grad`` are ordinary tensors.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = dp.Config(world_size=world, optimizer="sgd", **task)
    model = mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    x_all, y_all = teacher_classification(cfg.samples, cfg.d_in, cfg.classes)
    after = setup(model)
    losses = []
    for step in range(cfg.steps):
        idx = shard(batch_indices(cfg.samples, cfg.global_batch, step, cfg.seed), rank, world)
        optimizer.zero_grad(set_to_none=False)
        loss = F.cross_entropy(model(x_all[idx]), y_all[idx])
        loss.backward()
        after()
        optimizer.step()
        total = loss.detach().reshape(1)
        (all_reduce or dist.all_reduce)(total)
        losses.append(float(total) / world)
    return {"losses": losses, "params": [p.detach().clone() for p in model.parameters()]}


def train_with(average_gradients: Callable, task: dict) -> dict:
    """:func:`_train` calling the learner's ``average_gradients(model)`` after each backward, the
    communication it makes observed."""
    loss_sum = unobserved(dist.all_reduce)  # the loop's own sum of the losses, left out of the log
    with observe() as log:
        out = _train(lambda model: lambda: average_gradients(model), task, all_reduce=loss_sum)
    return {**out, **log.as_data()}


def reference_losses() -> list[float]:
    return dp.reference(dp.Config(world_size=1, optimizer="sgd", **TASK))


def _advice(e) -> str:
    """What the learner most likely did when a rank failed."""
    if "hook returned" in str(e):  # autograd refuses a gradient hook's return value
        return ("A gradient hook must return None (or a new gradient): keep the all-reduce's handle in a "
                "list instead of returning it, and wait for the handles in finish().")
    return ""


def _cases(fn: Callable, worker: Callable):
    """One case per world size: ``worker(fn, TASK)`` on every rank of a warm cluster."""
    return [on_ranks(f"{n} ranks", n, worker, fn, TASK, timeout_s=TIMEOUT_S, advice=_advice)
            for n in WORLD_SIZES]


def _same_model(outs: list[dict]) -> str | None:
    names = [f"layer {i // 2} {'weight' if i % 2 == 0 else 'bias'}" for i in range(2 * (TASK["depth"] + 1))]
    for r, out in enumerate(outs[1:], start=1):
        for i, (a, b) in enumerate(zip(outs[0]["params"], out["params"])):
            if not torch.equal(a, b):
                return (f"after {TASK['steps']} steps rank {r}'s {names[i]} differs from rank 0's: the "
                        "copies drifted apart")


def _whole_batch(outs: list[dict]) -> str | None:
    ref = reference_losses()
    tol = sum_order_tolerance(ref)
    gaps = [abs(a - b) for a, b in zip(outs[0]["losses"], ref)]
    if max(gaps) > tol:
        s = next(i for i, g in enumerate(gaps) if g > tol)
        a, b = pair(outs[0]["losses"][s], ref[s])
        ops = {c["op"] for c in outs[0].get("calls", [])}
        if ops and not ops & {"all_reduce", "reduce_scatter", "reduce"}:
            return (f"at step {s} the loss is {a}, single-process training's {b}: your code ran "
                    f"{summary(outs[0]['calls'])}, which copies or moves gradients but never adds the ranks' "
                    "gradients together. The whole batch's gradient is their mean: all-reduce them, then "
                    "divide by the number of ranks")
        return (f"at step {s} the loss is {a}, single-process training's {b} (within {tol:.1e}): is each "
                "gradient that of the whole batch — its size included?")


SAME_MODEL = Property("every rank holds the same model, step after step", _same_model)
WHOLE_BATCH = Property("training equals single-process training on the whole batch", _whole_batch)


def check_average_gradients(fn: Callable) -> Verdict:
    if not callable(fn):
        return Verdict(False, "submit your function, e.g. ex.submit(average_gradients)")
    return judge(_cases(fn, train_with), [SAME_MODEL, WHOLE_BATCH])


def _reference_average_gradients():
    def average_gradients(model):
        world = dist.get_world_size()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world

    return average_gradients


def train_overlapped_with(start_overlap: Callable, task: dict) -> dict:
    """:func:`_train` with ``finish = start_overlap(model)`` called after each backward, every
    communication call the learner makes observed (:func:`~lesson_lib.exercises.observe`), and two
    kinds of moments marked: each gradient becoming ready (a hook registered after the learner's)
    and each return from ``finish()``."""
    reduce = unobserved(dist.all_reduce)  # the loop's own sum of the losses, left out of the log

    with observe() as log:
        def setup(model):
            finish = start_overlap(model)
            for p in model.parameters():
                p.register_post_accumulate_grad_hook(lambda p: log.mark("gradient ready"))

            def after():
                finish()
                log.mark("finish returned", settle=True)
            return after

        out = _train(setup, task, all_reduce=reduce)
    return {**out, **log.as_data()}


def _later_gradients(marks: list[dict], last: bool = False) -> list[float]:
    """When each gradient but its step's last became ready (``last``: the last's, which nothing overlaps)."""
    times, step = [], []
    for m in marks + [{"label": "finish returned"}]:
        if m["label"] == "gradient ready":
            step.append(m["at"])
        elif step:  # "finish returned": the step ended
            times, step = times + (step[-1:] if last else step[:-1]), []
    return times


def _overlapped(outs: list[dict]) -> str | None:
    """Some all-reduce was still running (started, not yet finished for the code) when autograd
    produced a later gradient: the communication overlapped the backward."""
    for o in outs:
        log = Log()
        log.extend(o["calls"])
        if any(log.in_flight(at, "all_reduce") for at in _later_gradients(o["marks"])):
            continue
        reduces = [c for c in o["calls"] if c["op"] == "all_reduce"]
        if not reduces:
            return f"your code ran {summary(o['calls'])}, no all-reduce"
        if not any(c["in_backward"] for c in reduces):
            return ("your all-reduces all started after the backward had finished (in finish()), so they "
                    "overlapped nothing: start each one from a hook that autograd calls as soon as that "
                    "gradient is complete")
        if any(log.in_flight(at, "all_reduce") for at in _later_gradients(o["marks"], last=True)):
            return ("your all-reduces started only once the backward's last gradient was ready, so none ran "
                    "while autograd produced another: start each gradient's all-reduce from its own hook")
        if not any(c["async"] for c in reduces):
            return ("each all-reduce blocked inside its hook: the backward stopped until its bytes had "
                    "arrived. Start it with async_op=True, keep the handle, and wait in finish()")
        return ("you waited for each all-reduce inside its hook, so none was still running when autograd "
                "produced the next gradient: keep the handles and wait for them in finish()")


def _every_gradient_in_backward(outs: list[dict]) -> str | None:
    """Every gradient's bytes were all-reduced by a call started during the backward, each step."""
    for r, o in enumerate(outs):
        need = TASK["steps"] * sum(4 * p.numel() for p in o["params"])
        reduces = [c for c in o["calls"] if c["op"] == "all_reduce"]
        total = sum(c["bytes"] for c in reduces)
        early = sum(c["bytes"] for c in reduces if c["in_backward"])
        if total < need:
            return (f"on rank {r} all-reduces carried {total:,} of the {need:,} gradient bytes of "
                    f"{TASK['steps']} steps: some gradients were never summed across the ranks. Every "
                    "parameter's gradient needs its all-reduce")
        if early < need:
            return (f"on rank {r} all-reduces started during the backward carried {early:,} of the "
                    f"{need:,} gradient bytes of {TASK['steps']} steps: the rest waited for the backward to "
                    "finish. Start every gradient's all-reduce from its own hook")


def _finished(outs: list[dict]) -> str | None:
    """Every all-reduce started before finish() returned had been waited for by then."""
    for r, o in enumerate(outs):
        ends = [m["at"] for m in o["marks"] if m["label"] == "finish returned"]
        for c in o["calls"]:
            end = next((t for t in ends if t > c["start"]), None)
            if end is not None and c["done"] is None:
                return (f"on rank {r} finish() returned without waiting for an all-reduce ({c['api']}, "
                        f"{c['bytes']:,} bytes): its sum may not have arrived yet (here it may have by luck; "
                        "on a GPU it would not). Wait for every handle before the step uses the gradients")
            if end is not None and c["done"] > end:
                return (f"on rank {r} finish() returned while an all-reduce ({c['api']}, "
                        f"{c['bytes']:,} bytes) was still running: wait for every handle before the step "
                        "uses the gradients")


def check_start_overlap(fn: Callable) -> Verdict:
    if not callable(fn):
        return Verdict(False, "submit your function, e.g. ex.submit(start_overlap)")
    return judge(_cases(fn, train_overlapped_with), [
        Property("an all-reduce is still running while autograd produces later gradients", _overlapped),
        Property("every gradient's all-reduce starts during the backward", _every_gradient_in_backward),
        Property("finish() waits for every all-reduce", _finished),
        SAME_MODEL, WHOLE_BATCH])


def _reference_start_overlap():
    def start_overlap(model):
        world, in_flight = dist.get_world_size(), []

        def all_reduce_now(p):
            in_flight.append(dist.all_reduce(p.grad, async_op=True))

        for p in model.parameters():
            p.register_post_accumulate_grad_hook(all_reduce_now)

        def finish():
            for work in in_flight:
                work.wait()
            in_flight.clear()
            for p in model.parameters():
                p.grad /= world

        return finish

    return start_overlap


def exercises() -> dict[str, Exercise]:
    return {
        "average_gradients": Exercise(
            key="average_gradients", title="write the data-parallel gradient step",
            prompt="Complete <code>average_gradients(model)</code>. It runs on every rank after "
                   "<code>loss.backward()</code>, when each parameter's <code>p.grad</code> holds the "
                   "gradient of this rank's slice of the batch only. Afterwards every rank must hold the "
                   "gradient of the <i>whole</i> batch, so that all copies take the same step. Use "
                   "<code>torch.distributed</code> (<code>dist.all_reduce</code>, "
                   "<code>dist.get_world_size()</code>). The check trains a few SGD steps on "
                   f"{' and '.join(map(str, WORLD_SIZES))} real ranks and compares the losses with "
                   "single-process training on the whole batch.",
            check=check_average_gradients,
            hint="Each rank's loss is the mean over its slice; the whole batch's loss is the mean of those "
                 "N means. <code>dist.all_reduce(t)</code> sums <code>t</code> over the ranks, in place.",
            solution=solution_text(_reference_average_gradients()),
            reference=_reference_average_gradients),
        "start_overlap": Exercise(
            key="start_overlap", title="overlap the all-reduce with the backward",
            prompt="Complete <code>start_overlap(model)</code>. It is called once on every rank, before "
                   "training. Make each gradient's all-reduce <i>start</i> as soon as autograd has written "
                   "that gradient, while the backward goes on with earlier layers, and return a function "
                   "<code>finish()</code> that the training loop calls after each "
                   "<code>loss.backward()</code>: when it returns, every <code>p.grad</code> must hold the "
                   "whole batch's gradient. The check trains a few SGD steps on "
                   f"{' and '.join(map(str, WORLD_SIZES))} real ranks, compares the losses with "
                   "single-process training, and records whether your all-reduces ran during the backward "
                   "without blocking it.",
            check=check_start_overlap,
            hint="<code>p.register_post_accumulate_grad_hook(hook)</code> calls <code>hook(p)</code> right "
                 "after <code>p.grad</code> is complete (the hook must return nothing). "
                 "<code>dist.all_reduce(t, async_op=True)</code> returns at once with a handle; "
                 "<code>handle.wait()</code> blocks until the sum is in <code>t</code>.",
            solution=solution_text(_reference_start_overlap()),
            reference=_reference_start_overlap),
    }
