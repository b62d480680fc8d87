"""FSDP2-style parameter all-gather in FP8 (chapter 9 §4), as torchao's
``enable_fsdp_float8_all_gather`` does it: each rank holds a shard of every weight in fp32; before
the forward it casts its shard to e4m3 with the scale of the WHOLE weight (the largest of the
ranks' amaxes, gathered first), and the e4m3 shards travel as uint8 through our counted ring. The
gathered weight is then bit-equal to the unsharded weight cast with its own per-tensor scale.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ...comm import ring_all_gather
from ...metrics import counters
from .formats import E4M3
from .scaling import quantize, saturating_cast, scale_for, scaled_mm


def gather_fp8(shard: torch.Tensor, fmt=E4M3) -> tuple[torch.Tensor, torch.Tensor]:
    """From this rank's flat fp32 shard (every rank's the same length), the whole weight in FP8 and
    its scale. Two gathers: N amaxes (fp32), then N FP8 shards as bytes."""
    n, r, k = dist.get_world_size(), dist.get_rank(), shard.numel()
    amaxes = torch.zeros(n)
    amaxes[r] = shard.abs().max()
    ring_all_gather(amaxes, op="fp8_amax_gather")
    scale = scale_for(amaxes.max(), fmt)
    flat = torch.zeros(n * k, dtype=torch.uint8)
    flat[r * k:(r + 1) * k] = saturating_cast(shard, scale, fmt).view(torch.uint8)
    ring_all_gather(flat, op="fp8_all_gather")
    return flat.view(fmt), scale


def gather_bf16(shard: torch.Tensor) -> torch.Tensor:
    """The same weight gathered in bf16, as FSDP2 with bf16 parameters would."""
    n, r, k = dist.get_world_size(), dist.get_rank(), shard.numel()
    flat = torch.zeros(n * k, dtype=torch.bfloat16)
    flat[r * k:(r + 1) * k] = shard.bfloat16()
    ring_all_gather(flat, op="bf16_all_gather")
    return flat


def gather_bytes(numel: int, world_size: int, fmt: str) -> int:
    """What one rank sends to gather a weight of ``numel`` values (divisible by the world size) on a
    ring: (N−1) shards of numel/N values, 1 byte each in FP8 plus (N−1) fp32 amaxes, 2 bytes in bf16."""
    if numel % world_size:
        raise ValueError(f"numel ({numel}) must divide by world_size ({world_size})")
    shard = numel // world_size
    if fmt == "fp8":
        return (world_size - 1) * (shard + 4)
    if fmt == "bf16":
        return (world_size - 1) * 2 * shard
    raise ValueError(f"fmt must be 'fp8' or 'bf16', got {fmt!r}")


def sharded_forward_job(weights: list[torch.Tensor], x: torch.Tensor) -> dict:
    """On every rank: hold 1/N of each weight (fp32), gather each in FP8 (and in bf16, to count),
    run the MLP's products in FP8 with the gathered weights; the output and the bytes each way."""
    n, r = dist.get_world_size(), dist.get_rank()
    counters().reset()
    h = x
    for i, w in enumerate(weights):
        shard = w.flatten().chunk(n)[r].clone()
        w8, sw = gather_fp8(shard)
        gather_bf16(shard)
        h = scaled_mm(*quantize(h), w8.view(w.shape), sw)
        h = torch.nn.functional.gelu(h) if i < len(weights) - 1 else h
    sent = {op: s.bytes_sent for op, s in counters().ops.items()}
    return {"y": h, "sent": sent}


def unsharded_forward(weights: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """The same FP8 products in one process, each weight cast whole with its per-tensor scale."""
    h = x
    for i, w in enumerate(weights):
        h = scaled_mm(*quantize(h), *quantize(w))
        h = torch.nn.functional.gelu(h) if i < len(weights) - 1 else h
    return h
