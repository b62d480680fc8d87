"""The ring, played by the room: every learner's kernel is one rank and runs its own reduce-scatter
step, chapter 2's exercise (``notebooks/02_ring_allreduce.ipynb``, ``ch02_exercises``).

A learner submits ``step(rank, n, s) -> (send_i, into_i)``: at step ``s`` rank ``rank`` sends its
chunk ``send_i`` to the right and adds what arrives from the left into chunk ``into_i``. The room's
loop around it does the exchange with ``dist.isend``/``dist.irecv`` and records every hop (what was
sent, to whom, its time and bytes), so the instructor's check can name the first wrong partial sum
and who sent it. Chunks are all the same length, so a wrong index never makes a message of the wrong
size (Gloo aborts the receiving process then, which would be a neighbour's kernel).
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist

from .rank import RankContext

CHUNK = 4  # elements per chunk: small integers, so every partial sum is exact
TAG = 6000  # the room's hops carry their own tag: a stray send in a learner's step is never matched
# with them (a message of the wrong size would make Gloo abort the receiving kernel, a neighbour's)


def reference_step(rank: int, n: int, s: int) -> tuple[int, int]:
    """Chapter 2's schedule: send the chunk that arrived last step, add into the next one."""
    return (rank - s) % n, (rank - s - 1) % n


def inputs(seed: int, rank: int, n: int) -> torch.Tensor:
    """Rank ``rank``'s tensor: n chunks of small integers."""
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    return torch.randint(-9, 10, (n * CHUNK,), generator=g).float()


def learner(ctx: RankContext) -> dict:
    """One learner's rank: N − 1 hops, each with the learner's own step."""
    n, r = ctx.world, ctx.rank
    step = ctx.submitted.get("ring") or reference_step
    x = inputs(ctx.opts.get("seed", 0), r, n)
    chunks = list(x.clone().view(n, CHUNK))  # views into one tensor: added into in place
    right, left = (r + 1) % n, (r - 1) % n
    timeout = timedelta(seconds=ctx.opts.get("timeout_s", 20))
    hops = []
    for s in range(n - 1):
        ctx.status("computing", hop=s)
        send_i, into_i = step(r, n, s)  # the learner's own code
        for what, i in (("send_i", send_i), ("into_i", into_i)):
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
                raise ValueError(f"your step returned {what} = {i!r} at step {s}: a chunk index 0..{n - 1}")
        out, incoming = chunks[send_i].clone(), torch.empty(CHUNK)
        ctx.status("waiting", ctx.names[left], hop=s)
        started = time.perf_counter()
        sent = dist.isend(out, right, tag=TAG + s)
        dist.irecv(incoming, left, tag=TAG + s).wait(timeout)
        sent.wait(timeout)
        hops.append({"s": s, "to": right, "from": left, "send_i": send_i, "into_i": into_i,
                     "sent": out.tolist(), "received": incoming.tolist(),
                     "seconds": time.perf_counter() - started, "bytes": out.numel() * out.element_size()})
        chunks[into_i] += incoming
    ctx.status("done")
    return {"x": x.tolist(), "final": [c.tolist() for c in chunks], "hops": hops}


def check(names: list[str], results: dict[str, dict]) -> dict:
    """Judge a ring round from what each rank reported, against sums worked here from the inputs.

    Returns ``{"ok", "verdict", "wrong": {"learner", "step", "chunk"} | None, "hops": [...]}``. A
    correct rank r sends, at step s, chunk (r − s) mod n summed over ranks r − s … r; the first
    message (by step, then rank) that is not that sum is the wrong hop, and its sender is named. If
    every message was right, each rank r must end holding chunk (r + 1) mod n summed over all ranks.
    """
    n = len(names)
    xs = [torch.tensor(results[m]["x"]).view(n, CHUNK) for m in names]
    total = sum(xs)
    hops = []
    for r, m in enumerate(names):
        for h in results[m]["hops"]:
            hops.append({**h, "rank": r, "learner": m, "to_learner": names[h["to"]]})
    hops.sort(key=lambda h: (h["s"], h["rank"]))
    for h in hops:
        r, s = h["rank"], h["s"]
        c = (r - s) % n
        want = sum(xs[(r - k) % n][c] for k in range(s + 1))
        if not torch.equal(torch.tensor(h["sent"]), want):
            over = ", ".join(names[(r - k) % n] for k in reversed(range(s + 1)))
            sent_i = h["send_i"]
            why = (f"it sent chunk {sent_i}, not chunk {c}" if sent_i != c else
                   "it sent the right chunk, but the partial sum it held was not added into it")
            verdict = (f"wrong hop: at step {s} {h['learner']} sent {h['to_learner']} the partial sum "
                       f"{_short(h['sent'])}, which should be chunk {c} summed over {over} = "
                       f"{_short(want.tolist())} ({why}). Every earlier message was right, so the "
                       f"first wrong partial sum came from {h['learner']}.")
            wrong = {"learner": h["learner"], "step": s, "chunk": c}
            return {"ok": False, "verdict": verdict, "wrong": wrong, "hops": hops}
    for r, m in enumerate(names):
        c = (r + 1) % n
        if not torch.equal(torch.tensor(results[m]["final"][c]), total[c]):
            last = results[m]["hops"][-1]["into_i"] if results[m]["hops"] else None
            verdict = (f"wrong hop: {m} ends without chunk {c} summed over the room "
                       f"({_short(results[m]['final'][c])} ≠ {_short(total[c].tolist())}); at its last step "
                       f"it added what arrived into chunk {last}, not {c}.")
            return {"ok": False, "verdict": verdict, "wrong": {"learner": m, "step": n - 2, "chunk": c},
                    "hops": hops}
    return {"ok": True, "wrong": None, "hops": hops,
            "verdict": f"the ring is right: every one of the {len(hops)} messages was the partial sum it "
                       f"should be, and each of the {n} learners holds one chunk of the room's sum."}


def _short(values) -> str:
    return "[" + ", ".join(f"{v:g}" for v in values) + "]"
