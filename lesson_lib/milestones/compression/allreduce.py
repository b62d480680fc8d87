"""A compressed all-reduce (chapter 6): 1-bit Adam's (Tang et al., 2021), with the scaled sign code
(:func:`~.compressors.sign_encode`).

The gradient is cut into N chunks of whole blocks. Each rank compresses every chunk (worker
residual) and sends chunk j to rank j; rank j averages the N codes, adds its server residual and
re-compresses; the compressed averages are all-gathered. The busiest rank sends about 2(N−1)/N·P
(:func:`busiest_bytes`), against (N−1)·P for the all-gathered ``sign``. :func:`simulate` is the
one-process reference.
"""

from __future__ import annotations

import torch

from ... import comm
from ...metrics import counters
from .compressors import BLOCK, Compressor, _world, sign_bytes, sign_decode, sign_encode


def block_chunks(numel: int, n: int) -> list[tuple[int, int]]:
    """Rank j's chunk of ``numel`` elements, in whole blocks, as even as
    :func:`lesson_lib.comm.chunk_bounds` makes them."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a number of ranks >= 1, got {n!r}")
    blocks = -(-numel // BLOCK)
    return [(min(a * BLOCK, numel), min(b * BLOCK, numel)) for a, b in comm.chunk_bounds(blocks, n)]


def all_to_all(sends: list[torch.Tensor], recvs: list[torch.Tensor], op: str) -> None:
    """``sends[j]`` goes to rank j, ``recvs[i]`` comes from rank i, in N−1 rounds of pairwise
    exchanges (round s: to r+s, from r−s), counted under ``op``."""
    rank, n = _world()
    recvs[rank].copy_(sends[rank])
    for s in range(1, n):
        to, frm = (rank + s) % n, (rank - s) % n
        comm.exchange(sends[to], to, recvs[frm], frm, op=op + ".step").wait()
    steps = counters().ops.pop(op + ".step", None)  # one call of ``op``, as the ring records its steps
    if steps is not None:
        counters().record(op, steps.bytes_sent, steps.bytes_recv, steps.seconds)


def busiest_bytes(numel: int, n: int) -> int:
    """Bytes the busiest rank sends in :class:`SignAllReduce` of ``numel`` elements on ``n`` ranks
    (exact): its N−1 foreign chunks once (P − p_r) and its compressed average N−1 times."""
    p = [sign_bytes(b - a) for a, b in block_chunks(numel, n)]
    return 0 if n == 1 else sum(p) + (n - 2) * max(p)


class SignAllReduce(Compressor):
    """Scaled signs through a compressed all-reduce, error feedback on both sides (Tang et al., 2021)."""

    name, biased = "sign-allreduce", True

    def __init__(self, **kw):
        super().__init__(**kw)
        self.server: dict = {}  # key → this rank's server residual (its chunk only)

    def _reduce(self, flat, shapes, key, op):
        rank, n = _world()
        chunks = block_chunks(flat.numel(), n)
        mine = [sign_encode(flat[a:b]) for a, b in chunks]  # worker: flat already holds its residual
        theirs = [torch.empty_like(mine[rank]) for _ in range(n)]
        all_to_all(mine, theirs, op)  # chunk j to rank j; every rank's code of my chunk to me
        a, b = chunks[rank]
        avg = sum(sign_decode(t, b - a) for t in theirs) / n  # server: the average of my chunk
        if self.error_feedback:
            avg += self.server.get(key, 0)
        code = sign_encode(avg)
        if self.error_feedback:
            self.server[key] = avg - sign_decode(code, b - a)  # what the second code did not say
        sums = [torch.empty(sign_bytes(hi - lo), dtype=torch.uint8) for lo, hi in chunks]
        all_to_all([code] * n, sums, op)  # all-gather of the compressed averages
        flat.copy_(torch.cat([sign_decode(s, hi - lo) for s, (lo, hi) in zip(sums, chunks)]))
        return torch.cat([sign_decode(m, hi - lo) for m, (lo, hi) in zip(mine, chunks)])  # sent

    def forget(self, key) -> None:
        super().forget(key)
        self.server.pop(key, None)

    def state_tensors(self) -> list[torch.Tensor]:
        return super().state_tensors() + list(self.server.values())


def simulate(grads: list[list[torch.Tensor]], error_feedback: bool = True) -> list[torch.Tensor]:
    """:class:`SignAllReduce` for N ranks in one process: ``grads[step][rank]`` → the average every
    rank ends each step with. The same codes and sums in the same order, so equal bit for bit."""
    n, numel = len(grads[0]), grads[0][0].numel()
    chunks = block_chunks(numel, n)
    worker = [torch.zeros(numel) for _ in range(n)]
    server = [torch.zeros(b - a) for a, b in chunks]
    outs = []
    for step in grads:
        if len(step) != n or any(g.numel() != numel for g in step):
            raise ValueError(f"grads must hold {n} gradients of {numel} elements at every step")
        acc = [g + e for g, e in zip(step, worker)] if error_feedback else [g.clone() for g in step]
        codes = [[sign_encode(x[a:b]) for a, b in chunks] for x in acc]  # codes[i][j]: rank i, chunk j
        if error_feedback:
            worker = [x - torch.cat([sign_decode(c, b - a) for c, (a, b) in zip(cs, chunks)])
                      for x, cs in zip(acc, codes)]
        out = []
        for j, (a, b) in enumerate(chunks):
            avg = sum(sign_decode(codes[i][j], b - a) for i in range(n)) / n
            if error_feedback:
                avg = avg + server[j]
            code = sign_encode(avg)
            if error_feedback:
                server[j] = avg - sign_decode(code, b - a)
            out.append(sign_decode(code, b - a))
        outs.append(torch.cat(out))
    return outs
