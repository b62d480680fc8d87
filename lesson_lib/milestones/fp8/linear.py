"""An FP8 linear layer (chapter 9 §3): forward operands in e4m3, the incoming gradient in e5m2,
every product through ``torch._scaled_mm``; the weights stay fp32 (the master copy the optimizer
updates), cast afresh each step, as torchao's ``Float8Linear`` does with its tensorwise recipe.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .formats import E4M3, E5M2
from .scaling import quantize, saturating_cast, scaled_mm

PRECISIONS = ("fp32", "bf16", "fp8", "fp8 unscaled")


def _cast(x: torch.Tensor, fmt, scaled: bool):
    if scaled:
        return quantize(x, fmt)
    one = torch.tensor(1.0)
    return saturating_cast(x, one, fmt), one


class FP8Matmul(torch.autograd.Function):
    """y = x @ wᵀ. Forward: x and w in e4m3. Backward: the gradient of y in e5m2, against the saved
    FP8 copies of w (for x's gradient) and of x (for w's)."""

    @staticmethod
    def forward(ctx, x, w, scaled: bool = True):
        x8, sx = _cast(x, E4M3, scaled)
        w8, sw = _cast(w, E4M3, scaled)
        ctx.save_for_backward(x8, sx, w8, sw)
        ctx.scaled = scaled
        return scaled_mm(x8, sx, w8, sw, out_dtype=torch.bfloat16).float()

    @staticmethod
    def backward(ctx, grad):
        x8, sx, w8, sw = ctx.saved_tensors
        g8, sg = _cast(grad, E5M2, ctx.scaled)
        grad_x = scaled_mm(g8, sg, w8.t().contiguous(), sw, out_dtype=torch.bfloat16).float()  # g @ w
        grad_w = scaled_mm(g8.t().contiguous(), sg, x8.t().contiguous(), sx,
                           out_dtype=torch.bfloat16).float()  # gᵀ @ x
        return grad_x, grad_w, None


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, precision: str) -> torch.Tensor:
    """One linear layer's product in ``precision`` (one of :data:`PRECISIONS`); fp32 in and out."""
    if precision == "fp32":
        y = x @ w.t()
    elif precision == "bf16":
        y = (x.bfloat16() @ w.bfloat16().t()).float()
    elif precision in ("fp8", "fp8 unscaled"):
        y = FP8Matmul.apply(x, w, precision == "fp8")
    else:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return y if b is None else y + b


class MLP(torch.nn.Module):
    """Three linear layers with GELU between them; fp32 parameters, products in ``precision``."""

    def __init__(self, sizes: tuple[int, ...], precision: str = "fp32"):
        super().__init__()
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        self.layers = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))
        self.precision = precision
        self.captured: dict | None = None
        """Set to a dict to keep each layer's output-gradient (the tensor FP8Matmul casts to e5m2) by
        layer index, in the next backward (chapter 9 §3 measures the formats on them)."""

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = linear(x, layer.weight, layer.bias, self.precision)
            if self.captured is not None and x.requires_grad:
                x.register_hook(lambda g, i=i: self.captured.__setitem__(i, g.detach().clone()))
            x = F.gelu(x) if i < len(self.layers) - 1 else x
        return x
