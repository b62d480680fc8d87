"""Chapter 8's online-softmax exercise (notebooks/08_beyond_data_parallel.ipynb, §4): the learner's
``merge`` of two partial attention results over disjoint key blocks, folded into a real ring-attention
pass on 2 and 4 ranks in place of :func:`~.ring_attention.block_update`'s rescaling, and judged
against one ``torch.softmax`` over all the keys.

Two forms are read (:mod:`.ch08_merge_form`): the state ``ring_attention`` keeps, running maximum,
sum and unnormalised output, ``merge(m_a, l_a, o_a, m_b, l_b, o_b) → (m, l, o)``; or the log-sum-exp
form ``merge(out_a, lse_a, out_b, lse_b) → (out, lse)`` with ``out`` normalised.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ..exercises import Exercise, Property, Verdict, judge, on_ranks, solution_text
from ..milestones.context_parallel import ring_attention
from ..numerics import FP32_UNIT_ROUNDOFF
from .ch08_merge_form import FORMS, Bad, form_of, read_state

BATCH, HEADS, SEQ, DIM = 1, 2, 16, 8
SCALES = {"moderate": 1.0, "large": 60.0}  # × q: scores near ±1 … ±5, then near ±200 (e^89 overflows)


def merge_job(fn, seed: int) -> dict:
    """On every rank: ring attention (no mask) with each arriving block's partial result merged into
    the running state by the learner's ``fn``, at both :data:`SCALES`; the output and m + log l."""
    r, c = dist.get_rank(), dist.get_world_size()
    names = form_of(fn)
    q, k, v = (t.chunk(c, dim=2)[r] for t in ring_attention.qkv(BATCH, HEADS, SEQ, DIM, seed))
    found = {"seed": seed}
    for label, scale in SCALES.items():
        last: list = []

        def update(q, k, v, m, denom, o, mask=None, last=last):
            empty = (torch.full_like(m, -math.inf), torch.zeros_like(denom), torch.zeros_like(o))
            part = ring_attention.block_update(q, k, v, *empty)  # this block alone: (m_b, l_b, o_b)
            if torch.isneginf(m).all():
                state = part  # the first block: nothing to merge into yet
            elif names == ("m", "l", "o"):
                state = read_state(fn(m, denom, o, *part), names, (m.shape, denom.shape, o.shape), q.dtype)
            else:
                got = fn(o / denom, m + torch.log(denom), part[2] / part[1], part[0] + torch.log(part[1]))
                out, lse = read_state(got, names, (o.shape, m.shape), q.dtype)
                state = (lse, torch.ones_like(lse), out)  # out = o / l with l = 1
            last[:] = state
            return state

        try:
            out = ring_attention.ring_attention(q * scale, k, v, causal=False, update=update)
        except Bad as e:
            return {"error": str(e)}
        found[label] = {"out": out.detach().clone(), "lse": (last[0] + torch.log(last[1])).detach().clone()}
    return found


# --------------------------------------------------------------------------- the judge's side


def _whole(seed: int, scale: float) -> dict:
    """One softmax over every key, with torch's own softmax and logsumexp (no library code)."""
    q, k, v = ring_attention.qkv(BATCH, HEADS, SEQ, DIM, seed)
    s = (q * scale) @ k.transpose(-1, -2) / math.sqrt(DIM)
    return {"s": s, "v": v, "out": torch.softmax(s, -1) @ v, "lse": torch.logsumexp(s, -1, keepdim=True)}


def _tolerance(ref: dict) -> tuple[float, float]:
    """Scores of size |s| carry |s|·u of rounding into each exp; sums of SEQ terms, dot products of DIM."""
    big = max(1.0, float(ref["s"].abs().max()))
    rel = 4 * (SEQ + DIM) * FP32_UNIT_ROUNDOFF * big
    return rel * float(ref["out"].abs().max()), rel


def _mistakes(ref: dict, c: int, r: int) -> dict[str, torch.Tensor]:
    """What rank r's output would be after each mistake, the blocks arriving r, r − 1, … as on the ring."""
    rows = slice(r * SEQ // c, (r + 1) * SEQ // c)
    order = [(r - step) % c for step in range(c)]
    keys = [slice(j * SEQ // c, (j + 1) * SEQ // c) for j in order]
    blocks = [(ref["s"][..., rows, cols], ref["v"][..., cols, :]) for cols in keys]
    avg = None
    for s, v in blocks:
        out = torch.softmax(s, -1) @ v
        avg = out if avg is None else (avg + out) / 2
    p = [torch.exp(s - s.amax(-1, keepdim=True)) for s, _ in blocks]  # each block against its own max
    unscaled = sum(pj @ v for pj, (_, v) in zip(p, blocks)) / sum(pj.sum(-1, keepdim=True) for pj in p)
    return {"average": avg, "unscaled": unscaled}


def _diagnose(o: dict, ref: dict, r: int, c: int, lse_form: bool) -> str:
    rows = slice(r * SEQ // c, (r + 1) * SEQ // c)
    want = ref["out"][..., rows, :]
    tol, _ = _tolerance(ref)
    wrong = _mistakes(ref, c, r)
    if torch.allclose(o["out"], wrong["average"], atol=tol, rtol=0):
        return (f"rank {r}'s output is the plain average of the blocks' outputs: weight each part by its "
                "share "
                "of the softmax's denominator, l_a·e^(m_a−m) against l_b·e^(m_b−m), not ½ against ½")
    if torch.allclose(o["out"], wrong["unscaled"], atol=tol, rtol=0):
        return (f"rank {r}'s output adds sums and outputs measured against different maxima: forgot to "
                "rescale by exp(m_old − m_new). Each part's l and o were computed as exp(s − m_a) or exp(s − "
                "m_b); multiply each by exp(its m − m), with m = max(m_a, m_b), before adding")
    factor = (o["out"] * want).sum(-1) / (want * want).sum(-1).clamp_min(1e-30)
    scaled = torch.allclose(o["out"], factor[..., None] * want, atol=tol, rtol=0)
    if scaled and (factor - 1).abs().max() > 1e-3:
        norm = ("the weights exp(lse_a − lse) and exp(lse_b − lse), with lse = log(e^lse_a + e^lse_b), "
                "add up "
                "to 1" if lse_form else "the merged sum l = l_a·e^(m_a−m) + l_b·e^(m_b−m) is what the output "
                "is divided by, once, at the end (o / l)")
        return (f"rank {r}'s output is the right one times a factor per query (up to "
                f"{float(factor.max()):.3g}): "
                "the two parts' weights do not add up to 1 (unnormalised sums added, or a sum not "
                f"rescaled); {norm}")
    gap = float((o["out"] - want).abs().max())
    return f"rank {r}'s output differs from one softmax over all keys by {gap:.2g} (allowed {tol:.1g})"


def _state_ok(outs: list[dict]) -> str | None:
    return next((f"rank {r}: {o['error']}" for r, o in enumerate(outs) if "error" in o), None)


def _output(label: str, fn, lse_form: bool):
    def test(outs: list[dict]) -> str | None:
        c = len(outs)
        ref = _whole(outs[0]["seed"], SCALES[label])
        tol, _ = _tolerance(ref)
        for r, o in enumerate(outs):
            got = o[label]
            if label == "large" and not all(bool(torch.isfinite(got[k]).all()) for k in ("out", "lse")):
                return _overflow(fn, lse_form, ref, r, c)
            mine = ref["out"][..., r * SEQ // c:(r + 1) * SEQ // c, :]
            if not torch.allclose(got["out"], mine, atol=tol, rtol=0):
                said = _diagnose(got, ref, r, c, lse_form)
                if said.endswith(")") and "differs" in said and _equal_maxima(fn, lse_form):
                    said += (": your merge is right when both blocks have the same maximum and wrong when "
                             "they "
                             "differ — rescale each part by exp(its max − the new max), both of them")
                if label == "large":
                    return "with scores near ±200, " + said
                return said
            if label == "large":
                problem = _lse(label)(outs)
                if problem:
                    return problem
    return test


def _overflow(fn, lse_form: bool, ref: dict, r: int, c: int) -> str:
    """Why rank r's state went inf or nan at large scores, from what ``fn`` does when asked again here:
    given two equal large maxima (it exponentiates the maxima themselves), or two far apart (it
    rescales by exp(larger − smaller): the smaller maximum subtracted)."""
    smax = float(ref["s"].abs().max())
    rows = ref["s"][..., r * SEQ // c:(r + 1) * SEQ // c, :]
    blocks = rows.reshape(*rows.shape[:-1], c, SEQ // c).amax(-1)  # each key block's maximum, per query
    gap = float((blocks.amax(-1) - blocks.amin(-1)).max())
    what, sub = ("log-sum-exps", "exp(lse_a − lse) and exp(lse_b − lse)") if lse_form \
        else ("maxima", "exp(m_a − m) and exp(m_b − m)")
    head = f"rank {r}'s state holds inf or nan with scores up to {smax:.0f}: "
    tail = (f"Subtract the larger of the two {what} before exponentiating, so that {sub} are at most 1"
            + (" (torch.logaddexp does it for you)" if lse_form else ""))
    if not _finite(fn, lse_form, smax, smax):
        return (head + f"your merge exponentiates the {what} themselves, and exp({smax:.0f}) overflows "
                f"float32 (its largest value is about e^88.7). " + tail)
    if not (_finite(fn, lse_form, 0.0, smax) and _finite(fn, lse_form, smax, 0.0)):
        return (head + f"your merge is finite when the two {what} are equal and not when they are far "
                f"apart (here up to {gap:.0f}): it rescales by exp(larger − smaller), the smaller one "
                f"subtracted, and exp({gap:.0f}) overflows float32 (its largest value is about e^88.7). "
                + tail)
    return (head + "something in your merge overflows float32 (its largest value is about e^88.7). "
            + tail)


def _finite(fn, lse_form: bool, a: float, b: float) -> bool:
    """Whether ``fn`` merges two parts of maxima (or log-sum-exps) ``a`` and ``b`` into finite numbers."""
    m_a, m_b, denom, o = torch.full((2, 1), a), torch.full((2, 1), b), torch.ones(2, 1), torch.ones(2, 3)
    try:
        got = fn(o, m_a, o.clone(), m_b) if lse_form else fn(m_a, denom, o, m_b, denom.clone(), o.clone())
        parts = got.values() if isinstance(got, dict) else got
        return all(bool(torch.isfinite(t).all()) for t in parts)
    except Exception:  # the learner's code: a merge that raises here is judged on the ranks, not here
        return True


def _lse(label: str):
    def test(outs: list[dict]) -> str | None:
        c = len(outs)
        ref = _whole(outs[0]["seed"], SCALES[label])
        _, rel = _tolerance(ref)
        for r, o in enumerate(outs):
            want = ref["lse"][..., r * SEQ // c:(r + 1) * SEQ // c, :]
            if not torch.allclose(o[label]["lse"], want, atol=rel * float(want.abs().max()), rtol=0):
                return (f"rank {r}'s merged log-sum-exp (m + log l) differs from log Σ e^s over all the keys "
                        f"by {float((o[label]['lse'] - want).abs().max()):.3g}: the next merge weighs this "
                        "state by it (and the backward needs it)")
    return test


def _equal_maxima(fn, lse_form: bool) -> bool:
    """Whether ``fn`` merges right when both parts share their maximum (no rescaling needed)."""
    g = torch.Generator().manual_seed(5)
    m = torch.zeros(3, 1)
    la, lb = 1 + torch.rand(3, 1, generator=g), 1 + torch.rand(3, 1, generator=g)
    oa, ob = torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)
    want = (oa + ob) / (la + lb)
    try:
        if lse_form:
            out = fn(oa / la, torch.log(la), ob / lb, torch.log(lb))[0]
        else:
            _, denom, o = fn(m, la, oa, m.clone(), lb, ob)
            out = o / denom
        return bool(torch.allclose(out, want, atol=1e-5))
    except Exception:
        return False


def check_merge(fn) -> Verdict:
    if not callable(fn):
        return Verdict(False, "submit your function merge(m_a, l_a, o_a, m_b, l_b, o_b)")
    lse_form = form_of(fn) == FORMS[4]
    cases = [on_ranks(f"{n} ranks", n, merge_job, fn, seed, timeout_s=15) for n, seed in ((2, 1), (4, 2))]
    return judge(cases, [
        Property("merge returns the merged state", _state_ok),
        Property("every rank's output is one softmax over all the keys", _output("moderate", fn, lse_form)),
        Property("the merged state's log-sum-exp is all the keys'", _lse("moderate")),
        Property("with scores near ±200 it stays finite and right", _output("large", fn, lse_form))],
        done="This is FlashAttention's inner loop too, over blocks of keys in one GPU's fast memory.")


def merge(m_a, l_a, o_a, m_b, l_b, o_b):
    """The answer, in ``block_update``'s state: running max m, sum l, unnormalised output o."""
    m = torch.maximum(m_a, m_b)  # the new maximum
    a, b = torch.exp(m_a - m), torch.exp(m_b - m)  # each part's rescaling, at most 1: no overflow
    return m, l_a * a + l_b * b, o_a * a + o_b * b


def merge_exercise() -> Exercise:
    return Exercise(
        key="merge", title="merge two partial softmaxes (ring attention's online softmax)",
        prompt="Write <code>merge(m_a, l_a, o_a, m_b, l_b, o_b)</code>: the partial results of one query "
               "block over two disjoint key blocks A and B, each as <code>block_update</code> keeps it (m "
               "the "
               "maximum score, l = Σ exp(s − m), o = Σ exp(s − m)·v, per query), merged into the state for "
               "A ∪ B, returned as <code>(m, l, o)</code>. (The log-sum-exp form <code>merge(out_a, lse_a, "
               "out_b, lse_b) → (out, lse)</code> is read too.) The check folds your merge into ring "
               "attention on 2 and 4 ranks, once with scores near ±200, and compares with one "
               "<code>torch.softmax</code> over all the keys.",
        check=check_merge,
        hint="Over A ∪ B the maximum is m = max(m_a, m_b). A's terms were measured against m_a: "
             "exp(s − m) = exp(s − m_a)·exp(m_a − m). Rescale each part's l and o by that factor, then add.",
        solution=solution_text(merge), reference=lambda: merge)


__all__ = ["check_merge", "merge", "merge_exercise", "merge_job"]
