"""The conjugate operators of tensor parallelism (Shoeybi et al., 2019), as autograd Functions.

``f``: identity forward, all-reduce backward (starts a column-parallel layer); ``g``: all-reduce
forward, identity backward (ends a row-parallel layer). Megatron-LM's
``core/tensor_parallel/mappings.py`` has the same. Sequence parallelism (Korthikanti et al., 2022)
splits each all-reduce: :class:`LinearGatherSequence` and :class:`ReduceScatterToSequence`.
Collectives are our counted ring (``tp_all_reduce``, ``sp_all_gather``, ``sp_reduce_scatter``);
tensors are ``[seq, batch, hidden]``, so a sequence slice is contiguous.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ... import comm
from . import ops as op_names


def _all_reduce(t: torch.Tensor, group, op: str) -> torch.Tensor:
    out = t.contiguous().clone()  # the caller's tensor may be saved for backward elsewhere
    return comm.ring_all_reduce(out, group, op=op)


def _all_gather_seq(t: torch.Tensor, group, op: str) -> torch.Tensor:
    """``[s/t, ...]`` on each rank → ``[s, ...]`` everywhere (rank r's slice is slice r)."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    full = t.new_empty((n * t.shape[0], *t.shape[1:]))
    full[r * t.shape[0]:(r + 1) * t.shape[0]] = t
    comm.ring_all_gather(full.view(-1), group, op=op)
    return full


def _reduce_scatter_seq(t: torch.Tensor, group, op: str) -> torch.Tensor:
    """``[s, ...]`` partial sums on each rank → rank r's ``[s/t, ...]`` slice of their sum."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    flat = t.contiguous().clone().view(-1)
    comm.ring_reduce_scatter(flat, group, op=op)
    size = t.shape[0] // n
    return flat.view_as(t)[r * size:(r + 1) * size].clone()


def _split_seq(t: torch.Tensor, group) -> torch.Tensor:
    n, r = dist.get_world_size(group), dist.get_rank(group)
    size = t.shape[0] // n
    return t[r * size:(r + 1) * size].contiguous()


class CopyToTensorRegion(torch.autograd.Function):
    """f: identity forward, all-reduce backward (each rank's input gradient is a partial sum)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group, op_names.TP_ALL_REDUCE), None


class ReduceFromTensorRegion(torch.autograd.Function):
    """g: all-reduce forward (each rank holds a partial sum), identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x, group, op_names.TP_ALL_REDUCE)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class LinearGatherSequence(torch.autograd.Function):
    """Sequence parallelism's f, fused with the column-parallel linear that follows it: all-gather
    the sequence, multiply; keep only my slice of the input for the backward and gather it again
    there (Korthikanti et al., 2022, §4.2.2: the saving of activation memory needs it; Megatron-LM
    overlaps that all-gather with the input gradient), whose sum over ranks is reduce-scattered."""

    @staticmethod
    def forward(ctx, x, weight, bias, group):
        ctx.group = group
        ctx.save_for_backward(x, weight)
        return torch.nn.functional.linear(_all_gather_seq(x, group, op_names.SP_ALL_GATHER), weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        full = _all_gather_seq(x, ctx.group, op_names.SP_REGATHER)  # not kept from the forward
        grad_x = _reduce_scatter_seq(grad @ weight, ctx.group, op_names.SP_REDUCE_SCATTER)
        grad_w = grad.reshape(-1, grad.shape[-1]).t() @ full.reshape(-1, full.shape[-1])
        return grad_x, grad_w, grad.sum(dim=tuple(range(grad.dim() - 1))), None


class ReduceScatterToSequence(torch.autograd.Function):
    """Sequence parallelism's g: reduce-scatter the sequence forward, all-gather it backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter_seq(x, group, op_names.SP_REDUCE_SCATTER)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather_seq(grad.contiguous(), ctx.group, op_names.SP_ALL_GATHER), None


class ScatterToSequence(torch.autograd.Function):
    """Enter the sequence-parallel region from a replicated tensor: keep my slice forward,
    all-gather the gradient backward (every rank's replicated input needs the whole of it)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split_seq(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather_seq(grad.contiguous(), ctx.group, op_names.SP_ENDS), None


class GatherToReplicated(torch.autograd.Function):
    """Leave the sequence-parallel region for replicated work (the head): all-gather forward, keep
    my slice of the (identical) gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_gather_seq(x.contiguous(), group, op_names.SP_ENDS)

    @staticmethod
    def backward(ctx, grad):
        return _split_seq(grad, ctx.group), None


def f(x: torch.Tensor, group=None) -> torch.Tensor:
    return CopyToTensorRegion.apply(x, group)


def g(x: torch.Tensor, group=None) -> torch.Tensor:
    return ReduceFromTensorRegion.apply(x, group)
