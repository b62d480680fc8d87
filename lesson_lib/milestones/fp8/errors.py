"""Chapter 9 §2's measurements: one matmul with outliers under each scaling recipe against fp32,
and what no scaling at all does to activations and to gradients (overflow, underflow)."""

from __future__ import annotations

import torch

from .formats import E4M3, E5M2
from .scaling import DelayedScaling, blockwise_mm, quantize, quantize_rows, saturating_cast, scaled_mm

RECIPES = ("no scaling", "per tensor", "delayed (history 16)", "row-wise", "block-wise (1×128, 128×128)")


def outlier_case(seed: int = 0, m: int = 128, k: int = 256, n: int = 128, outlier: float = 200.0) -> dict:
    """Activations a [m, k] ~ N(0, 1) with one entry in a thousand ×``outlier`` (LLM activations carry
    such outliers, Dettmers et al., 2022), weights w [n, k] ~ N(0, 0.02²) (GPT-2's initialisation), and
    the activations of 16 earlier steps without outliers (for delayed scaling's history)."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g)
    spikes = torch.rand(m, k, generator=g) < 1e-3
    a = torch.where(spikes, a.sign() * outlier, a)
    w = 0.02 * torch.randn(n, k, generator=g)
    history = [torch.randn(m, k, generator=g) for _ in range(16)]
    return {"a": a, "w": w, "history": history, "seed": seed, "outliers": int(spikes.sum())}


def recipe_product(a: torch.Tensor, w: torch.Tensor, recipe: str, history=()) -> torch.Tensor:
    """a @ wᵀ with both operands in e4m3 under ``recipe`` (one of :data:`RECIPES`), via _scaled_mm."""
    one = torch.tensor(1.0)
    if recipe == "no scaling":
        return scaled_mm(saturating_cast(a, one), one, saturating_cast(w, one), one)
    if recipe == "per tensor":
        return scaled_mm(*quantize(a), *quantize(w))
    if recipe.startswith("delayed"):
        scaler = DelayedScaling(history=16)
        for past in history:
            scaler.quantize(past)
        return scaled_mm(*scaler.quantize(a), *quantize(w))  # weights: current (TE keeps one per tensor)
    if recipe == "row-wise":
        return scaled_mm(*quantize_rows(a), *quantize_rows(w))
    if recipe.startswith("block-wise"):
        return blockwise_mm(a, w, 128)
    raise ValueError(f"recipe must be one of {', '.join(RECIPES)}, got {recipe!r}")


def rel_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    """‖y − ref‖ / ‖ref‖ (Frobenius), in fp32."""
    return float((y.float() - ref).norm() / ref.norm())


def row_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    """The mean over rows (tokens) of ‖yᵢ − refᵢ‖ / ‖refᵢ‖: every token counts alike, so a few
    outlier rows cannot hide what happened to the others."""
    return float(((y.float() - ref).norm(dim=1) / ref.norm(dim=1)).mean())


def elementwise_error(x: torch.Tensor, fmt) -> float:
    """The mean of |x̂ − x| / |x| over x's non-zero values, x̂ its per-tensor scaled cast to ``fmt``:
    a value lost to underflow counts as 1."""
    x8, s = quantize(x, fmt)
    nz = x != 0
    return float(((x8.float() * s - x).abs()[nz] / x.abs()[nz]).mean())


def matmul_errors(case: dict) -> list[dict]:
    """Each recipe's relative error against the fp32 product; also bf16's for scale."""
    ref = case["a"] @ case["w"].t()
    rows = [{"recipe": r, "error": row_error(recipe_product(case["a"], case["w"], r, case["history"]), ref),
             "real_fp8": True} for r in RECIPES]
    bf16 = case["a"].bfloat16() @ case["w"].bfloat16().t()
    rows.append({"recipe": "bf16 (no FP8)", "error": row_error(bf16, ref), "real_fp8": False})
    return rows


def unscaled(x: torch.Tensor, fmt=E4M3) -> dict:
    """What a plain cast without a scale does: the share of values that saturate or overflow
    (|x| above the format's max) and that underflow to zero (x ≠ 0 but the cast 0), and the
    relative error of the tensor. torch's cast here saturates e4m3 at ±448 and sends e5m2 to inf."""
    top = torch.finfo(fmt).max
    back = x.to(fmt).float()
    return {"over": float((x.abs() > top).float().mean()), "inf": int(torch.isinf(back).sum()),
            "under": float(((back == 0) & (x != 0)).float().mean()),
            "error": rel_error(torch.nan_to_num(back, posinf=3e38, neginf=-3e38), x)}


def no_scaling_demo(seed: int = 0) -> list[dict]:
    """Activations with outliers (×200, beyond e4m3's 448 at ×1000) and gradients as an LLM's are
    (≈1e-6 per element: a mean over millions of tokens), cast with and without a per-tensor scale."""
    g = torch.Generator().manual_seed(seed)
    act = torch.randn(128, 256, generator=g)
    act[0, :8] = 1000.0
    grad = 1e-6 * torch.randn(128, 256, generator=g)
    rows = []
    for name, x, fmt in (("activations, e4m3", act, E4M3), ("gradients, e5m2", grad, E5M2),
                         ("gradients, e4m3", grad, E4M3)):
        plain = unscaled(x, fmt)
        x8, s = quantize(x, fmt)
        rows.append({"tensor": name, **plain, "scaled_error": rel_error(x8.float() * s, x)})
    return rows


def activation_like(seed: int = 0, shape=(128, 256)) -> torch.Tensor:
    """N(0, 1) with one value in a thousand ×50: about 9 binades from the bulk to the top."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    return torch.where(torch.rand(*shape, generator=g) < 1e-3, 50 * x, x)


def gradient_like(seed: int = 0, shape=(128, 256), binades: float = 24.0) -> torch.Tensor:
    """Magnitudes spread evenly over ``binades`` powers of two below 1e-3, random signs: a synthetic
    tensor built to span more than e4m3's range. Real gradients need not (chapter 9 §3 measures the
    MLP's own)."""
    g = torch.Generator().manual_seed(seed)
    mag = 1e-3 * 2.0 ** (-binades * torch.rand(*shape, generator=g))
    return torch.where(torch.rand(*shape, generator=g) < 0.5, -mag, mag)


def span_binades(x: torch.Tensor) -> float:
    """Powers of two from x's smallest non-zero magnitude to its largest."""
    nz = x[x != 0].abs()
    return float(torch.log2(nz.max() / nz.min())) if nz.numel() else 0.0


def format_errors(tensors: dict) -> list[dict]:
    """Each format's mean elementwise error (:func:`elementwise_error`, per-tensor scaled) on each
    named tensor, beside the tensor's span in binades."""
    return [{"tensor": name, "e4m3": elementwise_error(x, E4M3), "e5m2": elementwise_error(x, E5M2),
             "span": span_binades(x)} for name, x in tensors.items()]


def format_choice(seed: int = 0) -> list[dict]:
    """:func:`format_errors` on an activation-like tensor and on a tensor built to span 24 binades,
    more than e4m3's 17.8 (:func:`gradient_like`): where e5m2's range pays for its lost bit."""
    return format_errors({"activations": activation_like(seed), "24 binades": gradient_like(seed)})


def outlier_sweep(sizes=(1e1, 1e2, 1e3, 1e4, 1e5, 1e6), seed: int = 0) -> list[dict]:
    """Each fine-grained recipe's error as the outliers grow: per-tensor scaling holds until the
    outliers push the bulk of the values into e4m3's subnormals (below 2⁻⁶ of the scale)."""
    rows = []
    for size in sizes:
        case = outlier_case(seed, outlier=size)
        ref = case["a"] @ case["w"].t()
        for r in ("per tensor", "row-wise", RECIPES[-1]):
            rows.append({"outlier": size, "recipe": r,
                         "error": row_error(recipe_product(case["a"], case["w"], r), ref)})
    return rows
