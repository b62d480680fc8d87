"""Chapter 6's QSGD exercise (notebooks/06_compression.ipynb): the learner's quantizer, judged on
what its draws show — on the grid, within ±s levels, random, and unbiased (Alistarh et al., 2017)."""

from __future__ import annotations

import math

import torch

from ..exercises import Property, Verdict, judge, locally


def _qsgd_case():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(63, generator=g)
    return torch.cat([x, torch.zeros(1)])  # a zero must stay zero


def _values(out) -> torch.Tensor | None:
    """What the learner's function returned as a flat float tensor; ``None`` if it is no numbers
    (``None`` itself: a ``return`` forgotten) — the checker's conversion, never the learner's error."""
    try:
        return torch.as_tensor(out, dtype=torch.float32).reshape(-1)
    except (TypeError, ValueError, RuntimeError):
        return None


def _qsgd_draws(fn, x, s: int, draws: int) -> dict:
    torch.manual_seed(s)
    outs = []
    for _ in range(draws):
        out = fn(x.clone(), s)
        values = _values(out)
        if values is None:
            return {"shape": False, "x": x, "returned": type(out).__name__}
        outs.append(values)
        if values.numel() == x.numel() and tuple(torch.as_tensor(out).shape) != tuple(x.shape):
            return {"shape": False, "x": x, "as": tuple(torch.as_tensor(out).shape)}  # e.g. [1, 64]
    if any(o.numel() != x.numel() for o in outs):
        return {"shape": False, "x": x}
    return {"shape": True, "outs": torch.stack(outs), "x": x, "s": s, "norm": float(x.norm())}


def _qsgd_shaped(o) -> str | None:
    if "returned" in o:
        return f"it returned {o['returned']}, not a tensor: return the quantized x"
    if "as" in o:
        return (f"it returned shape {list(o['as'])}; x's is {list(o['x'].shape)}: return the quantized x "
                "in x's shape")
    if not o["shape"] or not torch.isfinite(o["outs"]).all():
        return f"it did not return {o['x'].numel()} finite values shaped like x"
    return None


def _qsgd_grid(o) -> str | None:
    levels = o["outs"] * o["s"] / o["norm"]
    if (levels - levels.round()).abs().max() > 1e-3:
        return "your values are not on it: scale by the vector's 2-norm and divide by s"
    return None


def _qsgd_levels(o) -> str | None:
    top = int((o["outs"] * o["s"] / o["norm"]).round().abs().max())
    return None if top <= o["s"] else f"you used level {top}"


def _qsgd_random(o) -> str | None:
    return None if o["outs"].std(0).max() > 0 else \
        "every draw is the same: QSGD rounds up or down AT RANDOM, or it is biased"


def _qsgd_independent(o) -> str | None:
    """Each element draws its own coin: across the draws, whether two elements rounded up is
    uncorrelated. One random number shared by every element rounds them up together (for fractions
    f_i < f_j, i up implies j up): unbiased element by element, but not QSGD's independent rounding."""
    scaled = o["x"].abs() * o["s"] / o["norm"]
    frac = scaled - scaled.floor()
    mixed = (frac > 0.2) & (frac < 0.8)  # elements whose rounding really is a coin
    if int(mixed.sum()) < 3:
        return None
    levels = (o["outs"].abs() * o["s"] / o["norm"]).round()
    up = (levels[:, mixed] > scaled.floor()[mixed]).float()
    up = up - up.mean(0)
    cov = up.t() @ up / len(up)
    sd = cov.diagonal().clamp_min(1e-12).sqrt()
    corr = cov / sd[:, None] / sd[None, :]
    off = corr[~torch.eye(len(corr), dtype=torch.bool)].abs().mean()
    # independent coins: each correlation has a standard error 1/√draws (0.02 at 3,000 draws)
    return None if off < 0.15 else (f"the elements round up together (mean correlation {float(off):.2f} "
                                    "between elements): draw one random number per element")


def _qsgd_unbiased(o) -> str | None:
    outs, x, s = o["outs"], o["x"], o["s"]
    # Each element is ‖x‖/s × (a level ± one Bernoulli step): variance ≤ ‖x‖²/(4s²), so the mean
    # of the draws has a standard error ≤ ‖x‖/(2s√draws); 6 of them miss a fair answer ~1e-7 of the time.
    bound = 6 * o["norm"] / (2 * s * math.sqrt(len(outs)))
    err = (outs.mean(0) - x).abs()
    if err.max() <= bound:
        return None
    i = int(err.argmax())
    return (f"over {len(outs)} draws element {i} averages {float(outs.mean(0)[i]):.3f} but x[{i}] = "
            f"{float(x[i]):.3f} — round up with probability equal to the fractional part")


def _check_qsgd(fn, draws: int = 3000) -> Verdict:
    if not callable(fn):
        return Verdict(False, "submit your function, e.g. ex.submit(qsgd)")
    x = _qsgd_case()
    verdict = judge([locally(f"s = {s}", _qsgd_draws, fn, x, s, draws) for s in (1, 4)], [
        Property("a tensor shaped like x", _qsgd_shaped),
        Property("every value on the grid ‖x‖·l/s, l an integer", _qsgd_grid),
        Property("levels from −s to s", _qsgd_levels),
        Property("rounding at random", _qsgd_random),
        Property("each element rounded by its own coin", _qsgd_independent),
        Property(f"unbiased: the mean of {draws} draws is x", _qsgd_unbiased)])
    if not verdict:
        return verdict
    try:
        out = fn(torch.zeros(16), 4)
    except Exception as e:  # the learner's code may raise here: that is the feedback
        return Verdict(False, f"on an all-zero vector your function raised {type(e).__name__}: {e}")
    zero = _values(out)
    if zero is None:
        return Verdict(False, f"on an all-zero vector your function returned {type(out).__name__}, not "
                              "a tensor: an all-zero vector (a layer whose gradient is zero) comes back as "
                              "zeros")
    if zero.numel() != 16 or not torch.equal(zero, torch.zeros(16)):
        return Verdict(False, "an all-zero vector (a layer whose gradient is zero) must come back as zeros, "
                              f"but yours gave {zero[:4].tolist()}…: ‖x‖ = 0, so guard the division by it")
    return verdict


def qsgd(x, s):
    norm = x.norm()
    if norm == 0:  # nothing to quantize (and 0/0 below)
        return torch.zeros_like(x)
    scaled = x.abs() / norm * s  # in [0, s]
    low = scaled.floor()
    level = low + (torch.rand_like(x) < scaled - low)  # up with probability = the fraction
    return norm * torch.sign(x) * level / s


