"""Chapter 2's exercises (notebooks/02_ring_allreduce.ipynb).

The reduce-scatter exercise runs the learner's loop on REAL ranks: :func:`run_reduce_scatter`
calls ``fn(chunks)`` on every rank of a warm cluster, where the learner exchanges chunks with the
ring neighbours through ``lesson_lib.comm.exchange`` (whose calls and bytes are counted), and the
check compares each rank's chunks with the sums ``dist.all_reduce`` computes on the same inputs.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from ..comm import ring_reduce_scatter
from ..comm.schedules import chunk_bounds
from ..costmodel import latency_crossover_bytes
from ..exercises import (
    Exercise,
    Property,
    Verdict,
    close_to,
    compare,
    judge,
    locally,
    mismatch,
    number,
    observe,
    on_ranks,
    solution_text,
    summary,
)
from ..runtime import WorkerError, WorkerMismatch, WorkerTimeout

# (world size, tensor length): lengths that do not divide evenly, and one shorter than the ring.
CASES = ((2, 7), (3, 10), (4, 13), (4, 3))
TIMEOUT_S = 10.0  # a learner's deadlock ends here, with the runtime saying where each rank waits


def run_reduce_scatter(fn: Callable, length: int, seed: int) -> dict:
    """On every rank: cut this rank's tensor into N chunks (views), run ``fn(chunks)``, and return
    the chunks of the tensor it was given, the list's entries afterwards (a learner may have
    rebound them), the library's sums of every chunk, and the communication ``fn`` made
    (:func:`~lesson_lib.exercises.observe`).

    Each rank's values are small integers, so sums are exact in any order.
    """
    rank, n = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    x = torch.randint(-9, 10, (length,), generator=g).float()
    total = x.clone()
    dist.all_reduce(total)  # the library's answer for every chunk
    bounds = chunk_bounds(length, n)
    chunks = [x[lo:hi] for lo, hi in bounds]
    with observe() as log:
        fn(chunks)
    return {"chunks": [x[lo:hi].clone() for lo, hi in bounds],
            "entries": [torch.as_tensor(t).detach().clone() for t in chunks],
            "total": [total[lo:hi] for lo, hi in bounds], "calls": log.as_data()["calls"],
            "chunk_bytes": 4 * max(hi - lo for lo, hi in bounds)}


def _owned(out: dict, key: str) -> list[int]:
    return [c for c, (mine, want) in enumerate(zip(out[key], out["total"]))
            if mine.shape == want.shape and mine.numel() and torch.equal(mine, want)]


def _owners(outs: list[dict], key: str = "chunks") -> list[int] | None:
    n = len(outs)
    empty = {c for c in range(n) if outs[0]["total"][c].numel() == 0}
    return _distinct_owners([_owned(o, key) for o in outs], n, empty)


def _point_to_point_only(outs: list[dict]) -> str | None:
    """A collective does the summing for you (a reviewer's: dist.all_reduce, then N − 1 idle sends)."""
    for r, o in enumerate(outs):
        other = [c["api"] for c in o["calls"] if c["op"] not in ("send", "recv", "exchange")]
        if other:
            return (f"rank {r} called {other[0]}: a collective then does the summing, and the ring is not "
                    "yours. This exercise builds reduce-scatter from point-to-point steps only")
    return None


def _steps(outs: list[dict]) -> str | None:
    n = len(outs)
    sends = [sum(c["op"] == "send" for c in o["calls"]) for o in outs]
    if sends == [n - 1] * n:
        return None
    made = "; ".join(f"rank {r}: {summary(o['calls'])}" for r, o in enumerate(outs))
    if not any(sends):
        return (f"no rank sent anything ({made}). This exercise builds the ring from point-to-point "
                "steps: comm.exchange(send_t, right, recv_t, left).wait() (or dist.isend + dist.irecv)")
    return f"the ranks sent {sends} messages ({made}); reduce-scatter takes exactly N − 1 = {n - 1} steps"


def _one_chunk_per_step(outs: list[dict]) -> str | None:
    for r, o in enumerate(outs):
        big = [c["bytes"] for c in o["calls"] if c["op"] == "send" and c["bytes"] > o["chunk_bytes"]]
        if big:
            return (f"rank {r} sent {big[0]:,} bytes in one step, more than a chunk ({o['chunk_bytes']:,} "
                    "bytes): each step sends one chunk, which is what makes the ring bandwidth-optimal")


def _summed_in_place(outs: list[dict]) -> str | None:
    if _owners(outs) is not None:
        return None
    if _owners(outs, "entries") is not None:
        return ("the sums are in new tensors your function put into the list (chunks[i] = ...), and the "
                "tensor the rank handed you is unchanged: add into the chunk in place (+= or .add_)")
    return (f"the chunks each rank holds summed over all ranks are {[_owned(o, 'chunks') for o in outs]} "
            "(by chunk index): each rank should own a different one. Which chunk arrives from the left at "
            "step s, and is it added to what you hold?")


def _unpaired(e: WorkerError) -> str:
    """What a ring's learner most likely did when a rank failed or the ranks waited for each other."""
    if isinstance(e, WorkerTimeout) or getattr(e, "waits", False):
        return "Does every rank post as many sends as its neighbour posts receives?"
    if isinstance(e, WorkerMismatch) or "SIGABRT" in str(e):  # a message that does not fit the receive
        return ("A receive buffer must have the size of the message that arrives (Gloo aborts a rank "
                "otherwise): is the chunk you receive into the one your left neighbour sends?")
    return ""


def _template_ellipsis(fn: Callable) -> bool:
    """Whether ``fn`` still holds the template's ``...`` as a value (``send_i = ...``), not as an index
    (``chunk[...] = chunk + incoming``, a right answer a reviewer wrote)."""
    import ast
    import inspect
    import textwrap

    if Ellipsis not in getattr(getattr(fn, "__code__", None), "co_consts", ()):
        return False
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return True  # no source to read: the constant alone decides
    indices = {id(node.slice) for node in ast.walk(tree) if isinstance(node, ast.Subscript)}
    return any(isinstance(node, ast.Constant) and node.value is Ellipsis and id(node) not in indices
               for node in ast.walk(tree))


def check_reduce_scatter(fn: Callable) -> Verdict:
    """Every rank must end owning one fully summed chunk of the tensor it was given, no two ranks the
    same, after exactly N−1 steps of one chunk each (the bandwidth-optimal count), for N = 2…4 and
    lengths not divisible by N."""
    if not callable(fn):
        return Verdict(False, "submit your function, e.g. ex.submit(my_reduce_scatter)")
    if _template_ellipsis(fn):
        # The template's "send_i = ..." would fail on every rank: say "not answered yet" instead.
        raise TypeError("the template's ... (an ellipsis) is still in the function")

    def case(n: int, length: int):
        return on_ranks(f"with N = {n} ranks and a tensor of {length} elements", n, run_reduce_scatter, fn,
                        length, n * 100 + length, timeout_s=TIMEOUT_S, advice=_unpaired)

    return judge([case(n, length) for n, length in CASES], [
        Property("point-to-point steps only", _point_to_point_only),
        Property("N − 1 steps", _steps),
        Property("of one chunk each", _one_chunk_per_step),
        Property("leave every rank owning a different chunk of its tensor, summed over all ranks",
                 _summed_in_place)])


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


def _reference_reduce_scatter():
    from .. import comm

    def my_reduce_scatter(chunks):
        rank, n = dist.get_rank(), dist.get_world_size()
        right, left = (rank + 1) % n, (rank - 1) % n
        for s in range(n - 1):
            send_i, into_i = (rank - s) % n, (rank - s - 1) % n
            incoming = torch.empty_like(chunks[into_i])
            comm.exchange(chunks[send_i], right, incoming, left).wait()
            chunks[into_i] += incoming

    return my_reduce_scatter


RING_BYTES_SIZES = (1e6, 4e8, 123_456_789.0)


def _ring_bytes_each(o: tuple[int, list]) -> str | None:
    n, returned = o
    for s, got in returned:
        got, want = number(got, "a number of bytes"), 2 * (n - 1) / n * s
        if not compare(got, want, abs_=1.0):  # whole bytes (floor division) are as right
            return mismatch(got, want, said=f"ring_bytes({n}, {s:g}) returned")
    return None


def check_ring_bytes(fn: Callable) -> Verdict:
    if not callable(fn):
        return Verdict(False, "submit a function ring_bytes(n, s)")
    cases = [locally(f"N = {n}", lambda n=n: (n, [(s, fn(n, s)) for s in RING_BYTES_SIZES]))
             for n in (1, 2, 3, 4, 8, 64, 1024)]
    return judge(cases, [Property("each rank sends 2(N−1)/N · S bytes", _ring_bytes_each)],
                 done="Just under 2·S per rank, however many ranks.")


def ring_bytes(n, s):
    return 2 * (n - 1) / n * s


def _check_crossover(answer, world_size: int, alpha: float, beta: float) -> Verdict:
    """S* within 2 %; the mistake that only shows at N ≠ 2 (the bandwidth term's /N dropped) named."""
    s_star = latency_crossover_bytes(world_size, alpha, beta)
    verdict = close_to(s_star, 0.02, " bytes")(answer)
    if not verdict.ok and world_size != 2 and compare(number(answer), 2 * alpha / beta, 0.02):
        return Verdict(False, f"{verdict.message.split(';')[0]}; that is 2α/β: the bandwidth term is "
                              "2(N−1)/N·S·β — did the /N go missing?")
    return verdict


def exercises(alpha: float, beta: float, world_size: int = 2) -> dict[str, Exercise]:
    """The chapter's exercises; ``alpha`` (s) and ``beta`` (s/byte) come from the notebook's fit."""
    s_star = latency_crossover_bytes(world_size, alpha, beta)
    return {
        "reduce_scatter": Exercise(
            key="reduce_scatter", title="write the reduce-scatter loop",
            prompt="Complete <code>my_reduce_scatter(chunks)</code>. It runs on every rank of a real "
                   "cluster; <code>chunks</code> is this rank's tensor cut into N pieces. At each step a "
                   "rank sends one chunk to its right neighbour and receives one from its left with "
                   "<code>comm.exchange(send_t, right, recv_t, left).wait()</code>, then adds what arrived "
                   "into its own copy of that chunk. After N−1 steps each rank must own one chunk summed "
                   "over all ranks (a different one per rank). The check runs your function on 2, 3 and 4 "
                   "ranks, on lengths that do not divide evenly, and compares with "
                   "<code>dist.all_reduce</code>.",
            check=check_reduce_scatter,
            hint="At step s, rank r sends chunk (r − s) mod N. What arrives from the left is the chunk the "
                 "left neighbour sent, so the chunk you add it into is the one you send at the next step.",
            solution=solution_text(_reference_reduce_scatter()),
            reference=_reference_reduce_scatter, also=(ring_reduce_scatter,)),
        "bytes": Exercise(
            key="bytes", title="bytes per rank",
            prompt="Write <code>ring_bytes(n, s)</code>: how many bytes does each of n ranks send in a ring "
                   "all-reduce of s bytes (ignore chunk rounding)? Then compare with the naive root's "
                   "2(n−1)·s for n = 64.",
            check=check_ring_bytes,
            hint="Two phases, each of n−1 steps; each step sends one chunk of s/n bytes.",
            solution=solution_text(ring_bytes), reference=lambda: ring_bytes),
        "crossover": Exercise(
            key="crossover", title="where latency stops dominating",
            prompt=f"With the α and β fitted above for N = {world_size} ranks (α = {alpha * 1e6:.1f} µs, β = "
                   f"{beta * 1e9:.3f} ns/byte), at which message size S* (bytes) does the ring's latency "
                   "term 2(N−1)α equal its bandwidth term 2(N−1)/N·S·β? Smaller messages are latency-bound "
                   "— which is why frameworks bucket gradients into messages of tens of MB (PyTorch DDP's "
                   "default <code>bucket_cap_mb=25</code>; Li et al., \"PyTorch Distributed\", VLDB 2020).",
            check=lambda a: _check_crossover(a, world_size, alpha, beta),
            hint="Set the two terms equal and solve for S; the 2(N−1) cancels.",
            solution=f"S* = N·α/β = {world_size} × {alpha:.3g} / {beta:.3g} ≈ {s_star:,.0f} bytes",
            reference=lambda: s_star),
    }
