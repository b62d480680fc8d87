"""Gradient compression (chapter 6): data parallelism whose gradient exchange is compressed.

Chapter 0's loop (one flat gradient bucket, SGD with momentum) with the all-reduce replaced by a
compressor (:mod:`.compressors`: fp16, bf16, top-k, random-k, QSGD, sign; :mod:`.powersgd`),
error feedback on or off. Every byte crosses through :mod:`lesson_lib.comm` and is counted, so the
compression ratio is measured against the uncompressed ring's 2(N−1)/N·S. With ``link_gbps`` each
transfer takes at least latency + bytes / bandwidth — an EMULATED link (:func:`comm.set_link`).
"""

from .compressors import (
    BLOCK,
    QSGD,
    Cast,
    Compressor,
    RandomK,
    Sign,
    TopK,
    pack_bits,
    qsgd_dequantize,
    qsgd_quantize,
    unpack_bits,
)
from .ddp import ddp_hook
from .milestone import (
    COMPRESSORS,
    NAME,
    Config,
    crossover_gbps,
    make,
    messages_per_step,
    predicted_step_s,
    reference,
    summarize,
    train,
    worker,
)
from .powersgd import PowerSGD

__all__ = [
    "BLOCK", "COMPRESSORS", "NAME", "QSGD", "Cast", "Compressor", "Config", "PowerSGD", "RandomK", "Sign",
    "TopK", "crossover_gbps", "ddp_hook", "make", "messages_per_step", "pack_bits", "predicted_step_s",
    "qsgd_dequantize", "qsgd_quantize", "reference", "summarize", "train", "unpack_bits", "worker",
]
