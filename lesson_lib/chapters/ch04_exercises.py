"""Chapter 4's rank-side helpers and exercises (notebooks/04_zero.ipynb).

Nothing here imports IPython: ``task`` and ``zero1_job`` run inside the workers.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from .. import comm
from ..costmodel import zero_memory
from ..data import batch_indices, shard, teacher_classification
from ..exercises import (
    Exercise,
    Property,
    Verdict,
    compare,
    judge,
    mismatch,
    number,
    observe,
    on_ranks,
    solution_text,
    summary,
    whole_number,
)
from ..models import mlp


def task(cfg):
    """On a rank: the chapter's model (same initial weights everywhere) and ``batch(step)``,
    this rank's share of the global batch — the model and data every ZeRO stage trains."""
    rank, n = dist.get_rank(), dist.get_world_size()
    model = mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed)
    x_all, y_all = teacher_classification(cfg.samples, cfg.d_in, cfg.classes)

    def batch(step: int):
        idx = shard(batch_indices(cfg.samples, cfg.global_batch, step, cfg.seed), rank, n)
        return x_all[idx], y_all[idx]

    return model, batch


# --------------------------------------------------------------------------- write it yourself

ZERO1_LR = 0.5  # integer parameters and gradients, N = 4: every value below is exact in fp32


def zero1_job(fn: Callable, numel: int, seed: int) -> dict:
    """On every rank: the learner's ``fn(params, grad, step)`` on integer data; what it did."""
    rank, n = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(seed)
    params = torch.randint(-9, 10, (numel,), generator=g).float()
    grads = [torch.randint(-9, 10, (numel,), generator=g).float() for _ in range(n)]
    touched = []

    def step(p: torch.Tensor, grad: torch.Tensor) -> None:
        """The optimizer (SGD here), applied in place to the slice it is given."""
        same = p.untyped_storage().data_ptr() == params.untyped_storage().data_ptr()
        touched.append(((p.data_ptr() - params.data_ptr()) // 4 if same else None, p.numel()))
        p.sub_(ZERO1_LR * grad)

    before = params.clone()
    with observe() as log:
        out = fn(params, grads[rank].clone(), step)
    if out is not None and not isinstance(out, torch.Tensor):
        return {"error": f"returned a {type(out).__name__}, not the parameters tensor"}
    return {"params": None if out is None else out.detach().float().reshape(-1).tolist(),
            "touched": touched, "before": before.tolist(), "mean": (torch.stack(grads).sum(0) / n).tolist(),
            "calls": log.as_data()["calls"]}


def check_zero1(fn: Callable, world_size: int = 4, timeout_s: float = 15) -> Verdict:
    """The learner's ZeRO-1 step on real ranks against the single-process SGD step: every rank
    ends with params − lr·mean(grads), having updated only its own slice, and its gradient's sum
    came by a reduce-scatter (the communication it made, observed)."""
    if not callable(fn):
        return Verdict(False, "submit your function, e.g. exercises['zero1'].submit(my_zero1_step)")

    cases = [on_ranks(f"{world_size} ranks, {numel} parameters", world_size, zero1_job, fn, numel, seed,
                      timeout_s=timeout_s) for numel, seed in ((world_size * 3, 1), (world_size * 250, 2))]
    return judge(cases, [
        Property("each rank returns the parameters", _returned),
        Property("each rank steps on its own slice only, once", _own_slice),
        Property("the gradients are reduce-scattered (each rank receives the sum of its own slice only)",
                 _reduce_scattered),
        Property("every rank ends with what single-process SGD gives", _same_as_sgd)],
        done="An optimizer keeps state for 1/N of the parameters.")


def _returned(outs: list[dict]) -> str | None:
    for r, o in enumerate(outs):
        if "error" in o:
            return f"rank {r} {o['error']}"
        if o["params"] is None:
            return f"rank {r} returned None: return the parameters after the step"


def _own_slice(outs: list[dict]) -> str | None:
    n = len(outs)
    for r, o in enumerate(outs):
        numel = len(o["before"])
        size = numel // n
        sizes = [t[1] for t in o["touched"]]
        if sizes != [size]:
            return (f"rank {r} called step on {sizes or 'no'} elements (of {numel}): in ZeRO-1 each rank "
                    f"updates exactly its own slice ({size} elements here), once")
        offset = o["touched"][0][0]
        if offset not in (r * size, None):
            return (f"rank {r} updated the slice starting at element {offset}; its own slice, the one the "
                    "reduce-scatter summed for it, starts elsewhere")


def _reduce_scattered(outs: list[dict]) -> str | None:
    """A reduce-scatter by any API, or one built by hand from point-to-point messages that send no
    more than a reduce-scatter and an all-gather do (2(N−1)/N of the gradient's bytes); never an
    all-reduce of the gradient, which hands every rank the whole sum."""
    n = len(outs)
    for r, o in enumerate(outs):
        calls, grad_bytes = o["calls"], 4 * len(o["before"])
        ops = {c["op"] for c in calls}
        if any(c["op"] == "all_reduce" and c["bytes"] >= grad_bytes // n for c in calls):
            return (f"rank {r}'s step ran {summary(calls)}: an all-reduce hands every rank the whole summed "
                    "gradient, of which it needs 1/N; ZeRO-1 reduce-scatters")
        if "reduce_scatter" in ops:
            continue
        sent = sum(c["bytes"] for c in calls if c["op"] == "send")
        if ops and ops <= {"send", "recv"} and sent <= 2 * (n - 1) / n * grad_bytes + 4 * n:
            continue  # built by hand, as a ring: as few bytes as reduce-scatter + all-gather
        return f"rank {r}'s step ran {summary(calls)}: no reduce-scatter of the gradient"


def _same_as_sgd(outs: list[dict]) -> str | None:
    n = len(outs)
    for r, o in enumerate(outs):
        numel = len(o["before"])
        size = numel // n
        before, mean, got = (torch.tensor(o[k]) for k in ("before", "mean", "params"))
        want = before - ZERO1_LR * mean
        if got.shape != want.shape:
            return f"rank {r} returned {got.numel()} values; the parameters have {numel}"
        if torch.equal(got, want):
            continue
        if torch.equal(got, before - ZERO1_LR * n * mean):
            return ("every update is N times too large: the global gradient is the mean of the ranks' "
                    "gradients, and a reduce-scatter gives their sum")
        wrong = [k for k in range(n) if not torch.equal(_chunk(got, k, size), _chunk(want, k, size))]
        if r not in wrong and all(torch.equal(_chunk(got, k, size), _chunk(before, k, size)) for k in wrong):
            return (f"on rank {r}, slices {wrong} still hold the old parameters: the other ranks' updated "
                    "slices never arrived")
        return (f"on rank {r}, slices {wrong} differ from single-process SGD (params − lr · the mean of the "
                "ranks' gradients)")


def _chunk(t: torch.Tensor, k: int, size: int) -> torch.Tensor:
    return t[k * size:(k + 1) * size]


def my_zero1_step(params, grad, step):
    """The write-it-yourself answer: ZeRO-1's step on one rank (used by the tests)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    my_grad = comm.ring_reduce_scatter(grad).div_(n)  # the sum of everyone's slice `rank`, averaged
    size = params.numel() // n
    step(params[rank * size:(rank + 1) * size], my_grad)
    comm.ring_all_gather(params)  # every rank gets every updated slice
    return params


# --------------------------------------------------------------------------- paper and pencil


def check_stage2(fn) -> Verdict:
    if not callable(fn):
        return Verdict(False, "submit a function stage2(psi, n)")
    for psi, n in ((7.5e9, 64), (1e6, 4), (3e9, 1), (13e9, 8)):
        got = number(fn(psi, n), "a number of bytes")
        want = zero_memory(psi, n, 2, "mixed")["total"]
        if not compare(got, want, abs_=1.0):  # whole bytes (floor division) are as right
            return Verdict(False, mismatch(got, want, said=f"stage2({psi:g}, {n}) returned") + "; think "
                                  "about which parts are replicated and which are split")
    return Verdict(True, "2Ψ + 14Ψ/N: fp16 parameters replicated, gradients and optimizer state sharded")


def stage1_slices(numel: int, n: int) -> list[tuple[int, int]]:
    """The prompt's contract: ceil(numel/N) elements per rank in rank order, the last ones shorter
    (the flat buffer is padded to a multiple of N; the padding is nobody's parameters)."""
    size = -(-numel // n)
    return [(min(r * size, numel), min((r + 1) * size, numel)) for r in range(n)]


def check_stage1_update(fn) -> Verdict:
    if not callable(fn):
        return Verdict(False, "submit a function stage1_update(params, grads, rank, world_size, lr)")
    g = torch.Generator().manual_seed(3)
    for numel, n in ((10, 4), (13, 4), (12, 3), (7, 2), (5, 4)):
        params, grads = torch.randn(numel, generator=g), torch.randn(numel, generator=g)
        lr = 0.1
        want = params - lr * grads
        for r, (lo, hi) in enumerate(stage1_slices(numel, n)):
            got = fn(params.clone(), grads.clone(), r, n, lr)
            if got is None:
                return Verdict(False, "your function returned None: return this rank's updated slice")
            got = torch.as_tensor(got).reshape(-1)
            if got.numel() != hi - lo:
                return Verdict(False, f"with {numel} parameters on N={n} ranks, rank {r} returned "
                                      f"{got.numel()} values; each rank owns ceil({numel}/{n}) = "
                                      f"{-(-numel // n)} of them (the last rank(s) fewer)")
            if not torch.allclose(got, want[lo:hi]):
                return Verdict(False, f"with {numel} parameters on N={n} ranks, rank {r}'s values are not "
                                      "its slice of params − lr·grads")
    return Verdict(True, "each rank updates its own ceil(len/N) slice; an all-gather joins them")


def first_fitting_stage(params: float, world_size: int, device_gb: float, precision: str = "mixed"):
    """The lowest stage whose model states fit ``device_gb`` (None if none does)."""
    for s in range(4):
        if zero_memory(params, world_size, s, precision)["total"] <= device_gb * 1e9:
            return s
    return None


def check_fit(answer) -> Verdict:
    want = first_fitting_stage(13e9, 8, 80)
    got = whole_number(answer, "a stage, one of the whole numbers 0, 1, 2, 3")
    if got not in (0, 1, 2, 3):
        return Verdict(False, f"you said {got}: a stage is one of the whole numbers 0, 1, 2, 3")
    ok = got == want
    return Verdict(ok, f"you said stage {got}" + ("" if ok else "; compute 16Ψ, 4Ψ+12Ψ/N, … in GB"))


def exercises() -> dict[str, Exercise]:
    return {
        "zero1": Exercise(
            key="zero1", title="write ZeRO-1's step, on real ranks",
            prompt="Write <code>my_zero1_step(params, grad, step)</code>; it runs on every rank of a 4-rank "
                   "cluster. <code>params</code> is the full flat parameter vector (the same on every rank, "
                   "its length a multiple of N), <code>grad</code> this rank's own gradient (different on "
                   "every rank), and <code>step(p, g)</code> the optimizer, which updates <code>p</code> in "
                   "place. Each rank owns slice <code>rank</code> of N equal slices. Average the gradients "
                   "so that each rank gets only its slice (<code>comm.ring_reduce_scatter</code>), call "
                   "<code>step</code> on your slice only, then give every rank every updated slice "
                   "(<code>comm.ring_all_gather</code>); return <code>params</code>. The check compares "
                   "with single-process SGD and stops after 15 s if the ranks wait for each other.",
            check=check_zero1,
            hint="comm.ring_reduce_scatter(t) works in place and returns this rank's summed slice (a view); "
                 "comm.ring_all_gather(t) fills every slice of t from its owner. Every rank must call both.",
            solution=solution_text(my_zero1_step), reference=lambda: my_zero1_step),
        "stage2": Exercise(
            key="stage2", title="the stage-2 formula",
            prompt="Mixed-precision Adam keeps 2 bytes of fp16 parameters, 2 bytes of gradients and K = 12 "
                   "bytes of optimizer state per parameter. Write <code>stage2(psi, n)</code>: bytes of "
                   "model state per device under ZeRO stage 2 with N devices.",
            check=check_stage2,
            hint="Stage 2 shards the optimizer state and the gradients; what is left whole?",
            solution="def stage2(psi, n):\n    return 2 * psi + (2 + 12) * psi / n",
            reference=lambda: (lambda psi, n: 2 * psi + 14 * psi / n)),
        "stage1": Exercise(
            key="stage1", title="the stage-1 sharded update",
            prompt="Every rank has the full (averaged) gradient and the full parameters, as flat tensors. "
                   "Write <code>stage1_update(params, grads, rank, world_size, lr)</code> returning only "
                   "this rank's slice of the parameters after one SGD step: slices of ceil(len/N) elements, "
                   "in rank order (the last may be shorter). An all-gather would then give everyone the "
                   "whole result.",
            check=check_stage1_update, hint="Compute this rank's [lo, hi) first; update only that slice.",
            solution="def stage1_update(params, grads, rank, world_size, lr):\n    size = -(-params.numel() "
                     "// world_size)\n    lo, hi = rank * size, min((rank + 1) * size, params.numel())\n    "
                     "return params[lo:hi] - lr * grads[lo:hi]",
            reference=lambda: reference_stage1_update),
        "fit": Exercise(
            key="fit", title="when does it fit?",
            prompt="A 13-billion-parameter model, mixed-precision Adam, 8 devices of 80 GB each. Ignoring "
                   "activations: what is the first ZeRO stage (0–3) at which the model states fit one "
                   "device? Predict it, then check with the calculator above.",
            check=check_fit,
            hint="Stage 0 needs 16 × 13 GB. Stage 1 keeps 4Ψ whole and splits 12Ψ over 8.",
            solution="Stage 1: 4 × 13 GB + 12 × 13 GB / 8 = 52 + 19.5 = 71.5 GB ≤ 80 GB.",
            reference=lambda: 1),
    }


def reference_stage1_update(params, grads, rank, world_size, lr):
    size = -(-params.numel() // world_size)
    lo, hi = min(rank * size, params.numel()), min((rank + 1) * size, params.numel())
    return params[lo:hi] - lr * grads[lo:hi]
