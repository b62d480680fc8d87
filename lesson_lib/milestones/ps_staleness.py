"""Stale synchronous parallel (Ho et al., NeurIPS 2013): when an asynchronous parameter server lets a
worker go on (chapter 1, §4).

A worker's *clock* is the number of gradients it has pushed. With a staleness bound s the server
applies every gradient the moment it arrives, as asynchronous training does, but it sends a worker
its parameters back only while that worker's clock is at most s ahead of the slowest live worker's;
otherwise the worker waits until the slowest catches up. So no worker ever computes more than s
steps ahead of the slowest: s = 0 goes round by round, as synchronous training does (each gradient
is still applied on its own), and an unbounded s (−1 here) is plain asynchronous training. Li et
al. (OSDI 2014, §3) offered the same choice as "bounded delay" consistency.
"""

from __future__ import annotations

from typing import Callable


def release(held: list[int], pushes: list[int], lost: set[int], bound: int, steps: int,
            reply: Callable[[int, int | None], None]) -> None:
    """Reply to each held worker whose clock (``pushes[w]``) is at most ``bound`` ahead of the
    slowest live worker's (any, when ``bound`` < 0). ``reply(w, lead)`` gets how far ahead the worker
    is when it goes on — the staleness SSP bounds, measured; ``None`` for a worker that has finished
    (it is released at once: it pushes nothing more)."""
    live = [p for w, p in enumerate(pushes) if w not in lost and p < steps] or [steps]
    slowest = min(live)
    for w in list(held):
        lead = pushes[w] - slowest
        if bound < 0 or lead <= bound or pushes[w] >= steps:
            held.remove(w)
            reply(w, lead if pushes[w] < steps else None)
