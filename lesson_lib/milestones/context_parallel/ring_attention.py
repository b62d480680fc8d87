"""Context parallelism as ring attention (Liu et al., 2023), forward pass only (chapter 8).

Each rank keeps seq / c of the queries; key/value blocks travel round the ring and each is folded
into an online softmax (Milakov & Gimelshein, 2018). Each step posts the exchange before computing,
so the transfer can hide. Counted under ``cp_ring``: (c − 1) K and V blocks per rank.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ... import comm
from ...metrics import counters
from ..tensor_parallel import ops as op_names


def block_update(q, k, v, m, denom, o, mask=None):
    """Fold one key/value block into the running (max ``m``, sum ``denom``, output ``o``) of the online
    softmax; ``q`` ``[..., s_q, d]``, ``k`` and ``v`` ``[..., s_k, d]``."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(mask, float("-inf"))
    m_new = torch.maximum(m, s.amax(-1, keepdim=True))
    p = torch.exp(s - m_new)
    scale = torch.exp(m - m_new)  # what the earlier blocks' terms were measured against
    return m_new, denom * scale + p.sum(-1, keepdim=True), o * scale + p @ v


def ring_attention(q, k, v, causal: bool = True, group=None, update=block_update, watch=None):
    """This rank's block of the attention output, ``[b, heads, s/c, d]``, from its own blocks of
    q, k, v; rank r holds tokens r·s/c … (r+1)·s/c − 1. ``update`` folds a block in (chapter 8's
    merge exercise swaps in the learner's); ``watch(step, kv)`` sees each block held (its figure)."""
    r, c = dist.get_rank(group), dist.get_world_size(group)
    m = q.new_full((*q.shape[:-1], 1), float("-inf"))
    denom, o = q.new_zeros((*q.shape[:-1], 1)), torch.zeros_like(q)
    kv = torch.stack([k, v]).contiguous()
    for step in range(c):
        src = (r - step) % c  # whose block I hold now
        if step < c - 1:  # pass it on while I compute on it
            nxt = torch.empty_like(kv)
            pending = comm.exchange(kv, (r + 1) % c, nxt, (r - 1) % c, group, op=op_names.CP_RING)
        if watch is not None:
            watch(step, kv)
        if not causal or src < r:
            m, denom, o = update(q, kv[0], kv[1], m, denom, o)
        elif src == r:  # my own block: the causal triangle
            n = q.shape[-2]
            causal_mask = torch.ones(n, n, dtype=torch.bool).triu(1)
            m, denom, o = update(q, kv[0], kv[1], m, denom, o, causal_mask)
        # src > r: keys from later tokens, all masked under causality (a zig-zag layout balances this)
        if step < c - 1:
            pending.wait()
            kv = nxt
    return o / denom


def full_attention(q, k, v, causal: bool = True):
    """The reference: softmax(QKᵀ/√d)V over the whole sequence at once."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[-2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return s.softmax(-1) @ v


def qkv(batch: int, heads: int, seq: int, dim: int, seed: int = 0):
    """Random queries, keys and values ``[b, heads, seq, dim]`` (the same on every rank)."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch, heads, seq, dim, generator=g) for _ in range(3))


def check_sequence(seq: int, ranks: int) -> None:
    """ValueError naming the parameter, before any rank starts."""
    if seq % ranks:
        raise ValueError(f"seq = {seq} does not divide among {ranks} context-parallel ranks")


def ring_job(batch: int, heads: int, seq: int, dim: int, causal: bool = True) -> dict:
    """On every rank: my block of q, k, v → my block of the output; the bytes the ring sent; and
    ``held[step]``, the K/V block this rank held at each step, recognised from its contents."""
    r, c = dist.get_rank(), dist.get_world_size()
    check_sequence(seq, c)
    whole_k = qkv(batch, heads, seq, dim)[1].chunk(c, dim=2)
    q, k, v = (t.chunk(c, dim=2)[r] for t in qkv(batch, heads, seq, dim))
    held = []

    def watch(step, kv):
        held.append(next((j for j, block in enumerate(whole_k) if torch.equal(block, kv[0])), -1))

    counters().reset()
    out = ring_attention(q, k, v, causal, watch=watch)
    ops = counters().as_dict()
    return {"out": out, "sent": ops.get(op_names.CP_RING, {}).get("bytes_sent", 0),
            "kv_block_bytes": 2 * k.nbytes, "held": held}
