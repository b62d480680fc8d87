"""Chapter 5's fair race at 32·B₀: every optimizer gets the same tuning budget.

Nado et al. (2021, "A Large Batch Optimizer Reality Check") and Shallue et al. (JMLR 2019) showed
that comparisons of large-batch optimizers turn on how much each was tuned. Here each optimizer
gets the same sweep: its base rate (tuned at B₀ = 64) times ½ and 1, grown to the large batch by
the linear and by the square-root rule (four rates), the same warm-up (a tenth of the steps) and
cosine decay, and the same weight decay (5·10⁻⁴ on the weight matrices: decoupled for Adam and
LAMB, L2 for SGD and LARS, as each is deployed). The best of each sweep is what we compare.

The runs are independent single-process trainings on the whole batch (what the data-parallel run
equals, chapter 0): each rank of a warm cluster takes every other one, so two run at once.
"""

from __future__ import annotations

import math

import torch

from ..runtime import context
from . import large_batch as lb

MULTIPLIERS = (0.5, 1.0)
RULES = ("sqrt", "linear")
WEIGHT_DECAY = 5e-4


def entries(optimizers=("sgd", "adam", "lars", "lamb"), batch: int = 2048, preset: str = "long",
            multipliers=MULTIPLIERS, rules=RULES, weight_decay: float = WEIGHT_DECAY) -> list[dict]:
    """One entry per (optimizer, base-rate multiplier, rule), its Config validated."""
    k = batch / lb.BASE_BATCH
    out = []
    for o in optimizers:
        if o not in lb.BASE_LR:
            raise ValueError(f"optimizer must be one of {', '.join(lb.BASE_LR)}, got {o!r}")
        for m in multipliers:
            for rule in rules:
                if rule not in RULES:
                    raise ValueError(f"rule must be one of {', '.join(RULES)}, got {rule!r}")
                lr = m * lb.BASE_LR[o] * (k if rule == "linear" else math.sqrt(k))
                cfg = lb.at_batch(o, batch, preset, lr=lr, weight_decay=weight_decay,
                                  eval_every=10 ** 6, world_size=1).validate()
                out.append({"optimizer": o, "multiplier": m, "rule": rule, "lr": lr, "cfg": cfg})
    return out


def race_job(todo: list[dict]) -> list[dict]:
    """On every rank: every other entry (this rank's share), trained in this process alone."""
    ctx = context()
    torch.manual_seed(0)
    rows = []
    for e in todo[ctx.rank::ctx.world_size]:
        out = lb.train(e["cfg"], 0, 1, ctx.device)  # world_size 1: no communication
        last = out["evals"][-1] if out["evals"] else None
        diverged = last is None or not math.isfinite(out["losses"][-1])
        rows.append({k: e[k] for k in ("optimizer", "multiplier", "rule", "lr")}
                    | {"eval_accuracy": 0.0 if diverged else last["eval_accuracy"],
                       "eval_loss": math.inf if diverged else last["eval_loss"], "diverged": diverged,
                       "steps": len(out["losses"])})
        ctx.emit("race", **rows[-1])  # one line per finished run (and no silence notice)
    return rows


def best(rows: list[dict]) -> dict[str, dict]:
    """Per optimizer, its best entry by held-out accuracy (then loss)."""
    out = {}
    for r in rows:
        b = out.get(r["optimizer"])
        if b is None or (r["eval_accuracy"], -r["eval_loss"]) > (b["eval_accuracy"], -b["eval_loss"]):
            out[r["optimizer"]] = r
    return out
