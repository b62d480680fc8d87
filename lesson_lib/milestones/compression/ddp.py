"""Any compressor as a DDP communication hook (chapter 6)."""

from __future__ import annotations

import torch

from .compressors import Compressor


def ddp_hook(compressor: Compressor):
    """``hook(state, bucket) -> Future`` for ``DistributedDataParallel.register_comm_hook(None, hook)``.

    The compressor averages the bucket in place and returns a completed future. State is kept per
    bucket index; DDP rebuilds its buckets after the first step, so use ``start_iter=2``, as torch asks."""

    def hook(state, bucket):  # no annotations: DDP rejects the string ones of __future__
        buf = bucket.buffer()
        compressor.reduce(buf, [g.shape for g in bucket.gradients()], key=bucket.index(), op="ddp_hook")
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(buf)
        return fut

    return hook
