"""PowerSGD (chapter 6): a rank-r approximation M ≈ P Qᵀ of each gradient matrix by one power
iteration, warm-started from the last step's Q, with error feedback (Vogels et al., NeurIPS 2019).
Laid out like torch's ``powerSGD_hook`` (same options, same defaults) so that the two can be compared
(``python -m lesson_lib bench compression``); :func:`~.milestone.make` builds it by name.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from .compressors import Compressor, _world, ring_all_reduce


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

    A tensor is compressed when it is a matrix (1-D tensors never are) and (n + m)·r·
    ``min_compression_rate`` < n·m; the others travel uncompressed in one ring all-reduce. Before
    ``start_iter`` calls the whole bucket travels uncompressed. Q starts from a normal draw seeded
    as torch seeds it. Error feedback covers the whole bucket, as in torch.
    """

    name, biased = "powersgd", True

    def __init__(self, rank: int = 1, warm_start: bool = True, start_iter: int = 0,
                 min_compression_rate: float = 2.0, epsilon: float = 0.0, **kw):
        super().__init__(**kw)
        self.rank, self.warm_start, self.start_iter = rank, warm_start, start_iter
        self.min_compression_rate, self.epsilon = min_compression_rate, epsilon
        self.rng = np.random.RandomState(self.seed)
        self.q: dict = {}

    def state_tensors(self) -> list[torch.Tensor]:
        return super().state_tensors() + [q for qs in self.q.values() for q in qs]

    def forget(self, key) -> None:
        super().forget(key)
        self.q.pop(key, None)

    def reduce(self, flat, shapes=None, key=0, op="grad"):
        if key in self.q and sum(q.shape[1] for q in self.q[key]) > flat.numel():
            self.forget(key)
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

    def _reduce(self, flat, shapes, key, op):
        n = _world()[1]
        mats, plain = self.split(flat, shapes)
        if plain:
            rest = torch.cat(plain)
            ring_all_reduce(rest, op=op)
            rest.div_(n)
            at = 0
            for v in plain:
                v.copy_(rest[at:at + v.numel()])
                at += v.numel()
        if not mats:
            return None
        ranks = [min(*m.shape, self.rank) for m in mats]
        if not self.warm_start or key not in self.q:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.rng.randint(1_000_000_000))
                self.q[key] = [torch.randn(1, m.shape[1], r, dtype=flat.dtype) for m, r in zip(mats, ranks)]
        qs = [orthogonalize(q, self.epsilon) for q in self.q[key]]
        p_flat = torch.cat([torch.bmm(m.unsqueeze(0), q).view(-1) for m, q in zip(mats, qs)])
        ring_all_reduce(p_flat, op=op)  # P = M Q adds in place: Σ M_i Q = (Σ M_i) Q
        ps, at = [], 0
        for m, r in zip(mats, ranks):
            ps.append(orthogonalize(p_flat[at:at + m.shape[0] * r].view(1, m.shape[0], r), self.epsilon))
            at += m.shape[0] * r
        q_flat = torch.cat([torch.bmm(m.unsqueeze(0).transpose(1, 2), p).view(-1) for m, p in zip(mats, ps)])
        ring_all_reduce(q_flat, op=op)
        q_flat.div_(n)
        at = 0
        for i, (m, p, r) in enumerate(zip(mats, ps, ranks)):
            q = q_flat[at:at + m.shape[1] * r].view(1, m.shape[1], r)
            at += m.shape[1] * r
            torch.bmm(p, q.transpose(1, 2), out=m.unsqueeze(0))  # M ≈ P Qᵀ, written into the bucket
            self.q[key][i] = q.clone()
        return None  # error feedback keeps (gradient + old error) − the average, as torch does
