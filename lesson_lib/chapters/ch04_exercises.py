"""Chapter 4's rank-side helpers and exercises (notebooks/04_zero.ipynb).

Nothing here imports IPython: ``task`` runs inside the workers. The ZeRO-1 step written on real
ranks is judged in :mod:`.ch04_zero1`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..costmodel import zero_memory
from ..data import batch_indices, shard, teacher_classification
from ..exercises import (
    Exercise,
    Property,
    Verdict,
    compare,
    judge,
    locally,
    mismatch,
    solution_text,
    stage,
)
from ..exercises.answers import byte_count, unit_slip
from ..models import mlp
from .ch04_zero1 import check_zero1, my_zero1_step, zero1_job  # noqa: F401  (zero1_job runs on ranks)


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


# --------------------------------------------------------------------------- paper and pencil


def _stage2_bytes(o: tuple) -> str | None:
    psi, n, returned = o
    got, want = byte_count(returned, "a number of bytes"), zero_memory(psi, n, 2, "mixed")["total"]
    if compare(got, want, abs_=1.0):  # whole bytes (floor division) are as right
        return None
    slip = unit_slip(got, want, " bytes")  # 16.64 for 16.64e9: GB, and the formula right
    return (mismatch(got, want, said=f"stage2({psi:g}, {n}) returned") + "; "
            + (slip or "think about which parts are replicated and which are split"))


def check_stage2(fn) -> Verdict:
    if not callable(fn):
        return Verdict(False, "submit a function stage2(psi, n)")
    cases = [locally(f"Ψ = {psi:g}, N = {n}", lambda psi=psi, n=n: (psi, n, fn(psi, n)))
             for psi, n in ((7.5e9, 64), (1e6, 4), (3e9, 1), (13e9, 8))]
    return judge(cases, [Property("the bytes per rank of ZeRO stage 2, mixed precision", _stage2_bytes)],
                 done="2Ψ + 14Ψ/N: fp16 parameters replicated, gradients and optimizer state sharded.")


def stage1_slices(numel: int, n: int) -> list[tuple[int, int]]:
    """The prompt's contract: ceil(numel/N) elements per rank in rank order, the last ones shorter
    (the flat buffer is padded to a multiple of N; the padding is nobody's parameters)."""
    size = -(-numel // n)
    return [(min(r * size, numel), min((r + 1) * size, numel)) for r in range(n)]


def _stage1_run(fn, numel: int, n: int, seed: int, lr: float = 0.1) -> dict:
    g = torch.Generator().manual_seed(seed)
    params, grads = torch.randn(numel, generator=g), torch.randn(numel, generator=g)
    got = []
    for r in range(n):  # each rank's call on its own: one that raises is that rank's verdict
        try:
            got.append(fn(params.clone(), grads.clone(), r, n, lr))
        except Exception as e:  # the learner's code: feedback naming the rank, not the checker's crash
            if "ellipsis" in str(e).lower():
                raise
            got.append(_Raised(e))
    return {"numel": numel, "n": n, "want": params - lr * grads, "got": got}


class _Raised:
    def __init__(self, e: Exception):
        self.text = f"{type(e).__name__}: {e}"


def _own_slice_length(o: dict) -> str | None:
    for r, ((lo, hi), got) in enumerate(zip(stage1_slices(o["numel"], o["n"]), o["got"])):
        if isinstance(got, _Raised):
            empty = (f": rank {r} owns the empty slice [{lo}:{hi}] (ceil({o['numel']}/{o['n']}) = "
                     f"{-(-o['numel'] // o['n'])} per rank leaves it none; torch.chunk makes fewer chunks "
                     "than ranks then): return an empty tensor") if lo == hi else ""
            return f"rank {r}'s call: your function raised {got.text}{empty}"
        if got is None:
            return f"rank {r}'s call returned None: return this rank's updated slice"
        if torch.as_tensor(got).numel() != hi - lo:
            return (f"rank {r} returned {torch.as_tensor(got).numel()} values; each rank owns ceil("
                    f"{o['numel']}/{o['n']}) = {-(-o['numel'] // o['n'])} of them (the last rank(s) fewer)")
    return None


def _stepped_slice(o: dict) -> str | None:
    for r, ((lo, hi), got) in enumerate(zip(stage1_slices(o["numel"], o["n"]), o["got"])):
        want = o["want"][lo:hi]
        got = torch.as_tensor(got, dtype=want.dtype).reshape(-1)
        tol = 8 * torch.finfo(want.dtype).eps * (1 + float(o["want"].abs().max()))  # one rounded step
        if got.shape != want.shape or not torch.allclose(got, want, rtol=0, atol=tol):
            return f"rank {r}'s values are not its slice [{lo}:{hi}] of params − lr·grads"
    return None


def check_stage1_update(fn) -> Verdict:
    if not callable(fn):
        return Verdict(False, "submit a function stage1_update(params, grads, rank, world_size, lr)")
    # the learning rate varies too: an answer that types 0.1 in is right at one of them only
    cases = [locally(f"{numel} parameters on N = {n} ranks, lr = {lr:g}", _stage1_run, fn, numel, n, seed, lr)
             for seed, (numel, n, lr) in enumerate(((10, 4, 0.1), (13, 4, 0.1), (12, 3, 0.03), (7, 2, 0.5),
                                                    (5, 4, 0.1)))]
    return judge(cases, [
        Property("each rank returns its own slice, ceil(len/N) values in rank order", _own_slice_length),
        Property("each slice takes the SGD step params − lr·grads", _stepped_slice)],
        done="An all-gather joins the slices.")


def first_fitting_stage(params: float, world_size: int, device_gb: float, precision: str = "mixed"):
    """The lowest stage whose model states fit ``device_gb`` (None if none does)."""
    for s in range(4):
        if zero_memory(params, world_size, s, precision)["total"] <= device_gb * 1e9:
            return s
    return None


def check_fit(answer) -> Verdict:
    want = first_fitting_stage(13e9, 8, 80)
    got = stage(answer, "a stage, one of the whole numbers 0, 1, 2, 3")  # "stage 1", "ZeRO-1" too
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
                   "in rank order (the last may be shorter, or empty: 5 over 4 ranks is 2, 2, 1, 0). An "
                   "all-gather would then give everyone the whole result.",
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
