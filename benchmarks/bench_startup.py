"""Start-up: a fresh world and its first training step against a run on a warm cluster.

Per world size, workers forked by the fork server (CPU ranks on Linux) and spawned ones.
"""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch.distributed as dist

from lesson_lib.runtime import Cluster


def noop() -> None:
    return None


def first_step() -> float:
    """One data-parallel SGD step of a small MLP: what a chapter's first run on a fresh world does
    first, lazy imports included."""
    import torch.nn.functional as F

    from lesson_lib.data import teacher_classification
    from lesson_lib.models import mlp

    model = mlp(32, 64, 2, 10, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = teacher_classification(64, 32, 10)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    return loss.item()


def measure(world_sizes=(2, 4, 6), repeats: int = 3, warm_runs: int = 50) -> list[dict]:
    """Seconds for a fresh world plus :func:`first_step`, per start method, against a warm no-op run."""
    from lesson_lib.runtime import start

    methods = ["forkserver", "spawn"] if start.method("gloo") == "forkserver" else ["spawn"]
    saved = os.environ.get("LESSON_LIB_START_METHOD")

    def fresh(n: int, method: str) -> float:
        if method == "spawn":
            os.environ["LESSON_LIB_START_METHOD"] = "spawn"
        else:
            os.environ.pop("LESSON_LIB_START_METHOD", None)
        t0 = time.perf_counter()
        with Cluster(n, quiet=True) as c:
            c.run(first_step)
        return time.perf_counter() - t0

    rows = []
    try:
        fresh(1, methods[0])  # the fork server, started once for this process
        for n in world_sizes:
            times = {m: [] for m in methods}
            for _ in range(repeats):
                for m in methods:
                    times[m].append(fresh(n, m))
            with Cluster(n, quiet=True) as c:
                c.run(noop)
                warm = []
                for _ in range(warm_runs):
                    t0 = time.perf_counter()
                    c.run(noop)
                    warm.append(time.perf_counter() - t0)
            w = statistics.median(warm)
            for m in methods:
                f = statistics.median(times[m])
                rows.append({"world_size": n, "method": m, "fresh_s": f, "warm_s": w, "ratio": f / w})
    finally:
        os.environ.pop("LESSON_LIB_START_METHOD", None)
        os.environ.update({} if saved is None else {"LESSON_LIB_START_METHOD": saved})
    return rows


def show(rows: list[dict]) -> None:
    print(f"{'ranks':>5} {'workers':>11} {'fresh + 1 step (s)':>19} {'warm run (ms)':>14} "
          f"{'fresh / warm':>13}")
    for r in rows:
        print(f"{r['world_size']:>5} {r['method']:>11} {r['fresh_s']:>19.2f} {1e3 * r['warm_s']:>14.2f} "
              f"{r['ratio']:>12.0f}×")
    for n in dict.fromkeys(r["world_size"] for r in rows):
        if len(f := {r["method"]: r["fresh_s"] for r in rows if r["world_size"] == n}) == 2:
            print(f"{n} ranks: a spawned world takes {f['spawn'] / f['forkserver']:.0f}× as long to start")
