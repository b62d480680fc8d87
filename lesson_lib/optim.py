"""LARS and LAMB (chapter 5), as ordinary ``torch.optim.Optimizer`` subclasses.

* LARS — You, Gitman & Ginsburg, 2017, Alg. 1: λ = η·‖w‖ / (‖g‖ + β‖w‖ + ε),
  v ← m·v + γ·λ·(g + βw), w ← w − v.
* LAMB — You et al., ICLR 2020, Alg. 2: Adam's moments with bias correction, r = m̂ / (√v̂ + ε),
  u = r + λw, w ← w − γ · φ(‖w‖)/‖u‖ · u.

A param group with ``adapt=False`` skips the trust ratio (:func:`param_groups`); ``trust_clip``
caps it; LAMB's ``bias_correction=False`` and ``phi_clamp`` give torch-optimizer's variant.
``last_stats`` holds (‖w‖, ‖update‖, ratio) per parameter after each step. Under ZeRO, ``norm`` is
replaced by one that all-reduces partial sums of squares.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

import torch


def _norm(t: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(t)


def param_groups(model: torch.nn.Module, weight_decay: float = 0.0, adapt_biases: bool = False) -> list[dict]:
    """Two groups: weights (adapted, decayed) and 1-D biases/normalization scales (not decayed).

    The recipes exclude 1-D parameters from the trust ratio (You et al., 2017) and from weight decay
    (Goyal et al., 2017); ``adapt_biases=True`` gives them a ratio of their own, which chapter 5's
    LARS needs (its global rate is far too large for a bias).
    """
    weights = [p for p in model.parameters() if p.ndim > 1]
    others = [p for p in model.parameters() if p.ndim <= 1]
    groups = [{"params": weights, "weight_decay": weight_decay, "adapt": True}]
    if others:
        groups.append({"params": others, "weight_decay": 0.0, "adapt": adapt_biases})
    return groups


def _check(name: str, value: float, low: float = 0.0, high: float | None = None,
           open_low: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if open_low else value >= low) and (high is None or value < high)
    if not ok:
        bound = f"in {'(' if open_low else '['}{low}, {high if high is not None else '∞'})"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")


class _LayerWise(torch.optim.Optimizer):
    """What LARS and LAMB share: argument checks, fp32 maths for bf16 params, per-layer stats."""

    def __init__(self, params, defaults: dict, norm: Callable[[torch.Tensor], torch.Tensor] | None,
                 record_stats: bool = True):
        _check("lr", defaults["lr"], open_low=True)
        _check("weight_decay", defaults["weight_decay"])
        if defaults.get("trust_clip") is not None:
            _check("trust_clip", defaults["trust_clip"], open_low=True)
        super().__init__(params, defaults)
        self.norm = norm or _norm
        self.record_stats = record_stats  # off under ZeRO: ‖update‖ would cost one more all-reduce
        self.last_stats: list[tuple[float, float, float]] = []

    def _ratio(self, w_norm: float, u_norm: float, group: dict) -> float:
        """φ(‖w‖)/‖u‖, with 1 where either norm is 0 (a fresh zero layer, or no gradient) or not a number."""
        if not group["adapt"] or not (w_norm > 0 and u_norm > 0):
            return 1.0
        ratio = w_norm / u_norm
        return ratio if group["trust_clip"] is None else min(ratio, group["trust_clip"])

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.last_stats = []
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
                w, g = p.detach().float(), p.grad.detach().float()
                update, w_norm, ratio = self._update(w, g, self.state[p], group)
                if p.dtype == torch.float32:
                    p.sub_(update)
                else:  # bf16 parameters: the update is computed in fp32
                    p.copy_(w - update)
                if self.record_stats:
                    self.last_stats.append((w_norm, float(self.norm(update)), ratio))
        return loss


class LARS(_LayerWise):
    """LARS (You, Gitman & Ginsburg, 2017, Algorithm 1). ``lr`` is γ, ``trust_coefficient`` η,
    ``weight_decay`` β; the momentum buffer sums γ·λ·(g + βw), as in the paper."""

    def __init__(self, params: Iterable, lr: float = 0.1, momentum: float = 0.9,
                 weight_decay: float = 0.0, trust_coefficient: float = 0.001, eps: float = 0.0,
                 trust_clip: float | None = None, norm=None, record_stats: bool = True):
        _check("momentum", momentum, high=1.0)
        _check("trust_coefficient", trust_coefficient, open_low=True)
        _check("eps", eps)
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                        trust_coefficient=trust_coefficient, eps=eps, trust_clip=trust_clip, adapt=True)
        super().__init__(params, defaults, norm, record_stats)

    def _update(self, w, g, state, group):
        beta, eta = group["weight_decay"], group["trust_coefficient"]
        w_norm, g_norm = float(self.norm(w)), float(self.norm(g))
        # λ = η‖w‖ / (‖g‖ + β‖w‖ + ε): the trust ratio; 1 for excluded groups and zero norms
        ratio = self._ratio(eta * w_norm, g_norm + beta * w_norm + group["eps"], group)
        step = g.add(w, alpha=beta).mul_(ratio * group["lr"])  # a new tensor: p.grad stays as is
        if group["momentum"]:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = torch.zeros_like(w)
            step = buf.mul_(group["momentum"]).add_(step)
        return step, w_norm, ratio


class LAMB(_LayerWise):
    """LAMB (You et al., ICLR 2020, Algorithm 2). ``phi_clamp=(lo, hi)``: φ(‖w‖) = clamp(‖w‖, lo, hi)
    (identity by default); ``bias_correction=False``: torch-optimizer's variant (tests/test_optim.py)."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0, trust_clip: float | None = None,
                 phi_clamp: tuple[float, float] | None = None, bias_correction: bool = True,
                 norm=None, record_stats: bool = True):
        for i, b in enumerate(betas):
            _check(f"betas[{i}]", b, high=1.0)
        _check("eps", eps)
        if phi_clamp is not None and not (0 <= phi_clamp[0] < phi_clamp[1]):
            raise ValueError(f"phi_clamp must be (low, high) with 0 <= low < high, got {phi_clamp!r}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        trust_clip=trust_clip, phi_clamp=phi_clamp, bias_correction=bias_correction,
                        adapt=True)
        super().__init__(params, defaults, norm, record_stats)

    def _update(self, w, g, state, group):
        (b1, b2), eps = group["betas"], group["eps"]
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(w)
            state["exp_avg_sq"] = torch.zeros_like(w)
        state["step"] += 1
        t, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
        m.mul_(b1).add_(g, alpha=1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        m_hat, v_hat = m, v
        if group["bias_correction"]:
            m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
        r = m_hat / v_hat.sqrt().add_(eps)
        u = r.add_(w, alpha=group["weight_decay"]) if group["weight_decay"] else r
        w_norm = float(self.norm(w))
        lo, hi = group["phi_clamp"] or (0.0, math.inf)
        phi = min(max(w_norm, lo), hi)  # φ: the identity, or a clamp
        ratio = self._ratio(phi, float(self.norm(u)), group)
        return u.mul_(ratio * group["lr"]), w_norm, ratio


OPTIMIZERS = ("sgd", "adam", "lars", "lamb")


def make(name: str, model: torch.nn.Module, lr: float, weight_decay: float = 0.0,
         momentum: float = 0.9, norm=None, adapt_biases: bool = False) -> torch.optim.Optimizer:
    """One of :data:`OPTIMIZERS` for ``model``; biases and norms are never decayed, and are left out
    of LARS/LAMB's adaptation unless ``adapt_biases`` (see :func:`param_groups`)."""
    if adapt_biases and name not in ("lars", "lamb"):
        raise ValueError(f"adapt_biases is for lars and lamb (layer-wise rates), not {name!r}")
    groups = param_groups(model, weight_decay, adapt_biases)
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=momentum)
    if name == "adam":
        return torch.optim.AdamW(groups, lr=lr)
    if name == "lars":
        return LARS(groups, lr=lr, momentum=momentum, norm=norm)
    if name == "lamb":
        return LAMB(groups, lr=lr, norm=norm)
    raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {name!r}")
