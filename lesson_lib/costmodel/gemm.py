"""The compute term from the GEMM shapes each device sees (chapter 7), in bf16 and in FP8.

A layer's matmuls on one device multiply an M × K activation by a K × N weight slice: M = b·s/c tokens
per micro-batch, K = h, N = h/t (Megatron's column and row layers; Shoeybi et al., 2019). Such a GEMM
does 2·M·K·N FLOPs on 2·(M·K + K·N + M·N) bytes of bf16 operands, so its arithmetic intensity is

    x = M·K·N / (M·K + K·N + M·N)      FLOPs per byte.

The compute term is the GEMMs at a share E of the peak plus the memory-bound work around them (norms,
activations, softmax, residuals, launches), whose bytes grow with the activations, as F/x: time =
F/(peak·E) · (1 + k·R/x) with R = peak / HBM bandwidth (the device's ridge point, FLOPs per byte).
So the share of peak the step reaches, the **efficiency**, is

    e(x) = E · x / (x + k·R),

rising with h/t, s and b as SC21 Table 1's MFU does (Narayanan et al., 2021). E and k are fitted once,
on SC21 Table 1 alone (:func:`.calibrate.fit_gemm_efficiency`), and stored in :data:`GEMM_FIT`. On
another device the same k moves the curve by that device's ridge point (an assumption, printed).

FP8 speeds up only the GEMMs it runs: the linear layers at the FP8 peak; attention's scores and
weighted sum stay bf16 (torchao's float8 training swaps ``nn.Linear`` modules for ``Float8Linear``, and
attention's core is no ``nn.Linear``), and so does the output head (torchtitan's Llama 3 configs leave it
out: ``filter_fqns = "output"``, models/llama3/train_configs/llama3_8b.toml); the memory-bound work
stays as it was; and the casts add HBM traffic (:func:`cast_bytes`).
"""

from __future__ import annotations

# (E, k) fitted once on SC21 Table 1 by calibrate.fit_gemm_efficiency; tests/test_published_runs.py
# refits them and fails if they moved. No held-out run was looked at to choose them.
GEMM_FIT = (0.728, 1.64)
# Bytes per element each FP8 cast moves under current (per-tensor) scaling: read the bf16 tensor for its
# amax (2), read it again and write the FP8 copy (2 + 1), write the transposed FP8 copy the other GEMM
# of the backward needs (1).
CAST_BYTES_PER_ELEMENT = 2 + 2 + 1 + 1


def gemm_intensity(tokens: float, hidden: int, tensor: int = 1) -> float:
    """x = M·K·N / (M·K + K·N + M·N) of the M = ``tokens`` × K = h by K × N = h/t GEMM (FLOPs per
    byte of bf16 operands)."""
    m, k, n = tokens, hidden, hidden / tensor
    if min(m, k, n) <= 0:
        raise ValueError(f"tokens, hidden and hidden/tensor must be positive, got {m!r}, {k!r}, {n!r}")
    return m * k * n / (m * k + k * n + m * n)


def gemm_efficiency(intensity: float, ridge: float, fit: tuple[float, float] = GEMM_FIT) -> float:
    """e(x) = E · x / (x + k·R): the share of peak at GEMM intensity x on a device whose peak over HBM
    bandwidth is R."""
    e_max, k = fit
    return e_max * intensity / (intensity + k * ridge)


def plan_intensity(plan) -> float:
    """A plan's GEMM intensity: b·s/c tokens per micro-batch, K = h, N = h/t."""
    _, hidden, _ = plan.shape()
    return gemm_intensity(plan.sequences_per_microbatch * plan.seq_len / plan.context, hidden, plan.tensor)


def ridge(device: dict) -> float:
    """The device's peak bf16 FLOP/s over its HBM bytes/s (data/devices.csv)."""
    return device["peak_flops"] / device["hbm_bytes_per_s"]


def plan_efficiency(plan, device: dict) -> float:
    """The plan's efficiency: its ``efficiency`` when that is a number (a constant, fixed by hand or
    :data:`~.terms.CALIBRATED_EFFICIENCY`), else e(x) at its GEMM shape on its device."""
    if plan.efficiency != "gemm":
        return plan.efficiency
    return gemm_efficiency(plan_intensity(plan), ridge(device))


def bf16_gemm_flops(plan, tokens: float) -> float:
    """Hardware FLOPs that stay bf16 GEMMs under FP8: attention's scores and weighted sum (12·L·h·s
    per token, plus its recomputation: 4·L·h·s under full, all 12 again under selective) and the
    output head (6·V·h per token; with V unknown, 0)."""
    layers, hidden, _ = plan.shape()
    core = 12 * layers * hidden * plan.seq_len if plan.attention_flops else 0.0
    again = {"full": 1 / 3, "selective": 1.0, "none": 0.0}[plan.recompute_policy]
    return tokens * (core * (1 + again) + 6 * plan.vocab * hidden)


def cast_bytes(plan, tokens: float) -> float:
    """HBM bytes one device moves casting to FP8 in one step. Per token and layer it quantises the four
    linear layers' inputs in the forward, 2·h + 5·h/t elements (QKV and FC1 see all h, the projection h/t
    and FC2 4·h/t), and their output gradients in the backward, 2·h + (5 + 2·a_kv/a)·h/t; the forward's
    again when it is recomputed; each element :data:`CAST_BYTES_PER_ELEMENT` bytes. The weights, once a
    step (Transformer Engine caches their FP8 copy over micro-batches: ``is_first_microbatch``)."""
    layers, hidden, heads = plan.shape()
    t, g = plan.tensor, (plan.kv_heads or heads) / heads
    forward = (2 * hidden + 5 * hidden / t) * (2 if plan.recompute_policy == "full" else 1)
    backward = 2 * hidden + (5 + 2 * g) * hidden / t
    mine = tokens / (plan.data_parallel * plan.context)  # the tokens this device's layers see
    weights = plan.active / (plan.pipeline * t)
    return CAST_BYTES_PER_ELEMENT * ((forward + backward) * mine * layers / plan.pipeline + weights)


def compute_terms(plan, device: dict, hardware_flops: float, fp8_peak: float | None) -> dict:
    """Seconds of the compute term, split: ``gemm`` (the GEMMs at E, or at the plan's own efficiency
    when that is higher), ``memory_bound`` (the rest of what e(x) or a fixed efficiency leaves), and
    under FP8 ``casts``; ``compute`` is their sum. bf16: F / (n·peak·e), exactly."""
    n, peak = plan.devices, device["peak_flops"]
    eff = plan_efficiency(plan, device)
    e_gemm = max(GEMM_FIT[0], eff)
    gemm = hardware_flops / (n * peak * e_gemm)
    memory_bound = hardware_flops / (n * peak) * (1 / eff - 1 / e_gemm)
    out = {"efficiency": eff, "gemm": gemm, "memory_bound": memory_bound, "casts": 0.0}
    if plan.precision == "fp8":
        tokens = plan.batch_tokens * plan.batch_scale
        kept = min(bf16_gemm_flops(plan, tokens), hardware_flops)
        out["gemm"] = ((hardware_flops - kept) / fp8_peak + kept / peak) / (n * e_gemm)
        out["casts"] = cast_bytes(plan, tokens) / device["hbm_bytes_per_s"]
    out["compute"] = out["gemm"] + out["memory_bound"] + out["casts"]
    return out
