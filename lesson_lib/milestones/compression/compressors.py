"""Gradient compressors (chapter 6).

``Compressor.reduce(flat, shapes, key)`` replaces this rank's flat gradient, in place, by the
average over the ranks of what they sent; traffic goes through :mod:`lesson_lib.comm`, so payload,
indices and scales are counted.

* ``none`` — ring all-reduce of float32.
* ``fp16`` / ``bf16`` — cast, all-reduce in 16 bits, cast back (like torch's ``fp16_compress_hook``;
  this bf16 one also runs on Gloo).
* ``topk`` — k largest magnitudes with error feedback (Strom, 2015; Aji & Heafield, 2017; Lin et al.,
  2018 without DGC's extras); per-rank indices, so (index, value) pairs are all-gathered.
* ``randomk`` — k coordinates chosen by a shared seed, so values add in place (Stich et al., 2018).
* ``qsgd`` — unbiased stochastic quantization per 512-element block (Alistarh et al., 2017),
  bit-packed (:func:`qsgd_width`); all-gathered.
* ``sign`` — scaled sign with error feedback (Seide et al., 2014; Bernstein et al., 2018;
  Karimireddy et al., 2019); all-gathered. ``sign-allreduce`` (:mod:`.allreduce`) all-reduces it.
* ``powersgd`` — in :mod:`.powersgd` (Vogels et al., 2019).

Why all-gather vs all-reduce matters as N grows: see docs/design.md, "Gradient compression".
Error feedback keeps what a rank did not send and adds it to the next gradient. ``algorithm="library"``
uses the backend's all-reduce (bytes modelled). :func:`~.milestone.make` picks a compressor by name.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist

from ... import comm

BLOCK = 512  # elements per QSGD norm / sign scale (QSGD's bucket size in Alistarh et al., 2017)


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


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

    def __init__(self, error_feedback: bool = True, seed: int = 0, algorithm: str = "ring"):
        if algorithm not in comm.ALGORITHMS:
            raise ValueError(f"algorithm must be one of {', '.join(comm.ALGORITHMS)}, got {algorithm!r}")
        self.error_feedback = bool(error_feedback) and self.biased
        self.seed = seed
        self.algorithm = algorithm  # how the all-reduced compressors all-reduce (all-gathers: our ring)
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

    def all_reduce(self, t: torch.Tensor, op: str) -> torch.Tensor:
        """SUM over the ranks in place, by ``algorithm``: our counted ring (the default), or the
        backend's (``library``: its bytes modelled, see :func:`lesson_lib.comm.all_reduce`), to time a
        compressor's own work against a peer that uses the backend's. Nothing on one rank (the
        single-process reference has no group)."""
        return comm.all_reduce(t, self.algorithm, op=op) if _world()[1] > 1 else t

    def state_tensors(self) -> list[torch.Tensor]:
        """What the compressor keeps between steps (error feedback's residuals), for memory reports."""
        return list(self.residual.values())

    def _reduce(self, flat, shapes, key, op):
        """Average in place; return what this rank's own message decodes to (for error feedback)."""
        n = _world()[1]
        self.all_reduce(flat, op=op)
        flat.div_(n)


class Cast(Compressor):
    """fp16 or bf16 on the wire: divide first (as torch's hook does, so fp16 does not overflow)."""

    def __init__(self, dtype: torch.dtype, **kw):
        super().__init__(**kw)
        self.dtype, self.name = dtype, {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]

    def _reduce(self, flat, shapes, key, op):
        half = flat.to(self.dtype).div_(_world()[1])
        self.all_reduce(half, op=op)
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
    """The k = ratio·S largest magnitudes (Strom, 2015; Aji & Heafield, 2017); (int32 index, float32
    value) pairs all-gathered: (N−1)·8k bytes sent per rank."""

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
        self.all_reduce(vals, op=op)
        flat.zero_()[idx] = vals / n
        return sent


def qsgd_width(bits: int) -> int:
    """Bits per packed code, what crosses per value: a sign and a level in 0..s (s = 2^bits − 1) are
    2s + 1 codes, which need bits + 1 bits, rounded up to 2, 4 or 8 (bits 1 → 2, 2–3 → 4, 4–7 → 8)."""
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
    """QSGD (Alistarh et al., 2017): ``bits`` sets s = 2^bits − 1 levels; ``width`` bits cross per value."""

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


def sign_bytes(numel: int) -> int:
    """Bytes of :func:`sign_encode` of ``numel`` values: a float32 scale per block, a bit per value."""
    return 4 * -(-numel // BLOCK) + -(-numel // 8)


def sign_encode(x: torch.Tensor) -> torch.Tensor:
    """The scaled sign of ``x`` as bytes: one float32 scale (mean |x|) per block, then one bit per
    element (1: x ≥ 0). Chapter 6's sign compressor and its compressed all-reduce send this."""
    b = _blocks(x)
    counts = (x.numel() - BLOCK * torch.arange(b.shape[0])).clamp(max=BLOCK)  # padding is not counted
    return torch.cat([(b.abs().sum(1) / counts).view(torch.uint8), pack_bits(x >= 0, 1)])


def sign_decode(msg: torch.Tensor, numel: int) -> torch.Tensor:
    """What :func:`sign_encode` sent: scale·(±1) for each of ``numel`` elements."""
    nb = 4 * -(-numel // BLOCK)
    sign = _blocks(unpack_bits(msg[nb:], 1, numel) * 2 - 1)
    return (msg[:nb].clone().view(torch.float32).unsqueeze(1) * sign).view(-1)[:numel]  # clone: align


class Sign(Compressor):
    """One bit per element, one scale (mean |x|) per block: δ = scale·sign(x) (1-bit SGD, Seide et al.,
    2014; with this scale and error feedback, EF-SignSGD, Karimireddy et al., 2019); all-gathered.
    :class:`~.allreduce.SignAllReduce` sends the same code through a compressed all-reduce."""

    name, biased = "sign", True

    def _reduce(self, flat, shapes, key, op):
        rank, n = _world()
        rows = all_gather_bytes(sign_encode(flat), op)
        sent = sign_decode(rows[rank], flat.numel())
        flat.zero_()
        for row in rows:
            flat.add_(sign_decode(row, flat.numel()))
        flat.div_(n)
        return sent
