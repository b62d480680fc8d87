"""Chapter 1's exercise on real ranks (notebooks/01_parameter_server.ipynb): a worker's push and pull
against sharded servers.

:func:`train_with` runs on every rank of a warm cluster: ranks 0..K-1 are synchronous server shards
(written here, as in the notebook's cell), ranks K.. are workers that call the learner's
``worker_step(grads, params, bounds)`` after each backward pass. The check compares the workers'
losses with single-process SGD on the combined batch (``parameter_server.reference``).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..comm import chunk_bounds
from ..data import batch_indices, shard, teacher_classification
from ..exercises import (
    Exercise,
    Property,
    Verdict,
    judge,
    locally,
    observe,
    on_ranks,
    pair,
    solution_text,
    summary,
)
from ..milestones import parameter_server as ps
from ..models import flat_views, mlp
from ..numerics import sum_order_tolerance

TASK = {"steps": 6, "global_batch": 48, "hidden": 32, "depth": 2, "lr": 0.1}
LAYOUTS = ((1, 3), (2, 2), (1, 1))  # (servers K, workers N): on 4 ranks twice, then on 2
TIMEOUT_S = 15.0  # a learner's deadlock ends here, with the runtime saying where each rank waits


def _serve(flat: torch.Tensor, k: int, servers: int, workers: int, cfg) -> None:
    """Server shard ``k``: each step, receive every worker's gradient slice, average, step, reply."""
    lo, hi = chunk_bounds(flat.numel(), servers)[k]
    weights = flat[lo:hi].clone()
    weights.grad = torch.zeros_like(weights)
    optimizer = torch.optim.SGD([weights], lr=cfg.lr, momentum=0.9)
    incoming = torch.empty_like(weights)
    for _ in range(cfg.steps):
        weights.grad.zero_()
        for w in range(servers, servers + workers):
            dist.recv(incoming, src=w)
            weights.grad += incoming
        weights.grad /= workers
        optimizer.step()
        for w in range(servers, servers + workers):
            dist.send(weights.detach(), dst=w)


def train_with(worker_step: Callable, task: dict, servers: int) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    workers = world - servers
    cfg = ps.Config(mode="sync", workers=workers, servers=servers, **task)
    model = mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed)
    flat, grads = flat_views(model)  # p.data and p.grad are views into these two flat tensors
    if rank < servers:
        _serve(flat, rank, servers, workers, cfg)
        return {"losses": [], "params": None}
    bounds = chunk_bounds(flat.numel(), servers)
    x_all, y_all = teacher_classification(cfg.samples, cfg.d_in, cfg.classes)
    losses, calls = [], []
    for step in range(cfg.steps):
        idx = shard(batch_indices(cfg.samples, cfg.global_batch, step, cfg.seed), rank - servers, workers)
        grads.zero_()
        loss = F.cross_entropy(model(x_all[idx]), y_all[idx])
        loss.backward()
        with observe() as log:
            worker_step(grads, flat, bounds)
        calls += log.as_data()["calls"]
        losses.append(loss.item())
    return {"losses": losses, "params": flat.clone(), "calls": calls,
            "slices": [4 * (hi - lo) for lo, hi in bounds]}


def _unmatched(e) -> str:
    """What a worker's learner most likely did when a rank crashed or the ranks waited for each other."""
    from ..runtime import WorkerMismatch, WorkerTimeout

    if isinstance(e, WorkerTimeout) or getattr(e, "waits", False):
        return ("Does every worker push to each server before it waits for that server's reply, and pull "
                "exactly what the server sends?")
    if isinstance(e, WorkerMismatch) or "SIGABRT" in str(e):  # a message that does not fit the receive
        return ("A receive buffer must have the size of the message that arrives (Gloo aborts a rank "
                "otherwise): does the slice you send server k, and the one you receive into, have the size "
                "of shard k (chunk_bounds(numel, servers)[k])?")
    return ""


def check_worker_step(fn: Callable) -> Verdict:
    if not callable(fn):
        return Verdict(False, "submit your function, e.g. ex.submit(worker_step)")

    def case(servers: int, workers: int):
        ref = ps.reference(ps.Config(mode="sync", workers=workers, servers=servers, **TASK))
        return on_ranks(f"{servers} server shard(s) and {workers} workers", servers + workers, train_with,
                        fn, TASK, servers, timeout_s=TIMEOUT_S, advice=_unmatched,
                        then=lambda outs: {"servers": servers, "workers": outs[servers:], "ref": ref})

    return judge([case(k, n) for k, n in LAYOUTS], [
        Property("each worker pushes shard k's slice of its gradient to server k and pulls the slice back, "
                 "once a step", _slices_to_their_shards),
        Property("the workers end with the same parameters", _workers_agree),
        Property("training equals single-process SGD on the combined batch", _as_sgd)])


def _slices_to_their_shards(o: dict) -> str | None:
    for w in o["workers"]:
        for k, size in enumerate(w["slices"]):
            for op, what in (("send", "pushed to"), ("recv", "pulled from")):
                got = [c["bytes"] for c in w["calls"] if c["op"] == op and c["peer"] == k]
                if got != [size] * TASK["steps"]:
                    return (f"over {TASK['steps']} steps a worker {what} server {k} {len(got)} message(s) of "
                            f"{sorted(set(got)) or 'no'} bytes ({summary(w['calls'])}); server {k} owns a "
                            f"slice of {size:,} bytes and expects one message each way per step")


def _workers_agree(o: dict) -> str | None:
    ws = o["workers"]
    if any(not torch.equal(w["params"], ws[0]["params"]) for w in ws[1:]):
        return "their parameters differ: every worker must pull every shard's new values after each step"


def _as_sgd(o: dict) -> str | None:
    ws, ref = o["workers"], o["ref"]
    tol = sum_order_tolerance(ref)
    losses = [sum(w["losses"][s] for w in ws) / len(ws) for s in range(TASK["steps"])]
    gaps = [abs(a - b) for a, b in zip(losses, ref)]
    if max(gaps) > tol:
        s = next(i for i, g in enumerate(gaps) if g > tol)
        a, b = pair(losses[s], ref[s])
        return (f"from step {s} the loss is {a}, single-process SGD's {b}: does server k get exactly its "
                "slice of the gradient, and do the new parameters land in the same slice?")


def _reference_worker_step():
    def worker_step(grads, params, bounds):
        for k, (lo, hi) in enumerate(bounds):
            dist.send(grads[lo:hi], dst=k)
        for k, (lo, hi) in enumerate(bounds):
            dist.recv(params[lo:hi], src=k)

    return worker_step


def worker_step_exercise() -> Exercise:
    return Exercise(
        key="worker_step", title="a worker's push and pull, with sharded servers",
        prompt="Complete <code>worker_step(grads, params, bounds)</code>, which a worker runs after each "
               "backward pass. <code>grads</code> and <code>params</code> are the worker's flat gradient "
               "and parameter vectors (the model's tensors are views into them). Server shard k is rank k "
               "and owns the slice <code>bounds[k] = (lo, hi)</code>: it waits for that slice of every "
               "worker's gradient, averages, steps, and sends the slice's new values back to each worker. "
               "Push, then pull, with <code>dist.send</code> and <code>dist.recv</code>. The check trains "
               "on real ranks with 1 shard + 3 workers and with 2 shards + 2 workers, against "
               "single-process SGD.",
        check=check_worker_step,
        hint="A slice of a flat tensor, <code>t[lo:hi]</code>, is a view: receiving into it writes into the "
             "tensor. Every server expects one message from each worker per step, in the order push, then "
             "pull.",
        solution=solution_text(_reference_worker_step()),
        reference=_reference_worker_step)


# --------------------------------------------------------------------------- the server's update


AVERAGE_CASES = ((10, 3, 0.1), (7, 1, 0.5), (6, 4, 0.05))  # values per shard, workers, learning rate


def _what(x) -> str:
    """What a learner's function returned, in words (never its values: they may be the answer)."""
    if isinstance(x, dict):
        return f"a dict with keys {', '.join(repr(k) for k in x)}" if x else "an empty dict"
    if isinstance(x, (tuple, list)):
        kinds = sorted({type(v).__name__ for v in x})
        return f"a {type(x).__name__} of {len(x)} item(s) ({', '.join(kinds) or 'none'})"
    if isinstance(x, str):
        return f"the text {x[:40]!r}"
    shape = getattr(x, "shape", None)
    return f"a {type(x).__name__}" + (f" of shape {tuple(shape)}" if shape is not None else "")


def _read_shard(got, shard: torch.Tensor) -> dict:
    """The learner's return value as a tensor (``new``), or ``problem`` saying what came back. A
    1-tuple or 1-list around the shard (``return new,``: a trailing comma) is read as the shard."""
    inner = got[0] if isinstance(got, (tuple, list)) and len(got) == 1 else None
    boxed = type(got).__name__ if inner is not None and (
        isinstance(inner, (tuple, list)) or getattr(inner, "ndim", 0) >= 1) else ""
    try:
        return {"new": torch.as_tensor(inner if boxed else got, dtype=shard.dtype), "boxed": boxed}
    except Exception:  # whatever it is, the verdict says what came back: never the checker's error
        return {"new": None, "boxed": boxed, "problem": (
            f"your function returned {_what(got)}; return the new shard itself: a tensor shaped like "
            f"the old one, {tuple(shard.shape)} (or a list of its {shard.numel()} numbers)")}


def _a_shard(o: dict) -> str | None:
    if o["got"] is None:
        return "your function returned None: write its body and return the new shard"
    if o["new"] is None:
        return o["problem"]
    got = o["new"]
    if got.shape != o["shard"].shape:
        inside = f" (the one item of {_what(o['got'])})" if o["boxed"] else ""
        return f"the new shard{inside} has shape {tuple(got.shape)}, the old one {tuple(o['shard'].shape)}"
    return None


def _one_sgd_step(o: dict) -> str | None:
    shard, grads, lr = o["shard"], o["grads"], o["lr"]
    want = -lr * torch.stack(grads).mean(0)
    step = o["new"] - shard
    # float32 rounding of a step of this scale, with room for any order of summation
    tol = 16 * torch.finfo(shard.dtype).eps * float(shard.abs().max() + lr * torch.stack(grads).abs().max())
    if torch.allclose(step, want, rtol=0, atol=tol):
        return None
    ratio = float(step @ want / (want @ want))
    if torch.allclose(step, ratio * want, rtol=0, atol=tol):
        if ratio < 0:
            return "your step goes uphill: SGD moves against the gradient"
        return (f"your step points the right way but is {ratio:.3g}× the expected length: one synchronous "
                "step uses the workers' gradients together — how?")
    if step.numel() > 1 and torch.allclose(step, step.mean().expand_as(step), rtol=0, atol=tol):
        return ("your step is one number for every value of the shard: that averages over the values "
                "(elements); average over the workers instead, value by value")
    return "it is not that step; did every worker's gradient count equally?"


def check_average(fn) -> Verdict:
    """The server's update on shards and worker counts of several sizes, one worker included."""
    if not callable(fn):
        return Verdict(False, "submit your function, e.g. ex.submit(server_update)")

    boxed = []

    def case(n: int, workers: int, lr: float):
        g = torch.Generator().manual_seed(7 + workers)
        shard = torch.randn(n, generator=g)
        grads = [torch.randn(n, generator=g) for _ in range(workers)]

        def seen(got):
            o = {"got": got, "shard": shard, "grads": grads, "lr": lr, **_read_shard(got, shard)}
            boxed.append(o["boxed"])
            return o

        return locally(f"a shard of {n} values, {workers} worker(s), lr = {lr}", fn, shard.clone(),
                       [x.clone() for x in grads], lr, then=seen)

    verdict = judge([case(*c) for c in AVERAGE_CASES], [
        Property("the server returns its new shard, shaped like the old one", _a_shard),
        Property("the shard takes one SGD step against the workers' gradients, each counting equally "
                 "(shard − lr · their mean)", _one_sgd_step)])
    if verdict.ok and any(boxed):
        comma = " (a trailing comma after return makes one)" if "tuple" in boxed else ""
        verdict.message += (f". Your function returned the shard inside a one-item {max(boxed)}{comma}; "
                            "it was read as the shard, but return the tensor itself")
    return verdict


def reference_average():
    def server_update(shard, grads, lr):
        return shard - lr * sum(grads) / len(grads)

    return server_update
