"""Benchmarks (not tests): ratios of things measured in the same run on this machine."""

from __future__ import annotations

import statistics
import time

from . import probes
from .runtime import Cluster


def startup(world_sizes=(2, 4), repeats: int = 3, warm_runs: int = 50) -> list[dict]:
    """Warm ``Cluster.run`` overhead vs starting a fresh world, for each world size."""
    rows = []
    for n in world_sizes:
        fresh = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            with Cluster(n, quiet=True) as c:
                c.run(probes.noop)
            fresh.append(time.perf_counter() - t0)
        with Cluster(n, quiet=True) as c:
            c.run(probes.noop)
            warm = []
            for _ in range(warm_runs):
                t0 = time.perf_counter()
                c.run(probes.noop)
                warm.append(time.perf_counter() - t0)
        f, w = statistics.median(fresh), statistics.median(warm)
        rows.append({"world_size": n, "fresh_s": f, "warm_s": w, "ratio": f / w})
    return rows


def print_startup(rows: list[dict]) -> None:
    print(f"{'ranks':>5} {'fresh world (s)':>16} {'warm run (ms)':>14} {'fresh / warm':>13}")
    for r in rows:
        print(f"{r['world_size']:>5} {r['fresh_s']:>16.2f} {1e3 * r['warm_s']:>14.2f} {r['ratio']:>13.0f}×")
