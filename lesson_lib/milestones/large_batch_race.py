"""Chapter 5's fair race at 32·B₀: every optimizer gets the same tuning budget (after Nado et al.,
2021; Shallue et al., 2019).

Each optimizer sweeps four rates (base × ½ and 1, linear and square-root rule) with the same
warm-up, cosine decay and weight decay; the best of each is compared. Runs are independent
single-process trainings, two at once on a warm cluster.
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
        rows.append(result_row(e, diverged, None if diverged else last, len(out["losses"])))
        ctx.emit("race", **rows[-1])  # one line per finished run (and no silence notice)
    return rows


def result_row(entry: dict, diverged: bool, last_eval: dict | None, steps: int) -> dict:
    """One line of the race: the entry, its held-out accuracy and loss (0 and ∞ when it diverged)."""
    return {k: entry[k] for k in ("optimizer", "multiplier", "rule", "lr")} | {
        "eval_accuracy": 0.0 if diverged else last_eval["eval_accuracy"], "diverged": diverged,
        "eval_loss": math.inf if diverged else last_eval["eval_loss"], "steps": steps}


def best(rows: list[dict]) -> dict[str, dict]:
    """Per optimizer, its best entry by held-out accuracy (then loss)."""
    out = {}
    for r in rows:
        b = out.get(r["optimizer"])
        if b is None or (r["eval_accuracy"], -r["eval_loss"]) > (b["eval_accuracy"], -b["eval_loss"]):
            out[r["optimizer"]] = r
    return out
