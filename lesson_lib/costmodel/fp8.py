"""FP8 at cluster scale (chapter 9 §5) on top of chapter 7's :func:`~.planner.step_time`.

Only the share of compute spent in the FP8 matmuls speeds up, by the datasheet's FP8/bf16 peak;
attention, norms, the embedding, the head and the casts stay as they were (Amdahl). That share is an
assumption the chapter prints. Under ZeRO-3/FSDP with tensorwise scaling the parameters are gathered
in FP8 (1 byte each instead of bf16's 2); with row-wise scaling they travel in bf16 (torchao gathers
FP8 only for tensorwise). Gradients are reduce-scattered in bf16 either way. The part of the
data-parallel traffic that overlap hides is recomputed as ``step_time`` does it: min(overlap,
compute / traffic) of it, with FP8's shorter compute and FP8's bytes.

The model states stay: fp32 master weights, fp32 gradients and Adam's two fp32 moments, 16 bytes per
parameter (torchao's float8 training keeps the module's fp32 parameters and casts them each step),
against mixed precision's 2 + 2 + 12 (ZeRO, §3.1)."""

from __future__ import annotations

from dataclasses import replace

from .alphabeta import allreduce_terms
from .parallel import moe_params_per_rank, zero3_terms
from .plan import FP8_PEAK_FLOPS, Plan
from .planner import hideable_share, last_bucket_s, step_time
from .terms import devices, links, ps_terms

# bytes per parameter: (weights as computed, master weights, gradients, optimizer state)
STATE_BYTES = {"bf16 mixed precision (ZeRO §3.1)": {"compute copy": 2, "master": 4, "grads": 2, "adam": 8},
               "FP8, torchao float8 (fp32 module)": {"compute copy": 1, "master": 4, "grads": 4, "adam": 8}}
TERMS = ("compute", "bubble", "bandwidth", "latency", "tensor", "context", "expert", "sync")
RECIPES = ("tensorwise", "rowwise")


def matmul_share_for(step_ratio: float, device: str = "h100-sxm") -> float:
    """The matmul share s at which a compute-only step's FP8/bf16 ratio, 1 − s·(1 − bf16/fp8 peak),
    equals ``step_ratio`` (a published measurement, e.g. 0.70): s = (1 − ratio) / (1 − bf16/fp8)."""
    gain = devices()[device]["peak_flops"] / FP8_PEAK_FLOPS[device]
    return (1 - step_ratio) / (1 - gain)


def _dp_messages(plan: Plan, param_bytes_each: float) -> tuple[float, float]:
    """(α count, bytes) of the data-parallel exchange, as ``step_time`` prices it, with parameters
    gathered at ``param_bytes_each`` bytes (ZeRO-3 only; the other stages move gradients alone)."""
    P, t, d = plan.pipeline, plan.tensor, plan.data_parallel
    psi = moe_params_per_rank(plan.params, plan.active, plan.experts, plan.top_k, P * t, plan.expert_parallel)
    grads = 2 * psi / plan.compression
    if plan.comm == "ps":
        return ps_terms(d, plan.servers, grads)
    if plan.zero == 3:
        return zero3_terms(d, param_bytes_each * psi, grads, plan.shape()[0] / P, plan.microbatches)
    return allreduce_terms("ring", d * plan.context, grads)


def fp8_step(plan: Plan, matmul_share: float = 1.0, recipe: str = "tensorwise") -> dict:
    """The step's terms in bf16 and in FP8: compute × (1 − s + s·bf16/fp8 peak) with s =
    ``matmul_share``; with ``zero=3`` and ``recipe="tensorwise"`` the parameter gathers move 1 byte per
    parameter instead of 2; the hidden part of the data-parallel traffic recomputed for both."""
    if not 0 <= matmul_share <= 1:
        raise ValueError(f"matmul_share must be between 0 and 1, got {matmul_share!r}")
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {', '.join(RECIPES)}, got {recipe!r}")
    plan = replace(plan, precision="bf16").validate()
    if plan.device not in FP8_PEAK_FLOPS:
        raise ValueError(f"device must have FP8 ({', '.join(FP8_PEAK_FLOPS)}), got {plan.device!r}")
    bf16 = step_time(plan)
    net = links()[plan.link]
    gain = devices()[plan.device]["peak_flops"] / FP8_PEAK_FLOPS[plan.device]  # 989 / 1979 on H100
    speed = 1 - matmul_share + matmul_share * gain
    fp8 = dict(bf16, **{k: bf16[k] * speed for k in ("compute", "bubble", "sync")})
    psi = moe_params_per_rank(plan.params, plan.active, plan.experts, plan.top_k, plan.pipeline * plan.tensor,
                              plan.expert_parallel)
    last = last_bucket_s(plan, 2 * psi / plan.compression, net) if plan.comm != "ps" else 0.0

    def exposed(compute: float, lat: float, nbytes: float) -> tuple[float, float, float]:
        dp_s = lat * net["alpha"] + nbytes * net["beta"]
        hidden = hideable_share(plan.overlap, compute, dp_s, last)  # step_time's rule
        return (1 - hidden) * lat * net["alpha"], (1 - hidden) * nbytes * net["beta"], hidden * dp_s

    lat_b, bytes_b = _dp_messages(plan, 2)
    lat_f, bytes_f = _dp_messages(plan, 1 if recipe == "tensorwise" else 2)
    old_lat, old_bw, _ = exposed(bf16["compute"], lat_b, bytes_b)
    new_lat, new_bw, hid = exposed(fp8["compute"], lat_f, bytes_f)
    fp8["latency"] = bf16["latency"] - old_lat + new_lat  # pipeline and offload messages unchanged
    fp8["bandwidth"] = bf16["bandwidth"] - old_bw + new_bw
    if plan.tp_overlap:  # tensor-parallel traffic hides in what compute has left
        raw = step_time(replace(plan, tp_overlap=0.0))["tensor"]
        fp8["tensor"] = raw - min(plan.tp_overlap * raw, max(fp8["compute"] - hid, 0.0))
    for t in (bf16, fp8):
        t["step"] = sum(t[k] for k in TERMS)
        t["dominant"] = max(TERMS, key=t.get)
    return {"bf16": {k: bf16[k] for k in (*TERMS, "step", "dominant")},
            "fp8": {k: fp8[k] for k in (*TERMS, "step", "dominant")},
            "assumptions": {"matmul_share": matmul_share, "recipe": recipe, "compute_factor": speed,
                            "overlap": plan.overlap, "link": plan.link, "intra_link": plan.intra_link}}
