"""FP8 at cluster scale (chapter 9 §5): the step's terms with the matmuls at the FP8 peak and, under
ZeRO-3/FSDP, the parameters gathered in FP8 (1 byte each instead of bf16's 2), on top of chapter 7's
:func:`~.planner.step_time`. The model states stay: fp32 master weights, fp32 gradients and Adam's
two fp32 moments, 16 bytes per parameter (torchao's float8 training keeps the module's fp32
parameters and casts them each step), against mixed precision's 2 + 2 + 12 (ZeRO, §3.1)."""

from __future__ import annotations

from dataclasses import replace

from .parallel import zero3_terms
from .plan import Plan
from .planner import step_time
from .terms import links

# bytes per parameter: (weights as computed, master weights, gradients, optimizer state)
STATE_BYTES = {"bf16 mixed precision (ZeRO §3.1)": {"compute copy": 2, "master": 4, "grads": 2, "adam": 8},
               "FP8, torchao float8 (fp32 module)": {"compute copy": 1, "master": 4, "grads": 4, "adam": 8}}


def fp8_step(plan: Plan) -> dict:
    """The step's terms in bf16 and in FP8 (compute at the FP8 peak; with ``zero=3`` the parameter
    gathers' bytes halved: each gather moves Ψ bytes instead of 2Ψ)."""
    bf16 = step_time(replace(plan, precision="bf16"))
    fp8 = dict(step_time(replace(plan.validate(), precision="fp8")))
    if plan.zero == 3:  # redo the data-parallel term with 1-byte parameters, 2-byte gradients
        net = links()[plan.link]
        layers = plan.shape()[0]
        psi = plan.params / (plan.pipeline * plan.tensor)
        d, m = plan.data_parallel, plan.microbatches
        lat_b, bw_b = zero3_terms(d, 2 * psi, 2 * psi, layers / plan.pipeline, m)
        lat_f, bw_f = zero3_terms(d, psi, 2 * psi, layers / plan.pipeline, m)
        fp8["bandwidth"] -= (bw_b - bw_f) * net["beta"] * (1 - min(plan.overlap, 1.0))
    terms = ("compute", "bubble", "bandwidth", "latency", "tensor", "context", "expert")
    for t in (bf16, fp8):
        t["step"] = sum(t[k] for k in terms)
        t["dominant"] = max(terms, key=t.get)
    return {"bf16": {k: bf16[k] for k in (*terms, "step", "dominant")},
            "fp8": {k: fp8[k] for k in (*terms, "step", "dominant")}}
