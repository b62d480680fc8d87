"""Eight-bit training (chapter 9, notebooks/09_fp8.ipynb).

* :mod:`.formats` — e4m3 and e5m2 beside bf16, fp16, fp32: range, precision, the grid
* :mod:`.scaling` — per-tensor, row-wise, delayed and block-wise scaling; ``torch._scaled_mm``
* :mod:`.errors` — §2's measurements: each recipe's matmul error, no scaling at all
* :mod:`.linear` — the FP8 linear layer (e4m3 forward, e5m2 backward, fp32 master weights)
* :mod:`.train` — data-parallel training in fp32, bf16 and FP8 (``Config``, ``train_job``, ``reference``)
* :mod:`.allgather` — FSDP2-style all-gather of FP8 weights with their scales
* :mod:`.tolerances` — how far FP8 and bf16 runs may sit from fp32
"""

from . import allgather, errors, formats, linear, scaling, tolerances, train
from .linear import FP8Matmul
from .train import Config

__all__ = [
    "Config",
    "FP8Matmul",
    "allgather",
    "errors",
    "formats",
    "linear",
    "scaling",
    "tolerances",
    "train",
]
