"""Chapter 2's exercises, checked in the notebook kernel (notebooks/02_ring_allreduce.ipynb).

A function written in a notebook cell cannot be sent to spawned workers, so the reduce-scatter
exercise runs the learner's loop on N *simulated* ranks: N threads of this process, each with its
own chunks, joined in a ring by mailboxes. ``exchange(t)`` sends ``t`` to the right neighbour and
returns what the left neighbour sent — the same contract as ``lesson_lib.comm.exchange`` in the
real ring (and, like a real ring, a rank that waits for a message nobody sends times out).
"""

from __future__ import annotations

import queue
import threading
from typing import Callable

import torch

from ..costmodel import latency_crossover_bytes
from ..exercises import Exercise, Verdict, close_to
from ..schedules import chunk_bounds, ring_schedule


def simulate_ring(fn: Callable, n: int, length: int, seed: int = 0, timeout_s: float = 2.0) -> dict:
    """Run ``fn(rank, n, chunks, exchange)`` on ``n`` simulated ranks; their chunks and traffic.

    Each rank's values are small integers, so sums are exact in any order.
    """
    g = torch.Generator().manual_seed(seed)
    values = [torch.randint(-9, 10, (length,), generator=g).double() for _ in range(n)]
    bounds = chunk_bounds(length, n)
    chunks = [[v[lo:hi].clone() for lo, hi in bounds] for v in values]
    boxes = [queue.Queue() for _ in range(n)]
    sent = [0] * n
    errors: dict[int, str] = {}

    def run(rank: int) -> None:
        def exchange(t: torch.Tensor) -> torch.Tensor:
            sent[rank] += 1
            boxes[(rank + 1) % n].put(t.clone())
            try:
                return boxes[rank].get(timeout=timeout_s)
            except queue.Empty:
                raise TimeoutError(f"rank {rank} waited {timeout_s:g} s for its left neighbour, which sent "
                                   "nothing: do all ranks call exchange equally often?") from None

        try:
            fn(rank, n, chunks[rank], exchange)
        except Exception as e:  # reported as feedback, not raised in a thread
            errors[rank] = f"{type(e).__name__}: {e}"

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s * (2 * n + 2))
    total = torch.stack(values).sum(0)
    return {"chunks": chunks, "total": [total[lo:hi] for lo, hi in bounds], "sent": sent, "errors": errors}


def reference_reduce_scatter(rank: int, n: int, chunks: list, exchange: Callable) -> None:
    """The schedule the real ring runs (``schedules.ring_schedule``): send chunk r−s, add into r−s−1."""
    for st in ring_schedule(n):
        if st.rank == rank and st.phase == "reduce-scatter":
            chunks[st.recv_chunk] += exchange(chunks[st.send_chunk])


def check_reduce_scatter(fn: Callable) -> Verdict:
    """Every rank must end owning one fully summed chunk, no two ranks the same, after exactly N−1
    exchanges (the bandwidth-optimal count), for several N and lengths not divisible by N."""
    if not callable(fn):
        return Verdict(False, "submit your function, e.g. ex.submit(my_reduce_scatter)")
    for n, length in ((2, 6), (3, 10), (4, 13), (5, 7), (4, 3)):
        out = simulate_ring(fn, n, length, seed=n * 100 + length)
        if out["errors"]:
            r = min(out["errors"])
            return Verdict(False, f"with N={n}, rank {r} raised {out['errors'][r]}")
        if any(s != n - 1 for s in out["sent"]):
            return Verdict(False, f"with N={n} the ranks called exchange {out['sent']} times; "
                                  f"reduce-scatter takes exactly N−1 = {n - 1} steps")
        owned = []
        for r in range(n):
            full = [c for c in range(n) if torch.equal(out["chunks"][r][c], out["total"][c])
                    and out["total"][c].numel() and out["chunks"][r][c].numel()]
            owned.append(full)
        empty = {c for c in range(n) if out["total"][c].numel() == 0}
        picks = _distinct_owners(owned, n, empty)
        if picks is None:
            return Verdict(False, f"with N={n} (length {length}) the fully summed chunks per rank are "
                                  f"{owned}: each rank should own a different one")
    return Verdict(True, "every rank owns a different fully summed chunk after N−1 steps, for N = 2…5")


def _distinct_owners(owned: list[list[int]], n: int, empty: set) -> list[int] | None:
    """A choice of one summed chunk per rank, all different (empty chunks count as summed)."""
    options = [set(o) | empty for o in owned]

    def pick(r: int, used: set) -> list[int] | None:
        if r == n:
            return []
        for c in sorted(options[r] - used):
            rest = pick(r + 1, used | {c})
            if rest is not None:
                return [c, *rest]
        return None

    return pick(0, set())


def check_ring_bytes(fn: Callable) -> Verdict:
    if not callable(fn):
        return Verdict(False, "submit a function ring_bytes(n, s)")
    for n in (1, 2, 3, 4, 8, 64, 1024):
        for s in (1e6, 4e8, 123_456_789.0):
            want = 2 * (n - 1) / n * s
            got = float(fn(n, s))
            if abs(got - want) > 1e-9 * max(want, 1.0):
                return Verdict(False, f"ring_bytes({n}, {s:g}) returned {got:g}; expected {want:g}")
    return Verdict(True, "2(N−1)/N · S: just under 2·S per rank, however many ranks")


def exercises(alpha: float, beta: float, world_size: int = 2) -> dict[str, Exercise]:
    """The chapter's exercises; ``alpha`` (s) and ``beta`` (s/byte) come from the notebook's fit."""
    s_star = latency_crossover_bytes(world_size, alpha, beta)
    return {
        "reduce_scatter": Exercise(
            "reduce_scatter", "write the reduce-scatter loop",
            "Complete <code>my_reduce_scatter(rank, n, chunks, exchange)</code>. <code>chunks</code> is this "
            "rank's list of n tensors; <code>exchange(t)</code> sends <code>t</code> to rank+1 and returns "
            "what rank−1 sent. After the loop each rank must own one chunk summed over all ranks (a "
            "different one per rank), using exactly n−1 exchanges. The check runs your function on n "
            "simulated ranks (threads) for n = 2…5.",
            check_reduce_scatter,
            "At step s, rank r sends chunk (r − s) mod n and adds what arrives into chunk (r − s − 1) mod n: "
            "the chunk it just received is the one it sends next.",
            "def my_reduce_scatter(rank, n, chunks, exchange):\n"
            "    for s in range(n - 1):\n"
            "        incoming = exchange(chunks[(rank - s) % n])\n"
            "        chunks[(rank - s - 1) % n] += incoming",
            lambda: reference_reduce_scatter),
        "bytes": Exercise(
            "bytes", "bytes per rank",
            "Write <code>ring_bytes(n, s)</code>: how many bytes does each of n ranks send in a ring "
            "all-reduce of s bytes (ignore chunk rounding)? Then compare with the naive root's "
            "2(n−1)·s for n = 64.",
            check_ring_bytes,
            "Two phases, each of n−1 steps; each step sends one chunk of s/n bytes.",
            "def ring_bytes(n, s):\n    return 2 * (n - 1) / n * s",
            lambda: (lambda n, s: 2 * (n - 1) / n * s)),
        "crossover": Exercise(
            "crossover", "where latency stops dominating",
            f"With the α and β fitted above for N = {world_size} ranks (α = {alpha * 1e6:.1f} µs, "
            f"β = {beta * 1e9:.3f} ns/byte), at which message size S* (bytes) does the ring's latency term "
            "2(N−1)α equal its bandwidth term 2(N−1)/N·S·β? Smaller messages are latency-bound — which is "
            "why frameworks bucket gradients into messages of tens of MB.",
            close_to(s_star, 0.02, " bytes"),
            "Set the two terms equal and solve for S; the 2(N−1) cancels.",
            f"S* = N·α/β = {world_size} × {alpha:.3g} / {beta:.3g} ≈ {s_star:,.0f} bytes",
            lambda: s_star),
    }
