"""How far chapter 8's parallel results may sit from their single-process references: float32
rounding only (Higham's k·u bound for a dot product of length k, u = 2⁻²⁴), never one machine's run.
A real error (a missing all-reduce, a gradient t times too large) changes results by their own size.
"""

from __future__ import annotations

from ...numerics import FP32_UNIT_ROUNDOFF


def transformer_rel(cfg) -> float:
    """Relative gap allowed for logits and gradients of :class:`~.model.Transformer`: the forward
    chains 6 sums per block (q/k/v, scores, attention·v, o, fc1, fc2) and the head, each of length
    at most the widest dimension; the backward as many again."""
    width = max(cfg.d_model, cfg.ffn, cfg.seq, cfg.vocab)
    return 2 * (6 * cfg.layers + 1) * width * FP32_UNIT_ROUNDOFF


def transformer(cfg, ref: dict) -> dict[str, float]:
    """Absolute tolerances for the logits, the first gradients and the parameters after
    ``cfg.steps`` SGD steps (each step's update errs by at most ``rel`` of its size)."""
    rel = transformer_rel(cfg)
    grad_max = max(float(g.abs().max()) for g in ref["grads"].values())
    return {"rel": rel, "logits": rel * float(ref["logits"].abs().max()), "grads": rel * grad_max,
            "params": cfg.steps * rel * cfg.lr * grad_max * 4}  # later gradients may grow: 4× the first


def moe(cfg, ref: dict) -> dict[str, float]:
    """The MoE layer: two sums of length d or ffn per expert, the same again backward."""
    rel = 4 * max(cfg.d_model, cfg.ffn) * FP32_UNIT_ROUNDOFF
    return {k: rel * float(ref[k].abs().max()) for k in ("y", "x_grad", "w1_grad", "w2_grad", "router_grad")}


def attention(seq: int, dim: int, ref) -> float:
    """Ring attention against one softmax: scores are dot products of length ``dim``, each output a
    sum over ``seq`` keys, rescaled once per block."""
    return 4 * (seq + dim) * FP32_UNIT_ROUNDOFF * float(ref.abs().max())
