"""Gradient compressors (chapter 6): fewer bytes per all-reduce, and what each one costs.

Every compressor has one shape: ``reduce(flat, shapes, key)`` replaces this rank's flat gradient by
the AVERAGE over the ranks of what the ranks sent, in place. All traffic goes through
:mod:`lesson_lib.comm`, so the bytes are counted as they cross: payload, indices and scales.

* ``none`` — chapter 0's ring all-reduce of float32.
* ``fp16`` / ``bf16`` — cast, ring all-reduce in 16 bits, cast back (like torch's
  ``fp16_compress_hook``; torch's ``bf16_compress_hook`` needs NCCL, this one runs on Gloo).
* ``topk`` — the k largest magnitudes, with error feedback (Lin et al., Deep Gradient Compression,
  ICLR 2018). Each rank picks its own indices, so contributions do not add in place: indices and
  values are ALL-GATHERED (int32 + float32 per kept element) and summed by each rank.
* ``randomk`` — k random coordinates, the SAME on every rank (a shared seed), so the values add in
  place: one ring all-reduce of k floats, no indices on the wire (Stich et al., NeurIPS 2018).
* ``qsgd`` — stochastic quantization to s = 2^bits − 1 levels per 512-element block, unbiased
  (Alistarh et al., QSGD, NeurIPS 2017); codes bit-packed, one float32 norm per block, all-gathered.
* ``sign`` — one bit per element and one float32 scale (mean |x|) per block, with error feedback
  (Karimireddy et al., EF-SignSGD, ICML 2019); all-gathered.
* ``powersgd`` — rank-r approximation M ≈ P Qᵀ by one power iteration, warm-started from the last
  step's Q, with error feedback (Vogels et al., PowerSGD, NeurIPS 2019); P and Q add in place (two
  ring all-reduces). Laid out like torch's ``powerSGD_hook`` so the two can be compared.

Error feedback keeps what a rank did not send (its residual) and adds it to the next gradient, so
over the steps everything is sent eventually. :func:`ddp_hook` turns any compressor into a DDP
communication hook for ``DistributedDataParallel.register_comm_hook``.

The compressors live in :mod:`lesson_lib.compressors` (the :class:`Compressor` base, fp16/bf16,
top-k, random-k, QSGD, sign, and the counted collectives they use) and :mod:`lesson_lib.powersgd`;
they are imported here under their old names. This module picks one by name (:func:`make`).
"""

from __future__ import annotations

import torch

# Re-exported: the chapter 6 milestone, notebook and tests use these names from here.
from .compressors import (  # noqa: F401
    BLOCK,
    QSGD,
    Cast,
    Compressor,
    RandomK,
    Sign,
    TopK,
    _blocks,
    _Sparse,
    _world,
    all_gather_bytes,
    pack_bits,
    qsgd_dequantize,
    qsgd_quantize,
    qsgd_width,
    ring_all_reduce,
    unpack_bits,
)
from .powersgd import PowerSGD, orthogonalize  # noqa: F401

COMPRESSORS = ("none", "fp16", "bf16", "topk", "randomk", "qsgd", "sign", "powersgd")


def make(name: str, ratio: float = 0.01, bits: int = 4, rank: int = 1, error_feedback: bool = True,
         seed: int = 0, **powersgd) -> Compressor:
    """A compressor by name (the experiment's ``--compressor``); the other options where they apply."""
    if name == "none":
        return Compressor(seed=seed)
    if name in ("fp16", "bf16"):
        return Cast(torch.float16 if name == "fp16" else torch.bfloat16, seed=seed)
    if name == "topk":
        return TopK(ratio, error_feedback=error_feedback, seed=seed)
    if name == "randomk":
        return RandomK(ratio, error_feedback=error_feedback, seed=seed)
    if name == "qsgd":
        return QSGD(bits, seed=seed)
    if name == "sign":
        return Sign(error_feedback=error_feedback, seed=seed)
    if name == "powersgd":
        return PowerSGD(rank, error_feedback=error_feedback, seed=seed, **powersgd)
    raise ValueError(f"compressor must be one of {', '.join(COMPRESSORS)}, got {name!r}")


def ddp_hook(compressor: Compressor):
    """``hook(state, bucket) -> Future`` for ``DistributedDataParallel.register_comm_hook(None, hook)``.

    The compressor averages the bucket in place (synchronously, through our counted layer) and the
    future is already complete: DDP copies the bucket back into the parameters' ``.grad``. State
    (residuals, PowerSGD's Q) is kept per bucket index; DDP rebuilds its buckets after the first
    step, so a bucket whose size changed starts afresh — hence ``start_iter=2`` with DDP, as torch asks.
    """

    def hook(state, bucket):  # no annotations: DDP rejects the string ones of __future__
        buf = bucket.buffer()
        compressor.reduce(buf, [g.shape for g in bucket.gradients()], key=bucket.index(), op="ddp_hook")
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(buf)
        return fut

    return hook
