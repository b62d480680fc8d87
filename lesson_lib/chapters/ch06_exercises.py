"""Chapter 6's exercises: top-k's bytes and where it stops saving, the QSGD quantizer, the bandwidth
below which PowerSGD pays (checked with the emulator), and random-k with error feedback on real ranks."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from .. import comm
from ..exercises import Exercise, Property, Verdict, judge, numbers_of, observe, on_ranks, summary
from ..exercises.unwaited import drain, never_waited
from ..milestones.compression import qsgd_dequantize, qsgd_quantize
from ..source import source
from .ch06_crossover import CROSSOVER_CASE, _check_crossover, crossover, crossover_case  # noqa: F401
from .ch06_qsgd import _check_qsgd, qsgd

# N = 8, not 4: at N = 4 the values-only mistake, 4(N−1)k, and the ring's 2(N−1)/N·8k are the same
# number, so the hint could not tell which mistake was made (tests check every hint is distinct).
TOPK_CASE = {"params": 1_000_000, "world": 8, "k": 10_000}


def topk_bytes(params: int, world: int, k: int) -> tuple[int, int]:
    """(bytes a rank sends: an all-gather of k int32 indices + k float32 values, the k at which
    that equals the float32 ring's 2(N−1)/N·4S)."""
    return (world - 1) * 8 * k, params // world


def _check_topk(answer) -> Verdict:
    sent, even = numbers_of(answer, 2, "a pair: (bytes each rank sends, k where top-k stops saving)",
                            names=(("bytes", "sent", "bytes_sent", "sent_bytes", "bytes_per_rank"),
                                   ("k", "even", "break_even", "k_even", "k_break_even")))
    c = TOPK_CASE
    want_sent, want_even = topk_bytes(**c)
    n, k = c["world"], c["k"]
    if not math.isclose(sent, want_sent, rel_tol=1e-3):
        why = topk_mistakes(n, k)
        hint = next((m for b, m in why.items() if math.isclose(sent, b, rel_tol=1e-3)),
                    "count what one all-gather of (index, value) pairs sends from each rank")
        return Verdict(False, f"{sent:,.0f} bytes is not it — {hint}")
    if not math.isclose(even, want_even, rel_tol=1e-3):
        hint = ("set (N−1)·8k equal to the ring's 2(N−1)/N·4S and solve for k"
                if not math.isclose(even, c["params"], rel_tol=1e-3)
                else "top-k sends 8 bytes per kept element to N−1 ranks; the ring sends less than 8S")
        return Verdict(False, f"the bytes are right; k = {even:,.0f} is not where they meet — {hint}")
    return Verdict(True, f"{want_sent:,} bytes against the ring's {2 * (n - 1) * 4 * c['params'] // n:,}; "
                         f"past k = S/N = {want_even:,} the all-gather sends more than the ring")


def topk_mistakes(n: int, k: int) -> dict[float, str]:
    """The byte counts of the mistakes the top-k exercise names, with the hint for each."""
    return {4 * (n - 1) * k: "the values alone: each value travels with its int32 index",
            8 * k: "one payload is yours; how many other ranks must receive it in an all-gather?",
            4 * k: "that is one rank's values only: indices, and the N−1 receivers, are missing",
            2 * (n - 1) / n * 8 * k: "an all-gather passes each payload on N−1 times, not 2(N−1)/N"}


# --------------------------------------------------------------------------- on real ranks


def randomk_harness(fn, numel: int, k: int, steps: int) -> dict:
    """On each rank: ``steps`` seeded gradients through the learner's random-k; its outputs and the
    communication it made (:func:`~lesson_lib.exercises.observe`), whichever API made it."""
    rank = dist.get_rank()
    residual, outs, residuals = torch.zeros(numel), [], []
    with observe() as log:
        for step in range(steps):
            g = torch.randn(numel, generator=torch.Generator().manual_seed(100 * rank + step))
            avg, residual = fn(g.clone(), residual.clone(), k, step)
            outs.append(torch.as_tensor(avg).detach().clone().reshape(-1))
            residual = torch.as_tensor(residual).detach().clone()
            residuals.append(residual.reshape(-1).clone())
    drain(log)
    return {"outs": outs, "residuals": residuals, "calls": log.as_data()["calls"]}


def _randomk_reference(world: int, numel: int, k: int, steps: int) -> dict:
    """One process's random-k with error feedback: per step the average, and each rank's residual."""
    residual = [torch.zeros(numel) for _ in range(world)]
    outs, residuals = [], []
    for step in range(steps):
        idx = torch.randperm(numel, generator=torch.Generator().manual_seed(step))[:k]
        acc = [torch.randn(numel, generator=torch.Generator().manual_seed(100 * r + step)) + residual[r]
               for r in range(world)]
        avg = torch.zeros(numel)
        avg[idx] = sum(a[idx] for a in acc) / world
        for r in range(world):
            residual[r] = acc[r].clone()
            residual[r][idx] = 0
        outs.append(avg)
        residuals.append([res.clone() for res in residual])
    return {"outs": outs, "residuals": residuals}


RANDOMK = {"numel": 1000, "k": 50, "steps": 3}


def _check_randomk(fn) -> Verdict:
    if not callable(fn):
        return Verdict(False, "submit your function, e.g. ex.submit(randomk_step)")
    numel, k, steps = RANDOMK["numel"], RANDOMK["k"], RANDOMK["steps"]

    def case(world: int):
        return on_ranks(f"{world} ranks", world, randomk_harness, fn, numel, k, steps, timeout_s=15,
                        then=lambda outs: {"ranks": outs, "ref": _randomk_reference(world, numel, k, steps)})

    return judge([case(2), case(3)], [
        Property("every asynchronous call is waited for", _waited),
        Property(f"each step keeps k = {k} coordinates", _k_kept),
        Property("only the k chosen values travel", _k_values_only),
        Property("every rank ends each step with the same average", _ranks_agree),
        Property("it is random-k with error feedback, as on one process", _as_reference),
        Property("each rank keeps what it did not send: its sum with the sent coordinates zeroed",
                 _residual_kept)],
        done=f"{steps} steps of k = {k} of {numel} values")


def _waited(o: dict) -> str | None:
    """Every handle a rank was handed (``async_op=True``) waited for: else its average is whatever
    had arrived when it was read."""
    return next((f"on rank {r} {said}" for r, out in enumerate(o["ranks"])
                 if (said := never_waited(out["calls"]))), None)


def _k_kept(o: dict) -> str | None:
    """How many coordinates each step kept, counted where the average is not zero (a dense or an
    all-zero average is judged by the bytes and the numbers instead)."""
    numel, k, steps = RANDOMK["numel"], RANDOMK["k"], RANDOMK["steps"]
    for r, out in enumerate(o["ranks"]):
        for step, avg in enumerate(out["outs"]):
            kept = int(torch.count_nonzero(avg))
            if avg.numel() != numel or kept in (0, k, numel):
                continue
            handed = sum(c["bytes"] for c in out["calls"])
            sent = f" and sent {kept:,} values a step" if handed == 4 * kept * steps else ""
            return (f"rank {r} kept {kept:,} coordinates at step {step} (its average is non-zero at {kept:,} "
                    f"of the {numel:,}){sent}, not k = {k}: keep the first k of the permutation, with k "
                    "the argument your function is handed")


def _k_values_only(o: dict) -> str | None:
    k, steps = RANDOMK["k"], RANDOMK["steps"]
    for r, out in enumerate(o["ranks"]):
        handed = sum(c["bytes"] for c in out["calls"])
        if handed == 0:
            return (f"rank {r} made no communication call: the ranks' values must be summed (comm.all_reduce "
                    "or dist.all_reduce)")
        if handed > 4 * k * steps * 1.01:
            return (f"rank {r} handed {summary(out['calls'])} to the network in {steps} steps, more than the "
                    f"k values ({4 * k * steps:,} bytes): send only the k values")


def _ranks_agree(o: dict) -> str | None:
    for step in range(RANDOMK["steps"]):
        mine = [out["outs"][step] for out in o["ranks"]]
        if any(m.shape != mine[0].shape or not torch.equal(m, mine[0]) for m in mine):
            return (f"at step {step} the ranks ended with different averages — do they all pick the same "
                    "indices?")


def _as_reference(o: dict) -> str | None:
    for step, ref in enumerate(o["ref"]["outs"]):
        mine = o["ranks"][0]["outs"][step]
        err = float((mine - ref).abs().max()) if mine.shape == ref.shape else float("inf")
        if err > 1e-5:
            where = "the first step" if step == 0 else f"step {step} (the first ones were right)"
            hint = ("is the residual added before choosing, and kept for next time?" if step
                    else "is the sum divided by the number of ranks, and only at the chosen indices?")
            return f"your average differs at {where}: {hint}"


def _residual_kept(o: dict) -> str | None:
    for step, refs in enumerate(o["ref"]["residuals"]):
        for r, out in enumerate(o["ranks"]):
            mine, ref = out["residuals"][step], refs[r]
            if mine.shape == ref.shape and float((mine - ref).abs().max()) <= 1e-5:
                continue
            sent = ref == 0
            if mine.shape == ref.shape and float(mine[sent].abs().max()) > 1e-5:
                return (f"rank {r}'s residual after step {step} is not zero where it sent: what was sent "
                        "has been delivered (the residual is the accumulated gradient with the sent "
                        "coordinates zeroed, not accumulated − average)")
            return (f"rank {r}'s residual after step {step} differs from grad + residual with the sent "
                    "coordinates zeroed: the coordinates not sent must be kept for the next step")
    return None


def randomk_step(grad, residual, k, step):
    acc = grad + residual  # error feedback: what was not sent last time comes back
    idx = torch.randperm(acc.numel(), generator=torch.Generator().manual_seed(step))[:k]
    vals = acc[idx]  # the same indices on every rank: the values add in place
    comm.all_reduce(vals)
    avg = torch.zeros_like(acc)
    avg[idx] = vals / dist.get_world_size()
    residual = acc.clone()
    residual[idx] = 0
    return avg, residual


def exercises(case: dict | None = None) -> dict[str, Exercise]:
    """The chapter's exercises; ``case`` holds the crossover exercise's measured numbers."""
    c, x = TOPK_CASE, case or CROSSOVER_CASE
    numbers = ", ".join(f"{k} = {v:.4g}" for k, v in x.items())
    return {
        "topk_bytes": Exercise(
            key="topk_bytes", title="top-k's bytes, indices included",
            prompt=f"A model of S = {c['params']:,} float32 gradients on N = {c['world']} ranks. Top-k keeps "
                   f"k = {c['k']:,} per rank and all-gathers (int32 index, float32 value) pairs. How many "
                   "bytes does each rank send per step, and at what k does that equal the uncompressed "
                   "ring's 2(N−1)/N·4S? Answer <code>(bytes, k)</code>.",
            check=_check_topk,
            hint="An all-gather sends each rank's payload to N−1 others; the ring sends 2(N−1)/N of the "
                 "gradient's bytes.",
            solution=(f"(N−1)·8k = {c['world'] - 1}·8·{c['k']:,} = {topk_bytes(**c)[0]:,} bytes; "
                      f"(N−1)·8k = 2(N−1)/N·4S gives k = S/N = {topk_bytes(**c)[1]:,}."),
            reference=lambda: topk_bytes(**c)),
        "qsgd": Exercise(
            key="qsgd", title="write the QSGD quantizer",
            prompt="Write <code>qsgd(x, s)</code>: for each element, |x_i|/‖x‖·s lies between two integer "
                   "levels; round up with probability equal to the fractional part, else down; return "
                   "‖x‖·sign(x_i)·level/s (Alistarh et al., 2017). The check draws it thousands of times: "
                   "the mean must be x (unbiased) and every value on the grid of 2s+1 levels.",
            check=_check_qsgd, hint="torch.rand_like(x) < fraction is True with probability = fraction.",
            solution=source(qsgd).text, reference=lambda: qsgd, also=(qsgd_quantize, qsgd_dequantize)),
        "crossover": Exercise(
            key="crossover", title="below which bandwidth does PowerSGD pay?",
            prompt="Measured on this machine (per step; bytes a rank sends; latency per emulated message): "
                   f"{numbers}. With chapter 2's α-β model, step time = compute + messages·α + bytes·8/B for "
                   "a link of B bit/s. Below which B (in Gbit/s) is PowerSGD faster than the uncompressed "
                   "ring? Answer the number, or a function <code>f(case)</code> of these numbers that "
                   "returns it. The check judges it against the model, then runs both on the emulator at a "
                   "third and at three times your answer and says whether this machine agrees.",
            check=lambda a: _check_crossover(a, x), hint="Set the two step times equal and solve for B.",
            solution="B = 8·(bytes_none − bytes_powersgd) / (compute_powersgd − compute_none + "
                     f"(messages_powersgd − messages_none)·α), in bit/s; divide by 10⁹: {crossover(x):.4g}.",
            reference=lambda: crossover(x)),
        "randomk": Exercise(
            key="randomk", title="write it: random-k with error feedback, on real ranks",
            prompt="Write <code>randomk_step(grad, residual, k, step)</code>, run on every rank, returning "
                   "<code>(average, new_residual)</code>: add the residual, keep the k coordinates "
                   "<code>torch.randperm(n, generator=torch.Generator().manual_seed(step))[:k]</code> (the "
                   "same on every rank, so they add in place), sum their values with "
                   "<code>comm.all_reduce</code> (or <code>dist.all_reduce</code>), divide by the ranks; the "
                   "residual keeps everything not sent. Checked on 2 and 3 real ranks over 3 steps (15 s "
                   "timeout), from your results and the communication each rank made.",
            check=_check_randomk,
            hint="Only k numbers should cross; the residual is the accumulated gradient with the sent "
                 "coordinates zeroed.",
            solution=source(randomk_step).text, reference=lambda: randomk_step),
    }
