"""DiLoCo that survives a replica's death (chapter 10 §3): §2's quorum, exchange and heal, once per
outer step instead of once per step.

Each replica takes H inner steps alone, then joins the round of its outer step (:func:`.ft_step.lighthouse`
forms the quorum, as for per-step fault tolerance), exchanges its pseudo-gradient (start − local) with
:func:`.ft_step.exchange`, and applies the outer Nesterov step. When a member dies mid-exchange the
survivors discard the round: they return to the round's start and lose their H inner steps, nothing
more. A returning replica heals from a live one: the global weights, the outer momentum, its inner
optimizer state and the outer step. Every replica ends with the same global weights.
"""

from __future__ import annotations

import json
from datetime import timedelta

import torch
import torch.distributed as dist

from . import task as T
from .ft_step import die_mid_exchange, exchange


def replica(me: int, n: int, store_path: str, task: T.Task, h: int, outer_lr: float, outer_momentum: float,
            kill: tuple[int, int] | None = None) -> dict:
    """One DiLoCo replica group: ``task.steps // h`` outer steps of ``h`` inner steps each. ``kill =
    (replica, outer step)``: that replica SIGKILLs itself in that round, after the others sent their
    pseudo-gradients and before its own (its first life only)."""
    store = dist.FileStore(store_path, -1)
    store.set_timeout(timedelta(seconds=30))
    fresh = store.add(f"hello/{me}", 1) > 1
    train, held = T.data(task)
    model, inner = T.build(task)
    outer = torch.optim.SGD(model.parameters(), lr=outer_lr, momentum=outer_momentum, nesterov=True)
    rounds, k = task.steps // h, 0
    rnd = int(store.get("latest")) + 1 if fresh and store.check(["latest"]) else 0
    log, sent = [], 0
    while k < rounds:
        start = [p.detach().clone() for p in model.parameters()]
        if not fresh:
            inner_steps(task, train, model, inner, k, h, me)
        store.set(f"join/{rnd}/{me}", json.dumps({"heal": fresh, "step": k}))
        q = json.loads(store.get(f"quorum/{rnd}"))
        if me not in q["members"]:
            rnd += 1
            continue
        if fresh:  # the global weights, both optimizers' state and the outer step, from a live peer
            state = T.from_bytes(store.get(f"state/{rnd}"))
            model.load_state_dict(state["model"])
            inner.load_state_dict(state["inner"])
            outer.load_state_dict(state["outer"])
            k, fresh = state["k"], False
            log.append({"healed_at": k, "from": q["source"]})
            start = [p.detach().clone() for p in model.parameters()]
            inner_steps(task, train, model, inner, k, h, me)  # then this round's H steps; the others wait
        elif q["heal"] and me == q["source"]:  # the round's start is the global state a returner needs
            weights = {name: p0 for (name, _), p0 in zip(model.named_parameters(), start)}
            store.set(f"state/{rnd}", T.to_bytes({"model": weights, "inner": inner.state_dict(),
                                                  "outer": outer.state_dict(), "k": k}))
        delta = torch.cat([(p0 - p.detach()).reshape(-1) for p, p0 in zip(model.parameters(), start)])
        if kill == (me, k):
            die_mid_exchange(store, rnd, me, q["members"])
        avg = exchange(store, rnd, me, delta, q["members"])
        sent += delta.numel()
        for p, p0 in zip(model.parameters(), start):
            p.data.copy_(p0)  # back to the round's start, whether the round commits or not
        if avg is not None:  # the outer Nesterov step on the averaged pseudo-gradient
            T.set_gradient(model, avg)
            outer.step()
            log.append({"outer_step": k, "members": q["members"]})
            k += 1
        else:  # a member vanished: every survivor drops the round and its H inner steps
            log.append({"discarded": k, "members": q["members"]})
        rnd += 1
    return {"params": T.flat_params(model), "log": log, "floats_sent": sent, "replica": me,
            "held_out": T.held_out_loss(model, held)}


def inner_steps(task: T.Task, train, model, inner, k: int, h: int, me: int) -> None:
    """Round ``k``'s H inner steps on replica ``me``'s batches (the same ones if the round is redone)."""
    for i in range(h):
        T.gradient(model, T.batch(task, train, k * h + i, me))
        inner.step()
