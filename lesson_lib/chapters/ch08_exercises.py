"""Chapter 8's exercises on real ranks (notebooks/08_beyond_data_parallel.ipynb): g written as an
autograd Function, and the all-to-all that carries tokens to their experts; the online-softmax merge
(:mod:`.ch08_merge`), the ``parallelize_module`` plan (:mod:`.ch08_plan`) and the layout
(:mod:`.ch08_grid`). Each is judged on what the ranks computed and sent, against the single process.

Nothing here imports IPython: the ``*_job`` functions run inside the workers.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from ..exercises import (
    Exercise,
    Property,
    Verdict,
    judge,
    observe,
    on_ranks,
    solution_text,
    summary,
    unanswered,
)
from ..exercises.unwaited import drain, never_waited
from ..milestones.expert_parallel import moe
from ..milestones.tensor_parallel import ReduceFromTensorRegion, g
from .ch08_grid import layout_exercise
from .ch08_merge import merge_exercise
from .ch08_plan import plan_exercise

WAITED = "every asynchronous call is waited for"
G_ROWS, G_IN, G_OUT = 6, 8, 5  # small integers throughout: every sum below is exact in float32


def _apply(fn) -> Callable:
    """The learner's g as a callable: an autograd Function (its ``apply``) or a plain function."""
    return fn.apply if isinstance(fn, type) and issubclass(fn, torch.autograd.Function) else fn


def _g_case(seed: int, n: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 4, (G_ROWS, n * G_IN), generator=g).float()
    w = torch.randint(-3, 4, (G_OUT, n * G_IN), generator=g).float()
    c = torch.randint(-3, 4, (G_ROWS, G_OUT), generator=g).float()  # the loss is (y · c).sum()
    return x, w, c


def g_job(fn, seed: int) -> dict:
    """On every rank: a row-parallel linear layer ``g(x_r W_rᵀ)`` with the learner's g, forward
    and backward; what it computed and which collectives it made, forward and backward."""
    r, n = dist.get_rank(), dist.get_world_size()
    x, w, c = _g_case(seed, n)
    cols = slice(r * G_IN, (r + 1) * G_IN)
    x_r, w_r = x[:, cols].clone().requires_grad_(), w[:, cols].clone().requires_grad_()
    part = x_r @ w_r.t()
    with observe() as log:
        y = _apply(fn)(part)
        if not isinstance(y, torch.Tensor):
            return {"error": f"g returned a {type(y).__name__}, not a tensor"}
        log.mark("backward")
        if y.requires_grad:
            (y * c).sum().backward()
    drain(log)
    at = log.marks[0]["at"]
    grads = [None if t.grad is None else t.grad.clone() for t in (x_r, w_r)]
    return {"y": y.detach().clone(), "x_grad": grads[0], "w_grad": grads[1], "cols": (cols.start, cols.stop),
            "forward": [cl for cl in log.as_data()["calls"] if cl["start"] < at],
            "backward": [cl for cl in log.as_data()["calls"] if cl["start"] >= at], "seed": seed,
            "part_bytes": part.numel() * part.element_size()}


def _waited(outs: list[dict]) -> str | None:
    """Every handle the ranks were handed (``async_op=True``, ``isend``) waited for: else the result
    was read whenever it happened to arrive."""
    for r, o in enumerate(outs):
        said = "error" not in o and never_waited(o.get("calls", o.get("forward", []) + o.get("backward", [])))
        if said:
            return f"on rank {r} {said}"


def _g_forward(outs: list[dict]) -> str | None:
    n = len(outs)
    for r, o in enumerate(outs):
        if "error" in o:
            return f"rank {r}: {o['error']}"
        x, w, _ = _g_case(o["seed"], n)
        want, y = x @ w.t(), o["y"]
        if y.shape != want.shape:
            return f"rank {r}'s output has shape {tuple(y.shape)}, the layer's {tuple(want.shape)}"
        if torch.equal(y, want):
            continue
        lo, hi = o["cols"]
        if torch.equal(y, x[:, lo:hi] @ w[:, lo:hi].t()):
            return (f"rank {r} returned only its own partial sum x_r·W_rᵀ: the forward of g must add up "
                    "every rank's partial sum (an all-reduce)")
        if torch.allclose(y * n, want):
            return (f"rank {r}'s output is 1/{n} of the layer's: the row-parallel layer sums the parts, "
                    "not averages")
        return f"rank {r}'s output differs from the whole layer's x·Wᵀ"


def _g_backward(outs: list[dict]) -> str | None:
    n = len(outs)
    for r, o in enumerate(outs):
        x, w, c = _g_case(o["seed"], n)
        lo, hi = o["cols"]
        want_x, want_w = (c @ w)[:, lo:hi], (c.t() @ x)[:, lo:hi]
        if o["x_grad"] is None or o["w_grad"] is None:
            return (f"rank {r}'s weights got no gradient: g's output must stay connected to autograd "
                    "(return a tensor computed from the input inside an autograd Function's forward)")
        if torch.equal(o["x_grad"], want_x) and torch.equal(o["w_grad"], want_w):
            continue
        if torch.equal(o["w_grad"], n * want_w):
            return (f"rank {r}'s gradients are {n}× too large: every rank already holds the whole "
                    "gradient of g's output, so g's backward is the identity; an all-reduce there adds it "
                    "up N times")
        return f"rank {r}'s gradients differ from the whole layer's (its slice of cᵀx and c·W)"


def _g_traffic(outs: list[dict]) -> str | None:
    """What g must send, counted from the calls each rank made: one all-reduce of its partial sum
    forward (calls and bytes), nothing backward."""
    for r, o in enumerate(outs):
        fwd, part = o["forward"], o["part_bytes"]
        if not fwd:
            return f"rank {r} made no communication in the forward"
        if o["backward"]:
            return (f"rank {r}'s backward ran {summary(o['backward'])}: g's backward is the identity "
                    "(its conjugate f all-reduces in the backward)")
        reduces = [c for c in fwd if c["op"] == "all_reduce"]
        others = [c for c in fwd if c["op"] != "all_reduce"]
        need = f"g's forward is one all-reduce of the partial sum ({part:,} bytes)"
        if not reduces:
            gathered = " (an all-gather hands every rank all N partial sums to add up itself)" \
                if any(c["op"] == "all_gather" for c in fwd) else ""
            return f"rank {r}'s forward ran {summary(fwd)}: {need}; use dist.all_reduce{gathered}"
        if others:
            return (f"rank {r}'s forward ran {summary(fwd)}: {need} and nothing else; the {summary(others)} "
                    "sends what the layer does not need (after the all-reduce every rank holds the sum)")
        sent = sum(c["bytes"] for c in reduces)
        if sent > part:
            extra = len(reduces) - 1
            return (f"rank {r}'s forward ran {summary(fwd)}: {need}, so this is an extra all-reduce"
                    f"{'' if extra == 1 else f' ({extra} extra calls)'}: {sent - part:,} bytes more whose "
                    "result the layer never uses, paid for in time on every rank. Remove it")
        # (the sum cut into several all-reduces sends the same bytes: right, if slower by latency)


def check_g(fn) -> Verdict:
    if not callable(fn):
        return Verdict(False, "submit your autograd Function (the class) or a function g(x)")
    if isinstance(fn, type) and all(unanswered(getattr(fn, m, None)) for m in ("forward", "backward")):
        raise ValueError("the template's Ellipsis is still there")  # submit() reads: not answered yet
    cases = [on_ranks(f"{n} ranks", n, g_job, fn, seed, timeout_s=15) for n, seed in ((2, 1), (4, 2))]
    return judge(cases, [
        Property(WAITED, _waited),
        Property("every rank's output is the whole layer's x·Wᵀ", _g_forward),
        Property("every rank's gradients are the whole layer's, sliced", _g_backward),
        Property("one all-reduce of the partial sum in the forward, no communication in the backward",
                 _g_traffic)],
        done="f is its mirror image: identity forward, all-reduce backward.")


class ReduceFromRegion(torch.autograd.Function):
    """The answer: g, all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x):
        out = x.clone()
        dist.all_reduce(out)  # every rank's partial sum added up
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad  # each rank already holds the whole gradient


# --------------------------------------------------------------------------- the all-to-all


def dispatch_job(fn, cfg: moe.MoEConfig) -> dict:
    """On every rank: the MoE layer forward with the learner's exchange, and what it sent."""
    r, n = dist.get_rank(), dist.get_world_size()
    w = moe.weights(cfg)
    local = slice(r * cfg.experts // n, (r + 1) * cfg.experts // n)
    seen, sizes = [], []

    def exchange(buf):
        out = fn(buf.clone())
        sizes.append(tuple(buf.shape))
        seen.append(None if not isinstance(out, torch.Tensor) else tuple(out.shape))
        if isinstance(out, torch.Tensor) and out.shape == buf.shape:
            return out
        return buf.new_full(buf.shape, float("nan"))  # judged by its shape first

    with torch.no_grad(), observe() as log:
        x = moe.tokens(cfg, n)[r]
        y, _ = moe.moe_expert_parallel(x, w["router"], w["w1"][local], w["w2"][local], cfg, exchange=exchange)
    drain(log)
    return {"y": y, "shapes": seen, "buffers": sizes, "calls": log.as_data()["calls"],
            "buffer_bytes": 4 * cfg.experts * cfg.capacity * cfg.d_model}


def _dispatch_shape(outs: list[dict]) -> str | None:
    for r, o in enumerate(outs):
        for got, want in zip(o["shapes"], o["buffers"]):
            if got != want:
                what = "no tensor" if got is None else f"a tensor of shape {got}"
                more = " (as many values as the buffer, in another shape)" \
                    if got is not None and torch.Size(got).numel() == torch.Size(want).numel() else ""
                return (f"rank {r}'s exchange returned {what}{more}; expected {want}, the buffer's shape "
                        "[experts, capacity, d]: return a tensor of the buffer's shape")


def _dispatch_result(cfg: moe.MoEConfig) -> Callable:
    def test(outs: list[dict]) -> str | None:
        n = len(outs)
        want = moe.reference_moe(cfg, n)["y"]
        for r, o in enumerate(outs):
            if not torch.allclose(o["y"], want[r], atol=1e-5, rtol=1e-5):
                if not any(c["op"] != "barrier" for c in o["calls"]):
                    return ("no tokens left their rank: chunk j of the buffer holds the tokens for the "
                            "experts on rank j, so it must go to rank j")
                return (f"rank {r}'s tokens came back wrong: chunk j of the buffer must go to rank j, "
                        "and chunk i of what you return must be the one rank i sent you")
    return test


def _dispatch_bytes(outs: list[dict]) -> str | None:
    n = len(outs)
    for r, o in enumerate(outs):
        ops = {c["op"] for c in o["calls"]}
        handed = sum(c["bytes"] for c in o["calls"] if c["op"] == "all_to_all")  # inputs and outputs
        calls = len(o["shapes"])  # the layer's exchanges: dispatch and combine
        if "all_to_all" in ops and ops <= {"all_to_all"} and handed <= 2 * o["buffer_bytes"] * calls + 8:
            continue  # a buffer in and one out per exchange (a reviewer's buffer repeated N times was not)
        sent = sum(c["bytes"] for c in o["calls"] if c["op"] == "send")
        if ops and ops <= {"send", "recv"} and sent <= 2 * (n - 1) / n * o["buffer_bytes"] + 8:
            continue  # built from point-to-point messages: each chunk to its own rank only
        return (f"rank {r} ran {summary(o['calls'])}: an all-to-all sends each rank only its own chunk, "
                f"(N−1)/N of the buffer; this sends more (an all-gather or a broadcast hands every rank "
                "everything)")


def check_dispatch(fn) -> Verdict:
    if not callable(fn):
        return Verdict(False, "submit your function exchange(buf)")
    cases = []
    for n in (2, 4):
        cfg = moe.MoEConfig(capacity_factor=1.25).check(n)
        cases.append(on_ranks(f"{n} ranks, {cfg.experts} experts", n, dispatch_job, fn, cfg, timeout_s=15))
    return judge(cases, [
        Property(WAITED, _waited),
        Property("the exchange returns the buffer's shape", _dispatch_shape),
        Property("every token comes back from its expert as in one process", _dispatch_result(moe.MoEConfig(
            capacity_factor=1.25))),
        Property("each rank sends only the chunks meant for others", _dispatch_bytes)],
        done="Two all-to-alls per MoE layer forward, two backward.")


def exchange(buf):
    """The answer: chunk j of dim 0 to rank j, chunk i of the result from rank i."""
    out = torch.empty_like(buf)
    dist.all_to_all_single(out, buf)
    return out


def exercises() -> dict[str, Exercise]:
    return {
        "g": Exercise(
            key="g", title="write g as an autograd Function, on real ranks",
            prompt="Write <code>class MyG(torch.autograd.Function)</code> with <code>forward(ctx, x)</code> "
                   "and <code>backward(ctx, grad)</code>: the operator that ends a row-parallel layer. Each "
                   "rank passes its partial product x_r·W_rᵀ; every rank must get the layer's whole output, "
                   "and the right gradients. The check runs it on 2 and 4 ranks against the whole layer.",
            check=check_g,
            hint="What is the gradient of a sum with respect to each term? Every rank already has the "
                 "gradient of g's output.",
            solution=solution_text(ReduceFromRegion).replace("class ReduceFromRegion", "class MyG", 1),
            reference=lambda: ReduceFromRegion, also=(ReduceFromTensorRegion, g)),
        "dispatch": Exercise(
            key="dispatch", title="write the all-to-all that carries tokens to their experts",
            prompt="Write <code>exchange(buf)</code>, run on every rank: <code>buf</code> is "
                   "<code>[experts, capacity, d]</code>, its dim 0 cut into N equal chunks, chunk j holding "
                   "the tokens for the experts on rank j. Return a tensor of the same shape whose chunk i "
                   "is the chunk rank i sent you. The check runs a whole MoE layer with it on 2 and 4 ranks.",
            check=check_dispatch,
            hint="dist.all_to_all_single(output, input) does exactly this with equal splits.",
            solution=solution_text(exchange), reference=lambda: exchange,
            also=(moe.AllToAll, moe._all_to_all)),
        "merge": merge_exercise(),
        "plan": plan_exercise(),
        "layout": layout_exercise(),
    }
