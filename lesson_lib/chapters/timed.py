"""Claims that rest on the wall clock, said without stopping Run All.

A busy machine (a workshop server with 30 learners, a laptop compiling something) stretches time
unevenly: a communication thread starts late, a compressed run waits for a core. What a chapter
asserts holds in every run (bytes, busy time, the order of events); what only time can show is
printed with :func:`timed_claim`, which names the load when the run could not show it.
"""

from __future__ import annotations

import os


def load_words() -> str:
    """"load 14.2 on 2 cores": the machine's 1-minute load average against its cores."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # not on every platform
        return f"{os.cpu_count()} cores, load unknown"
    return f"load {load:.1f} on {os.cpu_count()} cores"


def timed_claim(holds: bool, claim: str, seen: str) -> bool:
    """Print whether ``claim`` showed in this run (``seen``: what was measured); never raises.

    Every chapter with a claim that rests on the wall clock calls it (tests/test_timing_asserts.py)."""
    if holds:
        print(f"shown in this run: {claim} ({seen})")
    else:
        print(f"not shown in this run: {claim} ({seen}; {load_words()}). Timing claims need cores to "
              "spare; on a quiet machine this run shows it.")
    return bool(holds)
