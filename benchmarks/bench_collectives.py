"""The cost of checking every collective against the peers' (runtime/checked.py): a 1-element
``dist.all_reduce`` and a 64 KiB one, with the check on and off, on two clusters run in turn.
"""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch.distributed as dist

from lesson_lib.runtime import Cluster
from lesson_lib.runtime.ledger import ENV


def timed_calls(n: int, numel: int) -> tuple[float, float]:
    """Seconds of wall clock and of this thread's CPU per ``dist.all_reduce`` of ``numel`` float32
    elements, over ``n`` calls (the CPU time sees the check's own work through a noisy machine)."""
    t = torch.ones(numel)
    for _ in range(50):  # warm-up
        dist.all_reduce(t)
    dist.barrier()
    t0, c0 = time.perf_counter(), time.thread_time()
    for _ in range(n):
        dist.all_reduce(t)
    return (time.perf_counter() - t0) / n, (time.thread_time() - c0) / n


def measure(world_sizes=(2, 4), numels=(1, 16384), calls: int = 2000, repeats: int = 7) -> list[dict]:
    """Microseconds per call, checked and unchecked, per world size and size (slowest rank, median)."""
    rows = []
    saved = os.environ.get(ENV)
    for n in world_sizes:
        clusters = {}
        try:
            for name, value in (("checked", "1"), ("unchecked", "0")):
                os.environ[ENV] = value  # read as a cluster starts its workers
                clusters[name] = Cluster(n, quiet=True)
        finally:
            if saved is None:
                os.environ.pop(ENV, None)
            else:
                os.environ[ENV] = saved
        try:
            for numel in numels:
                wall: dict[str, list[float]] = {k: [] for k in clusters}
                cpu: dict[str, list[float]] = {k: [] for k in clusters}
                for _ in range(repeats):
                    for name, c in clusters.items():
                        outs = c.run(timed_calls, calls, numel)
                        wall[name].append(max(w for w, _ in outs) * 1e6)
                        cpu[name].append(statistics.mean(c for _, c in outs) * 1e6)
                rows.append({"world_size": n, "numel": numel, "calls": calls, "repeats": repeats,
                             **{f"{k}_us": statistics.median(v) for k, v in wall.items()},
                             **{f"{k}_cpu_us": statistics.median(v) for k, v in cpu.items()},
                             "ratios": [a / b for a, b in zip(wall["checked"], wall["unchecked"])]})
        finally:
            for c in clusters.values():
                c.close()
    return rows


def show(rows: list[dict]) -> None:
    print("| ranks | elements | wall µs/call checked | unchecked | ratio (median of paired) "
          "| CPU µs/call checked | unchecked | extra CPU µs |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['world_size']} | {r['numel']:,} | {r['checked_us']:.1f} | {r['unchecked_us']:.1f} | "
              f"{statistics.median(r['ratios']):.2f} | {r['checked_cpu_us']:.1f} | "
              f"{r['unchecked_cpu_us']:.1f} | {r['checked_cpu_us'] - r['unchecked_cpu_us']:+.1f} |")
