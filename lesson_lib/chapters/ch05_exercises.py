"""Chapter 5's exercises: a trust ratio by hand, LAMB's update for one layer, the scaling rule
confirmed by a run, why sharded norms need an all-reduce, that all-reduce on real ranks, and
gradient accumulation on real ranks (:mod:`.ch05_accumulate`)."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ..comm.schedules import chunk_bounds
from ..exercises import (
    AnswerError,
    Exercise,
    Property,
    Verdict,
    choice,
    compare,
    judge,
    number,
    numbers_of,
    observe,
    on_ranks,
    pair,
    solution_text,
    summary,
    whole_number,
)
from ..experiments import run_warm
from ..milestones import large_batch as lb
from ..optim import LAMB
from .ch05_accumulate import exercise as accumulate_exercise
from .ch05_lamb import _check_lamb, lamb_step

# Printed in the notebook for the by-hand trust ratio.
LARS_CASE = {"eta": 0.001, "w_norm": 12.0, "g_norm": 0.05, "beta": 5e-4}


def lars_ratio(eta: float, w_norm: float, g_norm: float, beta: float) -> float:
    return eta * w_norm / (g_norm + beta * w_norm)


RATIO_REL = 5e-3  # the prompt asks for 3 significant digits


def _check_ratio(answer) -> Verdict:
    value = number(answer, "the trust ratio λ, a number")
    expected = lars_ratio(**LARS_CASE)
    if compare(value, expected, RATIO_REL):
        return Verdict(True, f"λ = {value:.4g}: this layer's step is {value:.3g} × the global rate")
    c = LARS_CASE
    if compare(value, c["eta"] * c["w_norm"] / c["g_norm"], RATIO_REL):
        return Verdict(False, "close: the weight decay adds a term to the denominator too")
    if compare(value, 1 / expected, RATIO_REL):
        return Verdict(False, "upside down: a large weight and a small gradient should give a large ratio")
    return Verdict(False, f"you said {value:.4g}; write λ from the norms printed above")


# --------------------------------------------------------------------------- the scaling rule


def _check_scaling(answer, run_check: bool = True) -> Verdict:
    """``(lr, warmup_steps)`` for SGD at 8 × B₀; the rate must follow the linear rule."""
    lr, warmup = numbers_of(answer, 2, "a pair: (learning rate, warm-up steps)", names=(
        ("lr", "learning_rate", "rate"),
        ("warmup_steps", "warmup", "warm_up", "warmup_step", "warm_up_steps", "warm_up_step")))
    warmup = whole_number(warmup, "the warm-up steps, a whole number")
    base, batch = lb.BASE_LR["sgd"], 8 * lb.BASE_BATCH
    if compare(lr, base * math.sqrt(8), 0.01):
        return Verdict(False, "that is the square-root rule; Goyal et al. scale SGD's rate linearly")
    if not compare(lr, 8 * base, 0.01):
        return Verdict(False, f"you said lr={lr:g}: how does the linear rule scale {base:g} for 8 × B₀?")
    steps = lb.at_batch("sgd", batch).steps
    if not 1 <= warmup <= steps:
        return Verdict(False, f"the warm-up is a number of the run's {steps} steps, from 1 to {steps}; "
                              f"you said {warmup}")
    long = (f"; a warm-up of {warmup} of {steps} steps leaves {steps - warmup} at the full rate (Goyal et "
            "al. warmed up for 5 of 90 epochs)" if warmup > steps // 2 else "")
    if not run_check:
        return Verdict(True, f"lr = {lr:g}" + long)
    r = run_warm(lb.at_batch("sgd", batch, lr=lr, warmup_steps=warmup))
    base_run = run_warm(lb.at_batch("sgd", lb.BASE_BATCH))
    a, a0 = r["eval_accuracy"], base_run["eval_accuracy"]
    said = (f"lr = {lr:g} with {warmup} warm-up steps is the rule's answer (judged by the rule, not by "
            f"the run). The run reached held-out accuracy {a:.3f} in {r['steps']} steps, against {a0:.3f} "
            f"at B₀ in {base_run['steps']}")
    if a >= a0 - 0.015:
        return Verdict(True, said + ": the rule kept the accuracy here" + long)
    return Verdict(True, said + ". The rule's answer trains, but not as far: on this short budget (8 "
                   "epochs) 8× fewer steps do not make up the difference, and the rule holds only up to a "
                   "batch size (Goyal et al., 2017, trained for 90 epochs; §3's SGD at 32 × B₀ diverges). "
                   "At a rate this close to the edge, a short run's accuracy also swings with the warm-up "
                   "and the seed: try another warm-up and see" + long)


# --------------------------------------------------------------------------- norms under ZeRO

ZERO_CHOICES = {
    "a": "each rank's optimizer state would otherwise drift apart",
    "b": "a rank holds only a slice of each layer, and a layer's norm needs the squares of all of it",
    "c": "the gradients are not averaged yet when the optimizer runs",
    "d": "the trust ratio must be the same number on every rank, and the mean of the ranks' ratios is it",
}


def _check_zero_choice(answer) -> Verdict:
    key = choice(answer, ZERO_CHOICES)
    if key == "b":
        return Verdict(True, "‖w‖² is a sum over the whole layer: all-reduce the partial sums of "
                             "squares (a few bytes per layer), then take the square root")
    why = {"a": "the state is sharded on purpose: no rank needs another's",
           "c": "under ZeRO the gradients are reduce-scattered before the step",
           "d": "a mean of per-slice ratios is not the ratio of the layer's norms"}[key]
    return Verdict(False, why)


# --------------------------------------------------------------------------- on real ranks


def sharded_ratio_harness(fn, numel: int, seed: int) -> dict:
    """On each rank: this rank's slice of a seeded layer (w and u), the learner's ratio from it (or
    what came back instead), the norms of the slice and of the whole layer, and the communication the
    learner's function made."""
    rank, n = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(seed)
    w, u = torch.randn(numel, generator=g), torch.randn(numel, generator=g) * 0.01
    lo, hi = chunk_bounds(numel, n)[rank]
    with observe() as log:
        got = fn(w[lo:hi].clone(), u[lo:hi].clone())
    norms = {"w_own": float(w[lo:hi].norm()), "u_own": float(u[lo:hi].norm()),
             "w_all": float(w.norm()), "u_all": float(u.norm())}
    return {"got": _one_number(got), "returned": _returned(got, hi - lo), "calls": log.as_data()["calls"],
            "expected": float(w.norm() / u.norm()), "slice_bytes": 4 * (hi - lo), **norms}


def _one_number(got) -> float | None:
    """One number in any form :func:`number` reads, or a one-item list or tuple of one; else None."""
    if isinstance(got, (tuple, list)) and len(got) == 1:
        got = got[0]
    try:
        return number(got)
    except AnswerError:
        return None


def _returned(got, slice_len: int) -> str:
    shape = getattr(got, "shape", None)
    if got is None:
        return "None"
    if shape is None:
        size = f" of {len(got)} items" if isinstance(got, (tuple, list, dict)) else ""
        return f"a {type(got).__name__}{size}"
    why = (f", its slice's shape ({slice_len} elements)" if tuple(shape) == (slice_len,) else
           ", two values: ‖w‖ and ‖u‖? return their quotient" if math.prod(shape) == 2 else "")
    return f"a {type(got).__name__} of shape {tuple(shape)}{why}"


def _norms_used(o: dict) -> str:
    """Which norms a rank's number is the quotient of: its slice's or the layer's, for w and for u."""
    for a, wn in (("its slice's", o["w_own"]), ("the layer's", o["w_all"])):
        for b, un in (("its slice's", o["u_own"]), ("the layer's", o["u_all"])):
            if compare(o["got"], wn / un, 1e-4):
                return f" ({a} ‖w‖ / {b} ‖u‖)"
    return ""


def _check_sharded(fn) -> Verdict:
    if not callable(fn):
        return Verdict(False, "submit your function, e.g. ex.submit(sharded_trust_ratio)")

    def case(world: int, numel: int):
        return on_ranks(f"{world} ranks, {numel} elements", world, sharded_ratio_harness, fn, numel, world,
                        timeout_s=10)

    def one_number(outs):
        for r, o in enumerate(outs):
            if o["got"] is None:
                return (f"rank {r} returned {o['returned']}: the ratio is one number (a float, or a "
                        "0-d tensor)")

    def agree(outs):
        got = [o["got"] for o in outs]
        if not all(compare(x, got[0], 1e-6) for x in got):
            said = ", ".join(f"rank {r} {o['got']:.6g}{_norms_used(o)}" for r, o in enumerate(outs))
            ops = {c["op"] for o in outs for c in o["calls"]}
            return f"the ranks returned: {said}" + (
                ": dist.reduce leaves the sum on one rank only; all_reduce leaves it on every rank"
                if "reduce" in ops else ": each must use the layer's sums of squares for both norms")

    def whole_layer(outs):
        got, want = outs[0]["got"], outs[0]["expected"]
        if not compare(got, want, 1e-4):
            a, b = pair(got, want)
            summed = sum(o["w_own"] for o in outs) / sum(o["u_own"] for o in outs)
            why = ("(‖w‖/‖u‖)²: take the square root of each summed square" if compare(got, want**2, 1e-4)
                   else "the ratio of the slices' norms summed: norms do not add up across slices; "
                   "squares do" if compare(got, summed, 1e-4)
                   else "what adds up across slices — norms or squares?")
            return f"you got {a} and the layer's ‖w‖/‖u‖ is {b}: {why}"

    def few_bytes(outs):
        for r, o in enumerate(outs):
            sent = sum(c["bytes"] for c in o["calls"])
            if not o["calls"]:
                return f"rank {r} made no communication call: a slice alone cannot know the layer's norms"
            if sent >= o["slice_bytes"]:
                return (f"rank {r} handed {summary(o['calls'])} to the network, as much as its whole "
                        f"slice ({o['slice_bytes']:,} bytes): only two sums need to travel")

    return judge([case(2, 37), case(3, 100)], [
        Property("every rank returns one number", one_number),
        Property("every rank returns the same number", agree),
        Property("it is the whole layer's ‖w‖/‖u‖", whole_layer),
        Property("only a few numbers travel, not the slices", few_bytes)])


def sharded_trust_ratio(w_shard, u_shard):
    sq = torch.stack([w_shard.square().sum(), u_shard.square().sum()])
    dist.all_reduce(sq)  # the partial sums of squares, summed over the ranks
    return (sq[0].sqrt() / sq[1].sqrt()).item()


def exercises() -> dict[str, Exercise]:
    c = LARS_CASE
    return {
        "ratio": Exercise(
            key="ratio", title="a LARS trust ratio by hand",
            prompt=f"A layer has ‖w‖ = {c['w_norm']}, ‖∇L‖ = {c['g_norm']}; LARS uses η = {c['eta']} and "
                   f"weight decay β = {c['beta']}. What is its local learning rate λ (the trust ratio), to 3 "
                   "significant digits?",
            check=_check_ratio, hint="λ = η‖w‖ / (‖∇L‖ + β‖w‖) (You, Gitman & Ginsburg, 2017).",
            solution=f"λ = {c['eta']} × {c['w_norm']} / ({c['g_norm']} + {c['beta']} × {c['w_norm']}) = "
                     f"{lars_ratio(**c):.4g}", reference=lambda: lars_ratio(**c)),
        "lamb": Exercise(
            key="lamb", title="LAMB's update for one layer",
            prompt="Write <code>lamb_step(w, g, m, v, t, lr, wd)</code> (β₁ = 0.9, β₂ = 0.999, ε = 1e-6) "
                   "returning the new <code>(w, m, v)</code> after step t (t = 1, 2, …): Adam's moments "
                   "with bias correction, u = r + wd·w, and the step lr·‖w‖/‖u‖·u. The check runs three "
                   "steps against <code>lesson_lib.optim.LAMB</code>.",
            check=_check_lamb,
            hint="Follow Algorithm 2 of You et al. (2020) line by line; the weight decay is added to r "
                 "before the norm of u is taken.",
            solution=solution_text(lamb_step), reference=lambda: lamb_step, also=(LAMB.step,)),
        "scaling": Exercise(
            key="scaling", title="the linear scaling rule, then a run",
            prompt="SGD with momentum was tuned at B₀ = 64 with lr = 0.1. Pick the learning rate and the "
                   "warm-up steps for a batch 8× larger (the linear scaling rule with gradual warm-up, "
                   "Goyal et al., 2017), as a pair <code>(lr, warmup_steps)</code> (a tuple, a list or a "
                   "dict keyed lr and warmup_steps); the run at 8 × B₀ has "
                   f"{lb.at_batch('sgd', 8 * lb.BASE_BATCH).steps} steps, and the warm-up is 1 to that many "
                   "of them. The check judges the "
                   "rate by the rule and the warm-up as a short ramp, then runs your answer for real and "
                   "reports how far it trains beside B₀: the rule is where tuning a large batch starts, not "
                   "a promise that it keeps the accuracy.",
            check=_check_scaling,
            hint="Multiply the rate by k = 8; warm up over the first few percent of the steps (Goyal et al. "
                 "used 5 of 90 epochs).",
            solution="(0.8, 12): 0.1 × 8, warmed up over about a tenth of the 128 steps.",
            reference=lambda: (0.8, 12)),
        "zero": Exercise(
            key="zero", title="norms under ZeRO",
            prompt="Under ZeRO (chapter 4) each rank updates only its shard of the parameters. Why does LAMB "
                   "then need an all-reduce that Adam does not? " + "; ".join(
                f"({k}) {v}" for k, v in ZERO_CHOICES.items()),
            check=_check_zero_choice,
            hint="Adam's update of an element needs only that element; LAMB's needs ‖w‖ and ‖u‖ of the "
                 "whole layer.",
            solution="(b): a layer's norm is a square root of a sum over the whole layer.",
            reference=lambda: "b"),
        "sharded": Exercise(
            key="sharded", title="write it: a layer's trust ratio from its slices, on real ranks",
            prompt="Each rank holds a slice <code>w_shard</code> and <code>u_shard</code> of one layer. "
                   "Write <code>sharded_trust_ratio(w_shard, u_shard)</code>, run on every rank, that "
                   "returns the whole layer's ‖w‖/‖u‖ on every rank, using <code>dist.all_reduce</code>. "
                   "The check runs it on 2 and 3 real ranks (10 s timeout).",
            check=_check_sharded, hint="Norms do not add up; squares do. One all-reduce can carry both sums.",
            solution=solution_text(sharded_trust_ratio), reference=lambda: sharded_trust_ratio),
        "accumulate": accumulate_exercise(),
    }
