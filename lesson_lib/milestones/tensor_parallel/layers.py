"""Tensor-parallel layers (Shoeybi et al., 2019), built from a whole layer's weights (chapter 8).

:class:`ColumnParallelLinear` keeps slice r of the output features (of one or several fused layers,
like Megatron-LM's QKV) and starts with ``f``; :class:`RowParallelLinear` keeps slice r of the input
features and ends with ``g``. With ``sequence_parallel`` (Korthikanti et al., 2022) ``f`` and ``g``
become an all-gather and a reduce-scatter of the sequence.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ... import comm
from . import ops as op_names
from .mappings import (
    GatherToReplicated,
    LinearGatherSequence,
    ReduceScatterToSequence,
    ScatterToSequence,
    f,
    g,
)
from .model import Transformer, attend


def _shard(t: torch.Tensor, dim: int, group) -> torch.Tensor:
    n, r = dist.get_world_size(group), dist.get_rank(group)
    return t.detach().chunk(n, dim)[r].clone()


class ColumnParallelLinear(nn.Module):
    """``y_r = x W_rᵀ + b_r``: my rows of each full weight (output features), the whole input."""

    def __init__(self, full: list[nn.Linear], group=None, sequence_parallel: bool = False):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self.weight = nn.Parameter(torch.cat([_shard(m.weight, 0, group) for m in full]))
        self.bias = nn.Parameter(torch.cat([_shard(m.bias, 0, group) for m in full]))

    def forward(self, x):
        if self.sequence_parallel:  # all-gather the sequence (its backward: reduce-scatter)
            return LinearGatherSequence.apply(x, self.weight, self.bias, self.group)
        return F.linear(f(x, self.group), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """``y = Σ_r x_r W_rᵀ + b``: my columns of the weight (input features), summed over the ranks."""

    def __init__(self, full: nn.Linear, group=None, sequence_parallel: bool = False):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self.weight = nn.Parameter(_shard(full.weight, 1, group))
        self.bias = nn.Parameter(full.bias.detach().clone())  # added once, after the sum
        self.bias.sequence_parallel = sequence_parallel  # its gradient: from my tokens only

    def forward(self, x):
        y = F.linear(x, self.weight)
        y = ReduceScatterToSequence.apply(y, self.group) if self.sequence_parallel else g(y, self.group)
        return y + self.bias


class ParallelAttention(nn.Module):
    """q, k and v column-parallel (heads / t heads on each rank), o row-parallel."""

    def __init__(self, full, group=None, sequence_parallel: bool = False):
        super().__init__()
        self.head_dim = full.head_dim
        self.qkv = ColumnParallelLinear([full.q, full.k, full.v], group, sequence_parallel)
        self.o = RowParallelLinear(full.o, group, sequence_parallel)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self.o(attend(q, k, v, self.head_dim))


class ParallelMLP(nn.Module):
    """fc1 column-parallel (ffn / t hidden units on each rank), fc2 row-parallel."""

    def __init__(self, full, group=None, sequence_parallel: bool = False):
        super().__init__()
        self.fc1 = ColumnParallelLinear([full.fc1], group, sequence_parallel)
        self.fc2 = RowParallelLinear(full.fc2, group, sequence_parallel)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def _replica(module: nn.Module, sequence_parallel: bool) -> nn.Module:
    """A copy of a replicated module (a norm); under sequence parallelism its gradient comes from
    my tokens only, so it is all-reduced after the backward (:func:`sync_sequence_parallel`)."""
    import copy

    out = copy.deepcopy(module)
    for p in out.parameters():
        p.sequence_parallel = sequence_parallel
    return out


class ParallelBlock(nn.Module):
    def __init__(self, full, group=None, sequence_parallel: bool = False):
        super().__init__()
        self.ln1, self.ln2 = (_replica(m, sequence_parallel) for m in (full.ln1, full.ln2))
        self.attn = ParallelAttention(full.attn, group, sequence_parallel)
        self.mlp = ParallelMLP(full.mlp, group, sequence_parallel)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class ParallelTransformer(nn.Module):
    """:class:`~.model.Transformer` with every block tensor-parallel over ``group``; embeddings,
    final norm and head replicated (Megatron-LM also splits the vocabulary; we keep them whole)."""

    def __init__(self, full: Transformer, group=None, sequence_parallel: bool = False):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self.tok, self.pos = _replica(full.tok, False), _replica(full.pos, False)
        self.blocks = nn.ModuleList(ParallelBlock(b, group, sequence_parallel) for b in full.blocks)
        self.ln, self.head = _replica(full.ln, sequence_parallel), _replica(full.head, False)

    def embed(self, tokens):
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[0], device=tokens.device))[:, None]
        return ScatterToSequence.apply(x, self.group) if self.sequence_parallel else x  # seq / t tokens

    def body(self, x):
        for block in self.blocks:
            x = block(x)
        return x

    def finish(self, x):
        x = self.ln(x)
        return self.head(GatherToReplicated.apply(x, self.group) if self.sequence_parallel else x)

    def forward(self, tokens):
        return self.finish(self.body(self.embed(tokens)))


def all_reduce_flat(tensors: list[torch.Tensor], group, op: str, divide: int = 1) -> None:
    """All-reduce ``tensors`` in place as one flat message (our counted ring, under ``op``), divided
    by ``divide``: a replica group's gradients, or the sequence-parallel ones below."""
    flat = comm.ring_all_reduce(torch.cat([t.reshape(-1) for t in tensors]), group, op=op)
    if divide != 1:
        flat.div_(divide)
    for t, part in zip(tensors, flat.split([t.numel() for t in tensors])):
        t.copy_(part.view_as(t))


def sync_sequence_parallel(params, group=None) -> None:
    """Sum the gradients that each rank computed from its own tokens only (norms, row biases under
    sequence parallelism), as Megatron-LM does after the backward: one all-reduce of them all."""
    grads = [p.grad for p in params if getattr(p, "sequence_parallel", False)]
    if grads:
        all_reduce_flat(grads, group, op_names.SP_NORM_GRADS)


def gather_full(model: nn.Module, group=None, grads: bool = False) -> dict[str, torch.Tensor]:
    """Every parameter (or its gradient) as the whole model's, named as in :class:`~.model.Transformer`,
    reassembled from the ranks' shards: for comparing with one process, not part of training."""
    out = {}
    for name, p in model.named_parameters():
        t = (p.grad if grads else p).detach().contiguous()
        kind = name.rsplit(".", 2)[-2]  # qkv, o, fc1, fc2, ln1, …
        dim = {"qkv": 0, "fc1": 0, "o": 1, "fc2": 1}.get(kind)
        if dim is None or (dim == 1 and name.endswith("bias")):
            out[name] = t
            continue
        parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, t, group=group)
        if kind == "qkv":  # each rank holds [q_r; k_r; v_r]
            for i, which in enumerate("qkv"):
                out[name.replace("qkv", which)] = torch.cat([x.chunk(3, 0)[i] for x in parts], 0)
        else:
            out[name] = torch.cat(parts, dim)
    return out
