"""Chapter 9's exercises (notebooks/09_fp8.ipynb), judged on real ranks at two world sizes: the
per-tensor scaled cast, a tensor's format chosen by its measured error (on each rank's own
gradients from the chapter's FP8 training), block-wise scaling. Each rank
tries its own tensors; the references are torch's own float8 casts and fp32 math written out.

Nothing here imports IPython: the ``*_job`` functions run inside the workers.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ..exercises import Exercise, Property, Verdict, judge, on_ranks, solution_text
from ..exercises.answers import fixed
from ..milestones.fp8 import scaling
from .ch09_formats import check_formats, choose_format

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
TOP = 448.0
FULL = TOP * (1 - 2**-4)  # e4m3's largest value, less its rounding there: the amax must land on 448


def _cases(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 128, generator=g)
    return {"outliers": torch.where(torch.rand(64, 128, generator=g) < 0.01, 300 * x, x),
            "zeros": torch.zeros(16, 16), "beyond e4m3": 2000 * x, "tiny": 1e-6 * x}


class _Wire:
    """A float8 tensor as bytes for the trip back from a rank (float8 storages do not pickle)."""

    def __init__(self, t: torch.Tensor):
        self.dtype = t.dtype
        self.data = t.detach().contiguous().view(torch.uint8) if t.dtype in (E4M3, E5M2) else t.detach()

    def get(self) -> torch.Tensor:
        return self.data.view(self.dtype) if self.dtype in (E4M3, E5M2) else self.data


def _pair(out):
    """On a rank: the learner's (x8, scale), ready to travel; None for anything else."""
    if not (isinstance(out, (tuple, list)) and len(out) == 2 and isinstance(out[0], torch.Tensor)):
        return None
    try:
        return _Wire(out[0]), torch.as_tensor(out[1]).detach().float()
    except (TypeError, ValueError, RuntimeError):
        return None


def _got(pair):
    return None if pair is None else (pair[0].get(), pair[1])


def cast_job(fn) -> dict:
    """On every rank: the learner's cast on its own tensors (seeded by rank)."""
    seed = 100 + dist.get_rank() + 10 * dist.get_world_size()
    return {name: (x, _pair(fn(x.clone()))) for name, x in _cases(seed).items()}


def _cast_form(outs):
    for r, o in enumerate(outs):
        for name, (x, pair) in o.items():
            got = _got(pair)
            if got is None:
                return f"rank {r}, {name}: return a pair (x8, scale)"
            if got[0].dtype != E4M3:
                if got[0].numel() == 1 and got[1].shape == x.shape:
                    return f"rank {r}, {name}: the pair is in the wrong order: return (x8, scale), x8 first"
                return f"rank {r}, {name}: x8 is {got[0].dtype}, not torch.float8_e4m3fn"
            if got[0].shape != x.shape or got[1].numel() != 1:
                return f"rank {r}, {name}: x8 must keep x's shape and the scale be one number"


def _cast_values(outs):
    for r, o in enumerate(outs):
        for name, (x, pair) in o.items():
            x8, s = _got(pair)
            back = x8.float()
            if not torch.isfinite(back).all() or not torch.isfinite(s) or s <= 0:
                return (f"rank {r}, {name}: NaN or inf came out (a zero tensor needs a scale of 1, "
                        "not amax / 448 = 0; values beyond 448 must be clamped)")
            amax = float(x.abs().max())
            if amax == 0:
                continue
            if float(s) == 1.0 and not FULL <= amax <= TOP:
                return (f"rank {r}, {name}: the scale is 1, so x was cast unscaled (its amax is {amax:.3g}): "
                        "the scale must map the amax to 448 (scale = amax / 448; divide x by it)")
            if float(back.abs().max()) < FULL:
                return (f"rank {r}, {name}: the largest value became {fixed(float(back.abs().max()), 4)}, "
                        "below e4m3's 448: the scale must map the amax to 448 (scale = amax / 448; divide "
                        "x by it)")
            if amax / float(s) > TOP * (1 + 2**-5):  # beyond what rounds to 448: clipped
                return (f"rank {r}, {name}: the scale maps the amax to {fixed(amax / float(s), 4)}, beyond "
                        "e4m3's 448, so the largest values were clipped, not rounded: scale = amax / 448")
            want = (x / (amax / TOP)).clamp(-TOP, TOP).to(E4M3).float() * (amax / TOP)  # torch's own cast
            if not torch.allclose(back * s, want, rtol=0.07, atol=amax * 2**-9 / TOP * 2):
                return (f"rank {r}, {name}: x8 · scale is not x (largest gap "
                        f"{float((back * s - x).abs().max()):.3g}): divide by the scale before the cast, "
                        "multiply after")


def check_cast(fn) -> Verdict:
    if not callable(fn):
        return Verdict(False, "submit your function fp8_cast(x) returning (x8, scale)")
    return judge(
        [on_ranks(f"{n} ranks", n, cast_job, fn, timeout_s=30) for n in (2, 4)],
        [Property("returns (x8 in e4m3, one scale)", _cast_form),
         Property("x8 · scale recovers x, using e4m3's whole range, with no NaN or inf", _cast_values)],
        done="This is the per-tensor current scaling of torchao's tensorwise recipe.",
    )


def fp8_cast(x):
    """The answer: scale from the amax, saturate, cast."""
    amax = x.abs().max().float()
    scale = amax / 448 if amax > 0 else torch.tensor(1.0)
    x8 = (x / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    return x8, scale


# --------------------------------------------------------------------------- blocks


def blocks_job(fn) -> dict:
    """On every rank: a 256×256 weight whose four 128×128 blocks differ in size by 10⁴, blocked by
    the learner."""
    g = torch.Generator().manual_seed(dist.get_rank() + 10 * dist.get_world_size())
    w = 0.02 * torch.randn(256, 256, generator=g)
    w[:128, 128:] *= 1e-4
    w[128:, :128] *= 100
    return {"w": w, "out": _pair(fn(w.clone()))}


def _blocks_form(outs):
    for r, o in enumerate(outs):
        if o["out"] is None:
            return f"rank {r}: return a pair (w8, scales)"
        w8, s = _got(o["out"])
        if w8.dtype != E4M3 or w8.shape != o["w"].shape:
            return (
                f"rank {r}: w8 must be float8_e4m3fn of the weight's shape, got {w8.dtype} {tuple(w8.shape)}"
            )
        if s.numel() == 1 or len(set(s.flatten().tolist())) == 1:
            return (
                f"rank {r}: one scale for the whole weight: that is per-tensor scaling; give each "
                "128×128 block its own scale (scales of shape [2, 2])"
            )
        if tuple(s.shape) != (2, 2):
            return f"rank {r}: scales have shape {tuple(s.shape)}; one per 128×128 block is [2, 2]"


def _close(b8, scale, blk, amax) -> bool:
    return torch.allclose(b8.float() * scale, blk, rtol=0.07, atol=amax * 2**-8)


def _edge(w8, s, w) -> str:
    """A hint when every wrong element lies in a row or column at a block's edge (an off-by-one slice)."""
    def spread(t):  # one value per block → one per element
        return t.repeat_interleave(128, 0).repeat_interleave(128, 1)

    full, amax = w8.float() * spread(s), spread(w.abs().reshape(2, 128, 2, 128).amax(dim=(1, 3)))
    bad = (full - w).abs() > 0.07 * w.abs() + amax * 2**-8
    for axis, what in ((1, "row"), (0, "column")):
        lines = bad.any(dim=axis).nonzero().flatten().tolist()
        if lines and all(k % 128 in (0, 127) for k in lines):
            return (f" (only {what}s {', '.join(map(str, lines))} are wrong, at a block's edge: block i "
                    f"covers {what}s 128·i to 128·i + 127, the slice [128 * i:128 * (i + 1)])")
    return ""


def _block_range(r: int, i: int, j: int, amax: float, scale: float) -> str | None:
    """What is wrong with the value block (i, j)'s scale maps its amax to, as for the per-tensor cast:
    below e4m3's top (range left unused) or beyond what rounds to 448 (its largest values clipped)."""
    if amax == 0:
        return None
    mapped = amax / scale if scale > 0 else math.inf
    if FULL <= mapped <= TOP * (1 + 2**-5):
        return None
    where = "below e4m3's 448, so part of its range is left unused" if mapped < FULL else \
        "beyond e4m3's 448, so its largest values were clipped, not rounded"
    return (f"rank {r}: block ({i}, {j})'s amax is mapped to {fixed(mapped, 4)}, {where}: each block's "
            "scale must map its own amax to 448 (scales[i, j] = the block's amax / 448)")


def _blocks_values(outs):
    for r, o in enumerate(outs):
        w, (w8, s) = o["w"], _got(o["out"])
        ranged = []
        for i in range(2):
            for j in range(2):
                rows, cols = slice(128 * i, 128 * (i + 1)), slice(128 * j, 128 * (j + 1))
                blk, amax = w[rows, cols], float(w[rows, cols].abs().max())
                off = _block_range(r, i, j, amax, float(s[i, j]))
                if not _close(w8[rows, cols], s[i, j], blk, amax):
                    hint = " (scales[i, j] belongs to rows 128·i…, columns 128·j…: check the order)" \
                        if _close(w8[rows, cols], s[j, i], blk, amax) else _edge(w8, s, w)
                    if off and not hint:  # saturated far enough to miss the block: say where it went
                        return off
                    gap = float((w8[rows, cols].float() * s[i, j] - blk).abs().max())
                    return (f"rank {r}: block ({i}, {j}) · its scale is not the weight's block (largest gap "
                            f"{gap:.3g} where the block's amax is {amax:.3g}){hint}")
                ranged.append(off)
        off = next((m for m in ranged if m), None)
        if off:
            return off


def check_blocks(fn) -> Verdict:
    if not callable(fn):
        return Verdict(False, "submit your function block_quantize(w) returning (w8, scales)")
    return judge(
        [on_ranks(f"{n} ranks", n, blocks_job, fn, timeout_s=30) for n in (2, 4)],
        [
            Property("returns (w8 in e4m3, one scale per 128×128 block)", _blocks_form),
            Property("each block · its scale recovers the weight's block, its amax mapped to e4m3's 448",
                     _blocks_values),
        ],
        done="DeepSeek-V3 scales weights this way, and activations in 1×128 tiles.",
    )


def block_quantize(w):
    """The answer: a [2, 2] grid of scales for a 256×256 weight."""
    rows, cols = w.shape[0] // 128, w.shape[1] // 128
    blocks = w.reshape(rows, 128, cols, 128)
    amax = blocks.abs().amax(dim=(1, 3))
    scales = torch.where(amax > 0, amax / 448, torch.ones_like(amax))
    w8 = (blocks / scales[:, None, :, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    return w8.reshape(w.shape), scales


def exercises() -> dict[str, Exercise]:
    return {
        "cast": Exercise(
            key="cast",
            title="write the per-tensor scaled cast to e4m3",
            prompt="Write <code>fp8_cast(x)</code> returning <code>(x8, scale)</code>: x8 a "
            "<code>torch.float8_e4m3fn</code> tensor with x ≈ x8 · scale, using e4m3's whole range. The "
            "check runs it on 2 and 4 ranks, each on tensors with outliers, all zeros, values beyond "
            "448 and values near 1e-6.",
            check=check_cast,
            hint="The scale maps the largest |x| to 448. What if the largest |x| is 0?",
            solution=solution_text(fp8_cast),
            reference=lambda: fp8_cast,
            also=(scaling.quantize, scaling.DelayedScaling.quantize, scaling.scale_for,
                  scaling.saturating_cast),  # quantize's two halves: the scale and the cast asked for
        ),
        "formats": Exercise(
            key="formats",
            title="choose a tensor's FP8 format by measuring it",
            prompt="Write <code>choose_format(x)</code> returning <code>'e4m3'</code> or "
            "<code>'e5m2'</code>: "
            "the format whose per-tensor scaled cast errs least on x "
            "(<code>errors.elementwise_error(x, fmt)</code>, imported at the top, measures one). The check "
            "runs the chapter's "
            "FP8 training on 2 and 4 ranks and hands your function each rank's own output-gradients (the "
            "tensors FP8Matmul casts, at the first and last step), an activation-like tensor and a tensor "
            "spanning 24 binades.",
            check=check_formats,
            hint="Which error is smaller depends on the tensor: cast it both ways and compare.",
            solution=solution_text(choose_format),
            reference=lambda: choose_format,
        ),
        "blocks": Exercise(
            key="blocks",
            title="write block-wise scaling for a weight",
            prompt="Write <code>block_quantize(w)</code> for a 256×256 weight: return "
            "<code>(w8, scales)</code>, "
            "w8 in e4m3 of w's shape, scales of shape [2, 2], one per 128×128 block (scales[i, j] for rows "
            "128·i to 128·i + 127 and columns 128·j to 128·j + 127). The check runs it on 2 and 4 ranks, "
            "on weights whose blocks differ in size by 10⁶.",
            check=check_blocks,
            hint="reshape(2, 128, 2, 128): block (i, j) is [i, :, j, :]; its amax sets its scale.",
            solution=solution_text(block_quantize),
            reference=lambda: block_quantize,
            also=(scaling.quantize_blocks, scaling.scale_for, scaling.saturating_cast),
        ),
    }
