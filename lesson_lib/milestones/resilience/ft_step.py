"""Per-step fault tolerance written out (chapter 10 §2): replica groups, a quorum every step, a step
discarded when a peer vanishes mid-exchange, a returning replica healed from a live peer.

Two sides share one ``FileStore`` (a folder: nothing listens on any port):

* :func:`lighthouse` (one thread beside the replicas, as torchft's Lighthouse is one server): for each
  round, waits until every live member of the last quorum has joined, publishes the quorum and who
  heals from whom, then flags the round ``dead`` if a member dies before its gradient arrives.
* :func:`replica` (each replica group): join, heal if fresh, compute, exchange, commit or discard.

A round commits only if every member's gradient arrived; a gradient is never withdrawn, and the
lighthouse flags a round only after the process is gone, so every survivor decides alike.
"""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from . import task as T


def lighthouse(store, alive, stop, n: int, last_step: int | None = None) -> None:
    """The quorum of each round, from who joined; ``alive(r)``: is replica r's process running.
    ``last_step``: that step waits for all ``n`` replicas, so that a run ends with every one."""
    last, rnd = list(range(n)), 0
    while not stop.is_set():
        joined = {}
        while not stop.is_set():  # every live member of the last quorum must join; newcomers may
            joined = {r: json.loads(store.get(f"join/{rnd}/{r}")) for r in range(n)
                      if store.check([f"join/{rnd}/{r}"])}
            steps = [j["step"] for j in joined.values() if not j["heal"]]
            if steps and all(r in joined or not alive(r) for r in last) \
                    and (last_step is None or max(steps) < last_step or len(joined) == n):
                break  # (a fresh replica alone could heal from nobody: it waits)
            time.sleep(0.005)
        members = sorted(joined)
        healthy = [r for r in members if not joined[r]["heal"]]
        quorum = {"members": members, "heal": [r for r in members if joined[r]["heal"]],
                  "source": healthy[0] if healthy else None}
        store.set(f"quorum/{rnd}", json.dumps(quorum))
        store.set("latest", str(rnd))
        keys = [f"grad/{rnd}/{m}" for m in members]
        while not stop.is_set() and not store.check(keys):
            if any(not alive(m) for m in members):
                store.set(f"dead/{rnd}", "1")
                break
            time.sleep(0.005)
        last, rnd = [m for m in members if alive(m)], rnd + 1


def exchange(store, rnd: int, me: int, grad: torch.Tensor, members: list[int]):
    """My gradient out, every member's in, averaged in member order; ``None`` if one vanished."""
    store.set(f"grad/{rnd}/{me}", T.to_bytes(grad))
    keys = [f"grad/{rnd}/{m}" for m in members]
    while not store.check(keys):
        if store.check([f"dead/{rnd}"]) and not store.check(keys):
            return None  # a member died before sending: nobody can have all of them
        time.sleep(0.002)
    return sum(T.from_bytes(store.get(k)) for k in keys) / len(members)


def die_mid_exchange(store, rnd: int, me: int, members: list[int]) -> None:
    """SIGKILL this process once the other members of round ``rnd`` have sent, before it sends its own:
    a death mid-exchange (first life only: a restarted replica finds the mark and carries on)."""
    if store.add(f"killed/{me}", 1) != 1:
        return
    others = [f"grad/{rnd}/{m}" for m in members if m != me]
    while not store.check(others):
        time.sleep(0.001)
    os.kill(os.getpid(), signal.SIGKILL)


def replica(me: int, n: int, store_path: str, task: T.Task, kill: tuple[int, int] | None = None,
            step_fn=None) -> dict:
    """One replica group. ``kill = (replica, step)``: that replica SIGKILLs itself mid-exchange,
    after the others sent their gradients, before its own (its first life only)."""
    store = dist.FileStore(store_path, -1)
    store.set_timeout(timedelta(seconds=30))
    step_fn = step_fn or exchange
    fresh = store.add(f"hello/{me}", 1) > 1  # a second life: my state is stale, heal it
    train, _ = T.data(task)
    model, opt = T.build(task)
    step, rnd = 0, int(store.get("latest")) + 1 if fresh and store.check(["latest"]) else 0
    log, times = [], []
    while step < task.steps:
        t0 = time.monotonic()
        store.set(f"join/{rnd}/{me}", json.dumps({"heal": fresh, "step": step}))
        q = json.loads(store.get(f"quorum/{rnd}"))
        if me not in q["members"]:
            rnd += 1
            continue
        if fresh:  # copy a live peer's weights, momentum and step
            state = T.from_bytes(store.get(f"state/{rnd}"))
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            step, fresh = state["step"], False
            log.append({"healed_at": step, "from": q["source"]})
        elif q["heal"] and me == q["source"]:
            store.set(f"state/{rnd}", T.to_bytes({"model": model.state_dict(), "opt": opt.state_dict(),
                                                  "step": step}))
        grad = T.gradient(model, T.batch(task, train, step, me))
        if kill == (me, step):
            die_mid_exchange(store, rnd, me, q["members"])
        avg = step_fn(store, rnd, me, grad, q["members"])
        if avg is not None:  # commit: every member applies the same average
            T.set_gradient(model, avg)
            opt.step()
            log.append({"step": step, "members": q["members"]})
            step += 1
        else:
            log.append({"discarded": step, "members": q["members"]})
        rnd += 1
        times.append({"step": step, "t": time.monotonic(), "s": time.monotonic() - t0,
                      "discarded": avg is None})
    return {"params": T.flat_params(model), "log": log, "times": times, "replica": me}


def replay(task: T.Task, log: list[dict]) -> torch.Tensor:
    """One process: every committed step of ``log``, the average of its members' gradients in member
    order (on one thread, as each replica runs: another thread count sums a matmul in another order)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train, _ = T.data(task)
        model, opt = T.build(task)
        for entry in log:
            if "step" in entry:
                grads = [T.gradient(model, T.batch(task, train, entry["step"], m)) for m in entry["members"]]
                T.set_gradient(model, sum(grads) / len(grads))
                opt.step()
        return T.flat_params(model)
    finally:
        torch.set_num_threads(threads)
