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
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch
import torch.distributed as dist

from . import comm

COMPRESSORS = ("none", "fp16", "bf16", "topk", "randomk", "qsgd", "sign", "powersgd")
BLOCK = 512  # elements per QSGD norm / sign scale (QSGD's bucket size in Alistarh et al., 2017)


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def ring_all_reduce(t: torch.Tensor, op: str) -> torch.Tensor:
    """Our counted ring SUM, or nothing on one rank (the single-process reference has no group)."""
    return comm.ring_all_reduce(t, op=op) if _world()[1] > 1 else t


def all_gather_bytes(payload: torch.Tensor, op: str) -> torch.Tensor:
    """Every rank's ``payload`` (same length everywhere), as rows of a (world, bytes) uint8 tensor.

    Our ring all-gather over one flat byte buffer: each rank sends (N−1) payloads, counted exactly.
    """
    rank, n = _world()
    raw = payload.contiguous().view(-1).view(torch.uint8)
    buf = torch.empty(n * raw.numel(), dtype=torch.uint8)
    buf[rank * raw.numel():(rank + 1) * raw.numel()] = raw
    if n > 1:
        comm.ring_all_gather(buf, op=op)
    return buf.view(n, raw.numel())


def pack_bits(codes: torch.Tensor, width: int) -> torch.Tensor:
    """Codes in [0, 2^width) (width 1, 2, 4 or 8), ``8 // width`` of them per byte."""
    per = 8 // width
    c = torch.nn.functional.pad(codes.to(torch.int32), (0, -codes.numel() % per)).view(-1, per)
    return (c << (torch.arange(per, dtype=torch.int32) * width)).sum(1).to(torch.uint8)


def unpack_bits(packed: torch.Tensor, width: int, numel: int) -> torch.Tensor:
    per = 8 // width
    shifts = torch.arange(per, dtype=torch.int32) * width
    return ((packed.to(torch.int32).unsqueeze(1) >> shifts) & (2**width - 1)).view(-1)[:numel]


def _blocks(x: torch.Tensor) -> torch.Tensor:
    """``x`` zero-padded to whole blocks, as a (blocks, BLOCK) view."""
    return torch.nn.functional.pad(x, (0, -x.numel() % BLOCK)).view(-1, BLOCK)


class Compressor:
    """Averages a flat gradient over the ranks; subclasses say how it travels (``_reduce``)."""

    name = "none"
    biased = False  # compressors that drop information use error feedback when it is on

    def __init__(self, error_feedback: bool = True, seed: int = 0):
        self.error_feedback = bool(error_feedback) and self.biased
        self.seed = seed
        self.residual: dict = {}
        self.calls: dict = defaultdict(int)

    def reduce(self, flat: torch.Tensor, shapes=None, key=0, op: str = "grad") -> torch.Tensor:
        """In place: ``flat`` becomes the ranks' average of what they sent. Returns ``flat``."""
        if key in self.residual and self.residual[key].numel() != flat.numel():
            self.forget(key)  # DDP rebuilt its buckets (after its first step): start this one afresh
        if self.error_feedback and key in self.residual:
            flat.add_(self.residual[key])  # what earlier steps did not send
        before = flat.clone() if self.error_feedback else None
        sent = self._reduce(flat, list(shapes) if shapes is not None else [flat.shape], key, op)
        if self.error_feedback:
            self.residual[key] = before - (flat if sent is None else sent)
        self.calls[key] += 1
        return flat

    def forget(self, key) -> None:
        self.residual.pop(key, None)

    def state_tensors(self) -> list[torch.Tensor]:
        """What the compressor keeps between steps (error feedback's residuals), for memory reports."""
        return list(self.residual.values())

    def _reduce(self, flat, shapes, key, op):
        """Average in place; return what this rank's own message decodes to (for error feedback)."""
        n = _world()[1]
        ring_all_reduce(flat, op=op)
        flat.div_(n)


class Cast(Compressor):
    """fp16 or bf16 on the wire: divide first (as torch's hook does, so fp16 does not overflow)."""

    def __init__(self, dtype: torch.dtype, **kw):
        super().__init__(**kw)
        self.dtype, self.name = dtype, {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]

    def _reduce(self, flat, shapes, key, op):
        half = flat.to(self.dtype).div_(_world()[1])
        ring_all_reduce(half, op=op)
        flat.copy_(half)


class _Sparse(Compressor):
    """What top-k and random-k share: they send k = ratio·S coordinates (at least one)."""

    biased = True

    def __init__(self, ratio: float = 0.01, **kw):
        super().__init__(**kw)
        self.ratio = ratio

    def k(self, flat: torch.Tensor) -> int:
        return max(1, round(self.ratio * flat.numel()))


class TopK(_Sparse):
    """The k = ratio·S largest magnitudes; (int32 index, float32 value) pairs all-gathered."""

    name = "topk"

    def _reduce(self, flat, shapes, key, op):
        n = _world()[1]
        k = self.k(flat)
        idx = flat.abs().topk(k, sorted=False).indices
        vals = flat[idx]
        rows = all_gather_bytes(torch.cat([idx.to(torch.int32).view(torch.uint8),
                                           vals.view(torch.uint8)]), op)
        sent = torch.zeros_like(flat).index_put_((idx,), vals)
        flat.zero_()
        for row in rows:  # every rank's pairs, added where they land
            flat.index_add_(0, row[:4 * k].view(torch.int32).long(), row[4 * k:].view(flat.dtype))
        flat.div_(n)
        return sent


class RandomK(_Sparse):
    """k random coordinates chosen alike on every rank (shared seed): they add in place."""

    name = "randomk"

    def _reduce(self, flat, shapes, key, op):
        n = _world()[1]
        k = self.k(flat)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.calls[key])
        idx = torch.randperm(flat.numel(), generator=g)[:k]
        vals = flat[idx]
        sent = torch.zeros_like(flat).index_put_((idx,), vals)
        ring_all_reduce(vals, op=op)
        flat.zero_()[idx] = vals / n
        return sent


def qsgd_width(bits: int) -> int:
    """Bits per packed code: a sign and a level in 0..2^bits−1 → 2s+1 codes, rounded up to 2/4/8."""
    return next(w for w in (2, 4, 8) if 2 ** (bits + 1) - 1 <= 2**w)


def qsgd_quantize(x: torch.Tensor, levels: int, generator=None) -> tuple[torch.Tensor, torch.Tensor]:
    """QSGD per block: (norms, integer levels in [−s, s]) with E[norm·level/s] = x (unbiased)."""
    b = _blocks(x)
    norms = b.norm(dim=1)
    scaled = b.abs() / norms.clamp_min(torch.finfo(x.dtype).tiny).unsqueeze(1) * levels
    low = scaled.floor()
    up = torch.rand(scaled.shape, generator=generator) < (scaled - low)  # round up with prob. frac
    return norms, (torch.sign(b) * (low + up)).to(torch.int32)


def qsgd_dequantize(norms, q, levels: int, numel: int) -> torch.Tensor:
    return (norms.unsqueeze(1) * q / levels).view(-1)[:numel]


class QSGD(Compressor):
    name = "qsgd"

    def __init__(self, bits: int = 4, **kw):
        super().__init__(**kw)
        self.bits, self.levels, self.width = bits, 2**bits - 1, qsgd_width(bits)
        self.generator = torch.Generator().manual_seed(self.seed * 1_000_003 + 7919 * _world()[0])

    def _reduce(self, flat, shapes, key, op):
        n, s = _world()[1], self.levels
        norms, q = qsgd_quantize(flat, s, self.generator)
        nb = norms.numel() * 4
        codes = (q + s).view(-1)[:flat.numel()]  # the block padding does not travel
        rows = all_gather_bytes(torch.cat([norms.view(torch.uint8), pack_bits(codes, self.width)]), op)
        flat.zero_()
        for row in rows:
            codes = _blocks(unpack_bits(row[nb:], self.width, flat.numel()) - s)
            norms_r = row[:nb].clone().view(torch.float32)  # a row may start off a 4-byte boundary
            flat.add_(qsgd_dequantize(norms_r, codes, s, flat.numel()))
        flat.div_(n)


class Sign(Compressor):
    """One bit per element, one scale (mean |x|) per block: δ = scale·sign(x)."""

    name, biased = "sign", True

    def _reduce(self, flat, shapes, key, op):
        rank, n = _world()
        b = _blocks(flat)
        counts = torch.full((b.shape[0],), float(BLOCK))
        counts[-1] = flat.numel() - (b.shape[0] - 1) * BLOCK  # padding does not count in a mean
        scales = b.abs().sum(1) / counts
        nb = scales.numel() * 4
        rows = all_gather_bytes(torch.cat([scales.view(torch.uint8), pack_bits(flat >= 0, 1)]), op)

        def decode(row):
            sign = _blocks(unpack_bits(row[nb:], 1, flat.numel()) * 2 - 1)
            return (row[:nb].clone().view(torch.float32).unsqueeze(1) * sign).view(-1)[:flat.numel()]

        sent = decode(rows[rank])
        flat.zero_()
        for row in rows:
            flat.add_(decode(row))
        flat.div_(n)
        return sent


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
