"""PowerSGD (chapter 6): a rank-r approximation M ≈ P Qᵀ of each gradient matrix by one power
iteration, warm-started from the last step's Q, with error feedback (Vogels et al., NeurIPS 2019).
Laid out like torch's ``powerSGD_hook`` (same options, same defaults) so that the two can be compared
(``python -m lesson_lib bench compression``); :func:`~.milestone.make` builds it by name.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from .compressors import Compressor, _world


def orthogonalize(m: torch.Tensor, epsilon: float = 0.0) -> torch.Tensor:
    """Gram–Schmidt on the columns of each matrix of a (batch, n, r) tensor, in place."""
    for i in range(m.shape[2]):
        col = m[:, :, i:i + 1]
        col /= torch.norm(col, dim=1, keepdim=True) + epsilon
        if i + 1 < m.shape[2]:
            rest = m[:, :, i + 1:]
            rest -= torch.sum(col * rest, dim=1, keepdim=True) * col
    return m


class PowerSGD(Compressor):
    """Rank-r PowerSGD in the layout of torch's ``powerSGD_hook`` (same options, same defaults).

    Matrices with (n + m)·r·``min_compression_rate`` < n·m are compressed; the rest ride uncompressed
    in P's all-reduce (torch posts a third, overlapped one; ours is synchronous, so same bytes, one
    latency fewer). Before ``start_iter`` everything is uncompressed. Q's seed and the error feedback
    over the whole bucket follow torch."""

    name, biased = "powersgd", True

    def __init__(self, rank: int = 1, warm_start: bool = True, start_iter: int = 0,
                 min_compression_rate: float = 2.0, epsilon: float = 0.0, **kw):
        super().__init__(**kw)
        self.rank, self.warm_start, self.start_iter = rank, warm_start, start_iter
        self.min_compression_rate, self.epsilon = min_compression_rate, epsilon
        self.rng = np.random.RandomState(self.seed)
        self.p: dict = {}  # per bucket, as torch keeps them: one flat P memory and one flat Q memory
        self.q: dict = {}  # (the views of each matrix's P and Q are cut from them, see _reduce)
        self.layout: dict = {}

    def state_tensors(self) -> list[torch.Tensor]:
        return super().state_tensors() + list(self.p.values()) + list(self.q.values())

    def forget(self, key) -> None:
        super().forget(key)
        for kept in (self.p, self.q, self.layout):
            kept.pop(key, None)

    def reduce(self, flat, shapes=None, key=0, op="grad"):
        if self.layout.get(key, None) not in (None, _layout(flat, shapes)):
            self.forget(key)  # DDP rebuilt its buckets: this one starts afresh
        if self.calls[key] < self.start_iter:  # plain all-reduce, no residual kept yet
            self.calls[key] += 1
            return Compressor._reduce(self, flat, shapes, key, op) or flat
        return super().reduce(flat, shapes, key, op)

    def split(self, flat, shapes):
        """(matrices to compress, grouped by shape as torch does; the other tensors' views)."""
        views, at = [], 0
        for shape in shapes:
            numel = int(np.prod(shape)) if len(shape) else 1
            views.append((flat[at:at + numel], tuple(shape)))
            at += numel
        by_shape, plain = defaultdict(list), []
        for v, shape in views:
            rows = shape[0] if shape else 1
            mat = v.view(rows, -1)
            r = min(*mat.shape, self.rank)
            if len(shape) > 1 and (mat.shape[0] + mat.shape[1]) * r * self.min_compression_rate < mat.numel():
                by_shape[mat.shape].append(mat)
            else:
                plain.append(v)
        return [m for group in by_shape.values() for m in group], plain

    def all_reduce_sizes(self, shapes) -> list[int]:
        """Elements of each ring all-reduce :meth:`_reduce` posts for a bucket of ``shapes``: P
        (rows·r per matrix) with the tensors left uncompressed, then Q (columns·r per matrix); one
        all-reduce of the whole bucket when no tensor is worth compressing."""
        numel = sum(int(np.prod(s)) if len(s) else 1 for s in shapes)
        mats, plain = self.split(torch.empty(numel), shapes)
        if not mats:
            return [numel]
        ranks = [min(*m.shape, self.rank) for m in mats]
        return [sum(v.numel() for v in plain) + sum(m.shape[0] * r for m, r in zip(mats, ranks)),
                sum(m.shape[1] * r for m, r in zip(mats, ranks))]

    def memories(self, mats, key, dtype, extra: int = 0):
        """Each matrix's P (n × r) and Q (m × r), views of the bucket's two flat memories (P's has
        ``extra`` elements more at its end, for the tensors that ride with P). A new bucket gets them,
        Q drawn from a normal distribution seeded as torch seeds it; later calls reuse them: Q is the
        last step's (the warm start), P is overwritten."""
        ranks = [min(*m.shape, self.rank) for m in mats]
        if not self.warm_start or key not in self.q:
            self.p[key] = torch.empty(sum(m.shape[0] * r for m, r in zip(mats, ranks)) + extra, dtype=dtype)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.rng.randint(1_000_000_000))
                self.q[key] = torch.cat([torch.randn(m.shape[1] * r, dtype=dtype)
                                         for m, r in zip(mats, ranks)])
        return (_cut(self.p[key], [(m.shape[0], r) for m, r in zip(mats, ranks)]),
                _cut(self.q[key], [(m.shape[1], r) for m, r in zip(mats, ranks)]))

    def _reduce(self, flat, shapes, key, op):
        n = _world()[1]
        mats, plain = self.split(flat, shapes)
        self.layout[key] = _layout(flat, shapes)
        if not mats:  # nothing worth compressing: the bucket is averaged as it is
            return Compressor._reduce(self, flat, shapes, key, op)
        extra = sum(v.numel() for v in plain)  # vectors and small matrices, uncompressed
        ps, qs = self.memories(mats, key, flat.dtype, extra)
        for m, p, q in zip(mats, ps, qs):
            torch.bmm(m.unsqueeze(0), orthogonalize(q, self.epsilon), out=p)  # P = M Q
        rest = self.p[key][self.p[key].numel() - extra:]
        if plain:
            torch.cat(plain, out=rest)
        self.all_reduce(self.p[key], op=op)  # adds in place: Σ M_i Q = (Σ M_i) Q, and the rest's sum
        if plain:
            rest.div_(n)
            torch.split_with_sizes_copy(rest, [v.numel() for v in plain], out=plain)
        for m, p, q in zip(mats, ps, qs):
            torch.bmm(m.unsqueeze(0).transpose(1, 2), orthogonalize(p, self.epsilon), out=q)  # Q = Mᵀ P
        self.all_reduce(self.q[key], op=op)
        self.q[key].div_(n)
        for m, p, q in zip(mats, ps, qs):
            torch.bmm(p, q.transpose(1, 2), out=m.unsqueeze(0))  # M ≈ P Qᵀ, written into the bucket
        return None  # error feedback keeps (gradient + old error) − the average, as torch does


def _cut(memory: torch.Tensor, shapes) -> list[torch.Tensor]:
    """Consecutive (1, rows, cols) views of a flat ``memory``."""
    out, at = [], 0
    for rows, cols in shapes:
        out.append(memory[at:at + rows * cols].view(1, rows, cols))
        at += rows * cols
    return out


def _layout(flat, shapes) -> tuple:
    return flat.numel(), tuple(tuple(s) for s in (shapes if shapes is not None else [flat.shape]))
