"""Chapter 5's LAMB exercise (notebooks/05_large_batch.ipynb): the learner's ``lamb_step`` for one
layer, three steps against ``lesson_lib.optim.LAMB``; a mistake it matches is named (You et al., 2020)."""

from __future__ import annotations

import math

import torch

from ..exercises import Property, Verdict, judge, locally
from ..optim import LAMB


def _reference_lamb(w, grads, lr, wd, betas=(0.9, 0.999), eps=1e-6):
    p = torch.nn.Parameter(w.clone())
    opt = LAMB([p], lr=lr, betas=betas, eps=eps, weight_decay=wd)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    return p.detach()


# shape, lr, weight decay, the gradients' scale: at 1e-3, v̂ ≈ 1e-6 is as small as ε, so where ε goes
# (√v̂ + ε or √(v̂ + ε)) moves w by ~3e-2 (relative); at 0.1 by at most 2e-4, LAMB_REL's order
LAMB_CASES = (((6, 5), 0.01, 0.0, 0.1), ((6, 5), 0.05, 0.1, 0.1), ((7,), 0.02, 0.01, 0.1),
              ((5, 4), 0.04, 0.01, 1e-3))
LAMB_REL = 1e-4  # right answers differ ~1e-8 (float32, 3 steps); each tested mistake ≥ 4e-3 in a case


def _lamb_run(fn, shape, lr, wd, scale) -> dict:
    g = torch.Generator().manual_seed(int(lr * 1000) + len(shape))
    w, grads = torch.randn(*shape, generator=g), [torch.randn(*shape, generator=g) * scale for _ in range(3)]
    mine, m, v, steps = w.clone(), torch.zeros_like(w), torch.zeros_like(w), []
    for t, grad in enumerate(grads, start=1):
        out = fn(mine.clone(), grad.clone(), m.clone(), v.clone(), t, lr, wd)
        if not isinstance(out, (tuple, list)) or len(out) != 3:
            return {"returned": out, "shape": shape}
        mine, m, v = (torch.as_tensor(x, dtype=w.dtype) for x in out)
        steps.append((mine, m, v))
    ref_w = _reference_lamb(w, grads, lr, wd)
    ref_m = sum(0.1 * 0.9 ** (2 - i) * x for i, x in enumerate(grads))
    ref_v = sum(0.001 * 0.999 ** (2 - i) * x * x for i, x in enumerate(grads))
    mistakes = {why: _lamb_mistake(w, grads, lr, wd, *how) for why, how in LAMB_MISTAKES.items()}
    return {"steps": steps, "shape": shape, "ref": (ref_w, ref_m, ref_v), "wd": wd, "mistakes": mistakes}


# The weights three steps of each known mistake reach: (bias correction's step offset, or None for
# none; weight decay inside u; ε inside the square root, added to v̂ or to v, or None). With no weight
# decay the ratio ‖w‖/‖u‖ cancels any scalar on r, so a bias-correction mistake shows only in the
# cases with decay, where it could pass for a decay mistake.
LAMB_MISTAKES = {
    "the bias correction uses the step after this one (1 − β^(t+1)): is t counted twice?": (1, True, None),
    "the bias correction is one step late (1 − β^(t−1) from step 2 on)": (-1, True, None),
    "r has no bias correction: divide m by 1 − β₁ᵗ and v by 1 − β₂ᵗ": (None, True, None),
    "λw is added after the ratio: it belongs inside u, before ‖u‖ is taken": (0, False, None),
    "ε is inside the square root, √(v̂ + ε): LAMB adds it after, √v̂ + ε (the two differ most where v̂ "
    "is as small as ε)": (0, True, "v̂"),
    "ε is inside the square root, added to v before the bias correction: LAMB adds it after the root, "
    "√v̂ + ε": (0, True, "v"),
}


def _lamb_mistake(w, grads, lr, wd, offset, decay_inside, eps_inside, b1=0.9, b2=0.999, eps=1e-6):
    m, v = torch.zeros_like(w), torch.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        k = max(t + (offset or 0), 1)  # one step late: step 1's correction (1 − β⁰) would divide by 0
        c1, c2 = (1.0, 1.0) if offset is None else (1 - b1**k, 1 - b2**k)
        root = {"v̂": (v / c2 + eps).sqrt(), "v": ((v + eps) / c2).sqrt()}.get(eps_inside)
        r = (m / c1) / (root if root is not None else (v / c2).sqrt() + eps)
        u = r + wd * w if decay_inside else r
        w = w - lr * w.norm() / u.norm() * u - (0 if decay_inside else lr * wd * w)
    return w


def _lamb_returns(o) -> str | None:
    if "steps" not in o:
        return f"it returned {type(o['returned']).__name__}, not the three tensors (w, m, v)"
    bad = [name for name, x in zip("wmv", o["steps"][-1]) if tuple(x.shape) != o["shape"]]
    return f"{', '.join(bad)} came back shaped differently from w {o['shape']}" if bad else None


def _rel(a, b) -> float:
    err = float((a - b).norm() / b.norm())
    return err if math.isfinite(err) else math.inf


def _lamb_moments(o) -> str | None:
    _, m, v = o["steps"][-1]
    _, ref_m, ref_v = o["ref"]
    bad = [(n, e) for n, e in (("m", _rel(m, ref_m)), ("v", _rel(v, ref_v))) if e > LAMB_REL]
    return None if not bad else ", ".join(f"your {n} differs by {e:.2g} (relative)" for n, e in bad) + \
        " after 3 steps: m ← β₁m + (1−β₁)g and v ← β₂v + (1−β₂)g², kept without bias correction"


def _lamb_weights(o) -> str | None:
    mine = o["steps"][-1][0]
    err = _rel(mine, o["ref"][0])
    if err <= LAMB_REL:
        return None
    hint = next((why for why, w in o["mistakes"].items() if _rel(mine, w) <= LAMB_REL),
                "check the bias correction of m and v in r, λw inside u, and the ratio ‖w‖/‖u‖")
    return f"after 3 steps your weights differ from LAMB's by {err:.2g} (relative) — {hint}"


def _check_lamb(fn) -> Verdict:
    """Three steps of the learner's ``lamb_step`` against lesson_lib.optim.LAMB, on three settings."""
    if not callable(fn):
        return Verdict(False, "submit your function, e.g. ex.submit(lamb_step)")
    cases = [locally(f"shape {shape}, lr = {lr}, weight_decay = {wd}"
                     + (f", gradients of about {scale:g}" if scale != 0.1 else ""), _lamb_run, fn, shape, lr,
                     wd, scale) for shape, lr, wd, scale in LAMB_CASES]
    return judge(cases, [
        Property("each step returns (w, m, v), shaped like w", _lamb_returns),
        Property("m and v are Adam's moments of g and g²", _lamb_moments),
        Property("w takes LAMB's step lr·‖w‖/‖u‖·u, u = Adam's bias-corrected ratio + wd·w (as "
                 "lesson_lib.optim.LAMB)", _lamb_weights)])


def lamb_step(w, g, m, v, t, lr, wd, b1=0.9, b2=0.999, eps=1e-6):
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    r = (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + eps)
    u = r + wd * w
    return w - lr * w.norm() / u.norm() * u, m, v
