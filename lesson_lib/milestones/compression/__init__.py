"""Gradient compression (chapter 6): chapter 0's data parallelism with a compressed gradient exchange.

Compressors: :mod:`.compressors` (fp16, bf16, top-k, random-k, QSGD, sign), :mod:`.allreduce`
(sign through a compressed all-reduce), :mod:`.powersgd`; error feedback on or off. Every byte is
counted; all-gathered compressors (:data:`ALL_GATHERED`) stop saving past
:func:`all_gather_break_even`. ``link_gbps`` emulates a slow link (:func:`comm.set_link`).
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
