"""The number formats of chapter 9 (notebooks/09_fp8.ipynb): e4m3 and e5m2 (Micikevicius et al.,
"FP8 Formats for Deep Learning", 2022) beside bf16, fp16 and fp32, read from ``torch.finfo``.
"""

from __future__ import annotations

import math

import torch

DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "bf16": torch.bfloat16,
          "fp16": torch.float16, "fp32": torch.float32}
E4M3, E5M2 = DTYPES["e4m3"], DTYPES["e5m2"]
# exponent and mantissa bits (the sign takes one more)
BITS = {"e4m3": (4, 3), "e5m2": (5, 2), "bf16": (8, 7), "fp16": (5, 10), "fp32": (8, 23)}


def dtype_of(name) -> torch.dtype:
    """A format by name ("e4m3") or as a torch dtype; anything else raises naming the parameter."""
    if isinstance(name, torch.dtype) and name in DTYPES.values():
        return name
    if name not in DTYPES:
        raise ValueError(f"fmt must be one of {', '.join(DTYPES)} (or its torch dtype), got {name!r}")
    return DTYPES[name]


def describe(name: str) -> dict:
    """Range and precision of one format: the largest finite value, the smallest normal and
    subnormal values, the relative step at 1 (``eps``, 2^-mantissa bits), and the dynamic range in
    powers of two (binades) from the smallest subnormal to the largest value."""
    fi = torch.finfo(dtype_of(name))
    exp, man = BITS[name]
    subnormal = fi.smallest_normal * fi.eps  # the last mantissa bit below the smallest normal
    return {"format": name, "bits": fi.bits, "exponent_bits": exp, "mantissa_bits": man,
            "max": fi.max, "smallest_normal": fi.smallest_normal, "smallest_subnormal": subnormal,
            "eps": fi.eps, "unit_roundoff": fi.eps / 2, "binades": math.log2(fi.max / subnormal)}


def table() -> list[dict]:
    return [describe(name) for name in DTYPES]


def grid(name: str) -> torch.Tensor:
    """Every finite, non-negative value an 8-bit format holds, sorted: its 256 bit patterns read as
    that format (torch's own decoding), NaN and inf left out."""
    dtype = dtype_of(name)
    if torch.finfo(dtype).bits != 8:
        raise ValueError(f"name must be an 8-bit format (e4m3, e5m2), got {name!r}")
    values = torch.arange(256, dtype=torch.int16).to(torch.uint8).view(dtype).float()
    return values[torch.isfinite(values) & (values >= 0)].unique().sort().values
