"""Chapter 10's exercises (notebooks/10_resilience.ipynb): the checkpoint interval that wastes least,
DiLoCo's outer step on real ranks, judged on what every rank returned against the formula, and an
exchange that survives a vanished peer, judged on replicas one of which the checker SIGKILLs.

Nothing here imports IPython: :func:`outer_job` runs inside the workers.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ..exercises import (
    AnswerError,
    Exercise,
    Property,
    Verdict,
    duration,
    duration_slip,
    judge,
    observe,
    on_ranks,
    solution_text,
)
from ..milestones.resilience import ft_step
from ..milestones.resilience import task as T
from ..numerics import within_roundings
from ..runtime import replicas

DELTA_S, DEVICES, DEVICE_MTBF_H = 300.0, 4096, 50_000.0  # the interval exercise's question
# small integers and powers of two: every value below is exact in float32; lr ≠ μ, so that an answer
# that swaps them (or squares the wrong one) is told apart
NUMEL, LR, MU = 12, 0.5, 0.25


def _young() -> float:
    return math.sqrt(2 * DELTA_S * DEVICE_MTBF_H * 3600 / DEVICES)


def check_interval(answer) -> Verdict:
    try:
        tau = duration(answer, "s", "a number of seconds")
    except AnswerError as e:
        return Verdict(False, str(e))
    m = DEVICE_MTBF_H * 3600 / DEVICES
    young, daly = _young(), math.sqrt(2 * DELTA_S * m) * (1 + math.sqrt(DELTA_S / (2 * m)) / 3
                                                       + DELTA_S / (2 * m) / 9) - DELTA_S
    if any(abs(tau - want) <= 0.02 * want for want in (young, daly)):
        return Verdict(True, f"you said {tau:,.0f} s: checkpoint about every {tau / 60:.0f} minutes")
    # √(2·δ·M) with M left in hours is the answer in minutes: the same number, two mistakes
    for wrong, why in ((young / 60, "that is 60 times too small: either M was left in hours (δ is in "
                        "seconds) or the answer is in minutes; work in seconds throughout"),
                       (math.sqrt(2 * DELTA_S * m) - DELTA_S, "that is Daly's first-order interval "
                        "√(2·δ·M) − δ; the question asks for Young's, √(2·δ·M)"),
                       (math.sqrt(DELTA_S * m), "Young's interval is √(2·δ·M): the 2 is missing"),
                       (math.sqrt(2 * DELTA_S * DEVICE_MTBF_H * 3600), "M is the job's MTBF: one GPU's "
                        "MTBF divided by the number of GPUs"),
                       (math.sqrt(2 * DELTA_S / 60 * m), "δ and M must be in the same unit (seconds)")):
        if abs(tau - wrong) <= 0.02 * wrong:
            return Verdict(False, f"you said {tau:,.0f} s: {why}")
    slip = duration_slip(tau, young, "s")
    if slip:  # a bare number in hours or minutes: "1.43"
        return Verdict(False, slip)
    return Verdict(False, f"you said {tau:,.0f} s: work out the job's MTBF M first, then √(2·δ·M)")


# --------------------------------------------------------------------------- the outer step


def _case(seed: int, n: int):
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(-4, 5, (NUMEL,), generator=g).float()
    params = torch.randint(-4, 5, (n, NUMEL), generator=g).float()
    buf = torch.randint(-2, 3, (NUMEL,), generator=g).float()
    return start, params, buf


def outer_job(fn, seed: int) -> dict:
    """On every rank: the learner's outer step from this rank's parameters after H inner steps."""
    r, n = dist.get_rank(), dist.get_world_size()
    start, params, buf = _case(seed, n)
    with observe() as log:
        out = fn(params[r].clone(), start.clone(), buf.clone(), LR, MU)
    if not (isinstance(out, (tuple, list)) and len(out) == 2
            and all(isinstance(t, torch.Tensor) for t in out)):
        return {"error": f"returned {type(out).__name__}, not (new parameters, new momentum)"}
    return {"params": out[0].detach().clone(), "buf": out[1].detach().clone(), "seed": seed,
            "calls": log.as_data()["calls"]}


def _from_local(outs: list[dict]) -> bool:
    """Each rank stepped from its own ``local`` instead of the common ``start``."""
    n = len(outs)
    start, params, buf = _case(outs[0]["seed"], n)
    delta = start - params.sum(0) / n
    step = LR * (delta + MU * (MU * buf + delta))
    return all(torch.equal(o["params"], params[r] - step) for r, o in enumerate(outs))


def _same(outs: list[dict]) -> str | None:
    for r, o in enumerate(outs):
        if "error" in o:
            return f"rank {r} {o['error']}"
    for r, o in enumerate(outs):
        if not torch.equal(o["params"], outs[0]["params"]):
            if _from_local(outs):
                return ("each rank stepped from its own local parameters: the outer step starts from "
                        "start, the point every replica shared at the last outer step")
            return (f"rank {r}'s new parameters differ from rank 0's: the pseudo-gradient must be averaged "
                    "over the replicas (an all-reduce) before the outer step")


def _formula(outs: list[dict]) -> str | None:
    n = len(outs)
    start, params, buf = _case(outs[0]["seed"], n)
    delta = start - params.sum(0) / n  # written out: Nesterov momentum on the averaged pseudo-gradient
    new_buf = MU * buf + delta
    want = start - LR * (delta + MU * new_buf)
    got = outs[0]["params"]
    if torch.equal(got, want) and all(torch.equal(o["buf"], new_buf) for o in outs):
        return None
    if torch.equal(got, want):  # the parameters right, a rank's momentum not: it is the next step's
        r = next(r for r, o in enumerate(outs) if not torch.equal(o["buf"], new_buf))
        return (f"rank {r}'s returned momentum is not μ·buffer + Δ (Δ averaged over the replicas): every "
                "replica carries the same buffer into the next outer step")
    if torch.equal(got, start - LR * new_buf):
        return "that is plain (heavy-ball) momentum; Nesterov steps by Δ + μ·buffer"
    flipped = -delta  # local − start: the momentum then runs the wrong way too
    if torch.equal(got, start + LR * (delta + MU * new_buf)) or \
            torch.equal(got, start - LR * (flipped + MU * (MU * buf + flipped))):
        return "the step goes the wrong way: the pseudo-gradient is start − local, and the step subtracts it"
    d_sum = start - params.sum(0)
    if torch.equal(got, start - LR * (d_sum + MU * (MU * buf + d_sum))) or \
            torch.equal(got, start - LR * (n * delta + MU * (MU * buf + n * delta))):
        return f"the pseudo-gradients were summed, not averaged over the {n} replicas"
    if not torch.equal(outs[0]["buf"], new_buf):
        return "the returned momentum is not μ·buffer + Δ"
    return "the new parameters differ from start − lr·(Δ + μ·(μ·buffer + Δ)), Δ the averaged start − local"


def check_outer_step(fn) -> Verdict:
    if not callable(fn):
        return Verdict(False, "submit your function outer_step(local, start, buf, lr, mu)")
    cases = [on_ranks(f"{n} ranks", n, outer_job, fn, seed, timeout_s=15) for n, seed in ((2, 3), (4, 5))]
    return judge(cases, [Property("every replica ends with the same parameters", _same),
                         Property("the outer step is Nesterov's on the averaged pseudo-gradient", _formula)],
                 done="One all-reduce every H steps: H times fewer bytes than data parallelism.")


def outer_step(local, start, buf, lr, mu):
    """The answer: average the pseudo-gradient, then one Nesterov step from ``start``."""
    delta = start - local
    dist.all_reduce(delta)
    delta /= dist.get_world_size()
    buf = mu * buf + delta
    return start - lr * (delta + mu * buf), buf


# --------------------------------------------------------------------------- the vanished peer

# a small task: the checker needs a killed peer and a returner, not a long run (the last step waits
# for every replica, so the returner always takes part)
SURVIVE_TASK, KILL = T.Task(steps=10), (1, 3)


def _survive_case(fn, n: int):
    def run():
        try:
            return replicas.run(ft_step.replica, n, SURVIVE_TASK, KILL, fn, restart=(KILL[0],),
                                restart_after_s=0.2, timeout_s=45,
                                watch=lambda s, a, st: ft_step.lighthouse(s, a, st, n,
                                                                          SURVIVE_TASK.steps - 1))
        except (TimeoutError, RuntimeError) as e:
            # the returner gives up on a quorum the stuck survivors never form (the store's 30 s)
            said = str(e)
            gave_up = said.startswith(f"replica {KILL[0]}: ") and "Timeout waiting for key: quorum/" in said
            if not isinstance(e, TimeoutError) and not gave_up:
                return Verdict(False, f"{n} replicas: a replica failed: {e}")
            return Verdict(False, f"{n} replicas: the run never finished — after replica {KILL[0]} was "
                                  "killed, your exchange kept waiting for its gradient: look for dead/{rnd}")
    return f"{n} replicas, replica {KILL[0]} SIGKILLed in step {KILL[1]}", run


def _discarded(out: dict) -> str | None:
    survivor = out["results"][0]
    if not any(e.get("discarded") == KILL[1] for e in survivor["log"]):
        return (f"step {KILL[1]} was committed although replica {KILL[0]}'s gradient never came: return None "
                "when a member vanished before sending")


def _averaged(out: dict) -> str | None:
    survivor = out["results"][0]
    if not torch.equal(ft_step.replay(SURVIVE_TASK, survivor["log"]), survivor["params"]):
        backwards = [dict(e, members=e["members"][::-1]) if "step" in e else e for e in survivor["log"]]
        if torch.equal(ft_step.replay(SURVIVE_TASK, backwards), survivor["params"]):
            return ("the gradients were added in reverse member order: floats round differently in another "
                    "order, so add them in the order of members, as every replica must")
        if within_roundings(survivor["params"], ft_step.replay(SURVIVE_TASK, survivor["log"]), 16):
            return None  # the same sum, scaled another way (a reviewer's sum · (1/n)): a rounding apart
        return ("the weights differ from one process averaging every member's gradient of each committed "
                "step (divide the sum of all the members' gradients by their number)")


def _same_weights(out: dict) -> str | None:
    res = out["results"]
    if not all(torch.equal(r["params"], res[0]["params"]) for r in res):
        return "the replicas ended with different weights"


def check_exchange(fn) -> Verdict:
    if not callable(fn):
        return Verdict(False, "submit your function exchange(store, rnd, me, grad, members)")
    return judge([_survive_case(fn, n) for n in (2, 3)], [
        Property("the step that lost its peer is discarded", _discarded),
        Property("every committed step is the average of its members' gradients", _averaged),
        Property("every replica, the returned one included, ends with the same weights", _same_weights)],
        done="torchft decides the same way: a failed all-reduce makes should_commit() False everywhere.")


def exercises() -> dict[str, Exercise]:
    return {
        "interval": Exercise(
            key="interval", title="the checkpoint interval that wastes least",
            prompt=f"A job runs on {DEVICES:,} GPUs; one GPU fails on average every "
                   f"{DEVICE_MTBF_H:,.0f} hours, independently of the others. A checkpoint takes "
                   f"δ = {DELTA_S:.0f} s. Every how many "
                   "<b>seconds</b> should it checkpoint (Young's interval)? A number of seconds, a "
                   "text with its units (<code>\"5000 s\"</code>, <code>\"1.4 h\"</code>, <code>\"1h 23m"
                   "\"</code>, <code>\"1:23:20\"</code>) or a <code>datetime.timedelta</code>.",
            check=check_interval,
            hint="The job fails when any GPU fails: its MTBF M is one GPU's divided by the number of GPUs. "
                 "Then τ = √(2·δ·M), both in seconds.",
            solution=f"M = {DEVICE_MTBF_H:,.0f} h × 3600 / {DEVICES:,} = "
                     f"{DEVICE_MTBF_H * 3600 / DEVICES:,.0f} s; "
                     f"τ = √(2 × {DELTA_S:.0f} × {DEVICE_MTBF_H * 3600 / DEVICES:,.0f}) = {_young():,.0f} s "
                     f"(about {_young() / 60:.0f} minutes)",
            reference=_young),
        "outer": Exercise(
            key="outer", title="DiLoCo's outer step, on real ranks",
            prompt="Write <code>outer_step(local, start, buf, lr, mu)</code>, run on every replica "
                   "after H inner steps: <code>local</code> its parameters now, <code>start</code> "
                   "everyone's parameters at the last outer step, <code>buf</code> the outer momentum. "
                   "Return (new parameters, new momentum), a tuple or a list: the pseudo-gradient "
                   "start − local averaged over the replicas, then one step of SGD with Nesterov "
                   "momentum from <code>start</code>. The check runs it on 2 and 4 ranks.",
            check=check_outer_step,
            hint="torch.optim.SGD(nesterov=True): buf = μ·buf + g; p = p − lr·(g + μ·buf).",
            solution=solution_text(outer_step), reference=lambda: outer_step),
        "exchange": Exercise(
            key="exchange", title="an exchange that survives a vanished peer (the checker kills one)",
            prompt="Write <code>exchange(store, rnd, me, grad, members)</code>, §2's exchange: put your "
                   "gradient under <code>f\"grad/{rnd}/{me}\"</code> (<code>T.to_bytes</code>), wait for "
                   "every member's, and return their average in member order (<code>T.from_bytes</code>). "
                   "The lighthouse sets <code>f\"dead/{rnd}\"</code> when a member has died: then, unless "
                   "every gradient is there, return <code>None</code> (the step is discarded). "
                   "<code>store.check([key])</code> says whether a key exists, <code>store.get(key)</code> "
                   "reads it. The check runs 2 and 3 replicas and SIGKILLs one mid-exchange.",
            check=check_exchange,
            hint="Loop while not every member's key exists; inside, if dead/{rnd} exists (and the keys are "
                 "still missing), return None. A gradient never disappears: whoever saw them all commits.",
            solution=solution_text(ft_step.exchange), reference=lambda: ft_step.exchange),
    }
