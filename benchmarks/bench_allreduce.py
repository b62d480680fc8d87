"""All-reduce bandwidth: our rings and the backend's ``dist.all_reduce``, timed in one run.

Algorithm bandwidth (S / time of the slowest rank) per size on 2 and 4 ranks, the paired ratio
library time / ours (> 1: ours is faster), and an α-β fit of each ring (chapter 2 runs the same
measurement with fewer repeats).
"""

from __future__ import annotations

from lesson_lib.milestones.ring_allreduce import ALLREDUCE_SIZES, bandwidth


def measure(repeats: int = 15) -> list[dict]:
    """15 repeats: with 5, two algorithms sending the very same messages differed by 0.1–0.25 in
    their ratio to the library within one run."""
    return bandwidth(ALLREDUCE_SIZES, (2, 4), repeats=repeats)
