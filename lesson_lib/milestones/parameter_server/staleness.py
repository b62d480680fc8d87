"""Stale synchronous parallel (Ho et al., NeurIPS 2013) for the asynchronous parameter server
(chapter 1 §4); Li et al. (OSDI 2014) call it bounded delay.

A worker's *clock* counts its pushes. The server applies every gradient on arrival but replies to
a worker only while its clock is at most s ahead of the slowest live worker's: s = 0 goes round by
round, s = −1 is plain asynchronous training.
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
