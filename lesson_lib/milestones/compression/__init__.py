"""Gradient compression (chapter 6): data parallelism whose gradient exchange is compressed.

Chapter 0's loop (one flat gradient bucket, SGD with momentum) with the all-reduce replaced by a
compressor (:mod:`.compressors`: fp16, bf16, top-k, random-k, QSGD, sign; :mod:`.allreduce`: sign
through a compressed all-reduce; :mod:`.powersgd`), error feedback on or off. Every byte crosses
through :mod:`lesson_lib.comm` and is counted, so the compression ratio is measured against the
uncompressed ring's 2(N−1)/N·S; the all-gathered compressors (:data:`ALL_GATHERED`) send (N−1)
payloads instead, so they stop saving at a break-even N (:func:`all_gather_break_even`). With
``link_gbps`` each transfer takes at least latency + bytes / bandwidth — an EMULATED link
(:func:`comm.set_link`).
"""

from .allreduce import SignAllReduce, block_chunks, busiest_bytes, simulate
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
    qsgd_width,
    sign_bytes,
    sign_decode,
    sign_encode,
    unpack_bits,
)
from .ddp import ddp_hook
from .milestone import (
    ALL_GATHERED,
    COMPRESSORS,
    NAME,
    Config,
    all_gather_break_even,
    crossover_gbps,
    make,
    messages_per_step,
    predicted_step_s,
    reference,
    ring_busiest_bytes,
    summarize,
    train,
    worker,
)
from .powersgd import PowerSGD

__all__ = [
    "ALL_GATHERED", "BLOCK", "COMPRESSORS", "NAME", "QSGD", "Cast", "Compressor", "Config", "PowerSGD",
    "RandomK", "Sign", "SignAllReduce", "TopK", "all_gather_break_even", "block_chunks", "busiest_bytes",
    "crossover_gbps", "ddp_hook", "make", "messages_per_step", "pack_bits", "predicted_step_s",
    "qsgd_dequantize", "qsgd_quantize", "qsgd_width", "reference", "ring_busiest_bytes", "sign_bytes",
    "sign_decode", "sign_encode", "simulate", "summarize", "train", "unpack_bits", "worker",
]
