"""Benchmarks (not tests): ratios of things measured in the same run on this machine."""

from __future__ import annotations

import os
import statistics
import time

from . import probes
from .runtime import Cluster


def startup(world_sizes=(2, 4, 6), repeats: int = 3, warm_runs: int = 50) -> list[dict]:
    """A fresh world and its first training step (:func:`~.probes.first_step`) against a warm
    ``Cluster.run``, per world size: workers forked by the fork server (CPU ranks on Linux,
    :mod:`lesson_lib.runtime.start`; its own start, once, before the timings) and spawned ones."""
    from .runtime import start

    methods = ["forkserver", "spawn"] if start.method("gloo") == "forkserver" else ["spawn"]
    saved = os.environ.get("LESSON_LIB_START_METHOD")

    def fresh(n: int, method: str) -> float:
        if method == "spawn":
            os.environ["LESSON_LIB_START_METHOD"] = "spawn"
        else:
            os.environ.pop("LESSON_LIB_START_METHOD", None)
        t0 = time.perf_counter()
        with Cluster(n, quiet=True) as c:
            c.run(probes.first_step)
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
                c.run(probes.noop)
                warm = []
                for _ in range(warm_runs):
                    t0 = time.perf_counter()
                    c.run(probes.noop)
                    warm.append(time.perf_counter() - t0)
            w = statistics.median(warm)
            for m in methods:
                f = statistics.median(times[m])
                rows.append({"world_size": n, "method": m, "fresh_s": f, "warm_s": w, "ratio": f / w})
    finally:
        os.environ.pop("LESSON_LIB_START_METHOD", None)
        os.environ.update({} if saved is None else {"LESSON_LIB_START_METHOD": saved})
    return rows


def print_startup(rows: list[dict]) -> None:
    """The table of :func:`startup` (``python -m lesson_lib bench startup``)."""
    print(f"{'ranks':>5} {'workers':>11} {'fresh + 1 step (s)':>19} {'warm run (ms)':>14} "
          f"{'fresh / warm':>13}")
    for r in rows:
        print(f"{r['world_size']:>5} {r['method']:>11} {r['fresh_s']:>19.2f} {1e3 * r['warm_s']:>14.2f} "
              f"{r['ratio']:>12.0f}×")
    for n in dict.fromkeys(r["world_size"] for r in rows):
        if len(f := {r["method"]: r["fresh_s"] for r in rows if r["world_size"] == n}) == 2:
            print(f"{n} ranks: a spawned world takes {f['spawn'] / f['forkserver']:.0f}× as long to start")


# --------------------------------------------------------------------------- all-reduce (chapter 2)

ALLREDUCE_SIZES = tuple(4096 * 4**k for k in range(8))  # 4 KiB … 64 MiB
ALLREDUCE_ALGORITHMS = ("ring", "pipelined-ring", "library", "naive", "halving-doubling")


def allreduce(sizes=ALLREDUCE_SIZES, world_sizes=(2, 4), algorithms=ALLREDUCE_ALGORITHMS,
              repeats: int = 15, cluster_for=None) -> list[dict]:
    """Algorithm bandwidth (S / time) of our all-reduces and the backend's, in the same run.

    One row per (world size, size, algorithm): ``time_s`` is the median over calls of the
    slowest rank's time; ``vs_library`` the median over repeats of library time / our time,
    measured back to back (a paired ratio, robust to load that comes and goes).
    ``cluster_for(n)`` supplies warm clusters (the notebook's); by default each world size gets
    a fresh one, closed after. Used by ``python -m lesson_lib bench allreduce`` and chapter 2.

    15 repeats: with 5, two algorithms that send the very same messages (the pipelined ring with one
    segment per chunk and the plain ring, at 4 MiB on 2 ranks) differed by 0.1-0.25 in their ratio to
    the library within one run. On a 2-core machine the bench takes about 67 s (28 s with 5).
    """
    from .milestones.ring_allreduce import time_algorithms

    algorithms = list(algorithms)
    rows = []
    for n in world_sizes:
        cluster = cluster_for(n) if cluster_for else Cluster(n, quiet=True)
        try:
            outs = cluster.run(time_algorithms, list(sizes), algorithms, repeats)
        finally:
            if cluster_for is None:
                cluster.close()
        for s in sizes:
            # per[a][repeat][call]: the slowest rank's time for that call
            per = {a: [[max(o[s][a][i][j] for o in outs) for j in range(len(outs[0][s][a][i]))]
                       for i in range(repeats)] for a in algorithms}
            lib = per.get("library")
            for a in algorithms:
                t = statistics.median(x for rep in per[a] for x in rep)
                ratio = statistics.median(statistics.median(x) / statistics.median(y)
                                          for x, y in zip(lib, per[a])) if lib else None
                rows.append({"world_size": n, "size_bytes": s, "algorithm": a, "time_s": t,
                             "algbw_GBps": s / t / 1e9, "vs_library": ratio,
                             "oversubscribed": cluster.oversubscribed})
    return rows


def size_label(nbytes: float) -> str:
    return f"{nbytes / 2**20:g} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:g} KiB"


def allreduce_fits(rows: list[dict]) -> dict[tuple[int, str], dict]:
    """The ring's α-β model fitted to each (world size, algorithm) of :func:`allreduce`'s rows, the
    library's too (it is a ring as well): α and β side by side say whether a gap is per-step
    latency or bandwidth."""
    from .costmodel import fit_alpha_beta

    fits = {}
    for n in dict.fromkeys(r["world_size"] for r in rows):
        for a in ("ring", "pipelined-ring", "library"):
            mine = [r for r in rows if r["algorithm"] == a and r["world_size"] == n]
            if len(mine) >= 2:
                fits[n, a] = fit_alpha_beta(mine, "ring")
    return fits


def allreduce_table(rows: list[dict]) -> tuple[list[dict], list[str]]:
    """:func:`allreduce`'s rows as one table (rows, columns): per world size and fitted algorithm,
    its α-β fit and, for ours, the library's time ÷ ours at each size (> 1: ours is faster)."""
    by = {(r["algorithm"], r["world_size"], r["size_bytes"]): r for r in rows}
    sizes = list(dict.fromkeys(r["size_bytes"] for r in rows))
    table = []
    for (n, a), fit in allreduce_fits(rows).items():
        row = {"ranks": n, "algorithm": "Gloo's dist.all_reduce" if a == "library" else a,
               "α (µs per step)": f"{1e6 * fit['alpha_s']:.0f}", "1/β (GB/s)": f"{fit['bandwidth_GBps']:.2f}"}
        for s in sizes:
            ratio = by.get((a, n, s), {}).get("vs_library")
            row[size_label(s)] = f"{ratio:.2f}" if ratio and a != "library" else ""
        table.append(row)
    return table, ["ranks", "algorithm", "α (µs per step)", "1/β (GB/s)", *map(size_label, sizes)]


def print_allreduce(rows: list[dict]) -> None:
    algs = list(dict.fromkeys(r["algorithm"] for r in rows))
    by = {(r["world_size"], r["size_bytes"], r["algorithm"]): r for r in rows}
    ours = [a for a in ("ring", "pipelined-ring") if a in algs]
    print("algorithm bandwidth, GB/s (S / time of the slowest rank, median); "
          "X/library = library time / X's time (median of paired ratios; > 1: X is faster)")
    print(f"{'ranks':>5} {'size':>9} " + " ".join(f"{a:>16}" for a in algs)
          + "".join(f" {a + '/library':>22}" for a in ours))
    for n, s in dict.fromkeys((r["world_size"], r["size_bytes"]) for r in rows):
        cells = " ".join(f"{by[n, s, a]['algbw_GBps']:>16.3f}" for a in algs)
        ratios = "".join(f" {by[n, s, a]['vs_library']:>22.2f}" if by[n, s, a]["vs_library"] else f" {'':>22}"
                         for a in ours)
        print(f"{n:>5} {size_label(s):>9} {cells}{ratios}")
    for (n, alg), fit in allreduce_fits(rows).items():
        print(f"{alg:>14}, {n} ranks: alpha = {1e6 * fit['alpha_s']:6.1f} µs, beta = 1/"
              f"({fit['bandwidth_GBps']:.2f} GB/s), fit error {100 * fit['rms_rel_error']:.0f}% rms")
    if any(r["oversubscribed"] for r in rows):
        print("note: some world sizes put more ranks than cores on this machine; "
              "their times include time-sharing")


# --------------------------------------------------------------------------- data parallel vs DDP (issue 13)


def ddp(hidden_sizes=(512, 1536, 2048), world_size: int = 2, steps: int = 12,
        bucket_mb: float = 4.0) -> list[dict]:
    """Our data-parallel step against torch DDP's on the same 2-rank cluster (about 0.55M, 4.8M and
    8.5M parameters, Adam, global batch 256), interleaved. Ours: one flat all-reduce after the
    backward, or buckets of ``bucket_mb`` MiB during it (DDP gets the same bucket size); by our ring
    or the library's all_reduce. Per size and variant: the median step of the slowest rank, and the
    median over steps of ours / DDP's (a paired ratio; > 1: ours is slower).
    """
    from .milestones.data_parallel import time_against_ddp

    with Cluster(world_size, quiet=True) as cluster:
        outs = cluster.run(time_against_ddp, list(hidden_sizes), steps, bucket_mb=bucket_mb)
    rows = []
    for h in hidden_sizes:
        names = [k for k in outs[0][h] if k != "params"]
        slowest = {k: [max(o[h][k][i] for o in outs) for i in range(steps)] for k in names}
        for k in names[:-1]:
            rows.append({"hidden": h, "params": outs[0][h]["params"], "variant": k, "bucket_mb": bucket_mb,
                         "ours_s": statistics.median(slowest[k]), "ddp_s": statistics.median(slowest["ddp"]),
                         "ratio": statistics.median(a / b for a, b in zip(slowest[k], slowest["ddp"])),
                         "oversubscribed": cluster.oversubscribed})
    return rows


def print_ddp(rows: list[dict]) -> None:
    print(f"data-parallel step, ours vs torch DDP (buckets of {rows[0]['bucket_mb']:g} MiB "
          "during the backward)")
    print(f"{'params':>9} {'ours':>16} {'ours ms':>8} {'DDP ms':>8} {'ours/DDP':>9}")
    for r in rows:
        print(f"{r['params']:>9,} {r['variant']:>16} {1e3 * r['ours_s']:>8.2f} {1e3 * r['ddp_s']:>8.2f} "
              f"{r['ratio']:>9.2f}")
    if rows[0]["oversubscribed"]:
        print("note: more ranks than cores on this machine; times include time-sharing")


# --------------------------------------------------------------------------- pipeline bubble (chapter 3)


def bubble(schedules=("gpipe", "1f1b", "interleaved"), microbatches=(4, 8), repeats: int = 3,
           steps: int | None = None) -> list[dict]:
    """The pipeline bubble at P = 2 on the compute-dominated preset, against (P−1)/(M+P−1) —
    interleaved 1F1B (2 chunks per rank) against its (P−1)/(v·M+P−1), without the rungs.

    ``repeats`` runs of every (schedule, M), interleaved on one warm 2-rank cluster. Per run, the
    medians over its steps (step 0 skipped) of the bubble replayed from busy time, measured on the
    wall clock, and the rungs of :func:`~lesson_lib.milestones.pipeline.schedules.bubble_breakdown`.
    One row per (schedule, M, run); ``busy_ratio`` and ``wall_ratio`` are bubble / formula.
    """
    from .experiments import run
    from .milestones import pipeline as pp

    preset = {"steps": steps} if steps else {}
    rows = []
    with Cluster(2, quiet=True) as cluster:
        for rep in range(repeats):
            for schedule in schedules:
                for m in microbatches:
                    chunks = {"chunks": 2} if schedule == "interleaved" else {}
                    cfg = pp.Config.from_preset("bubble", stages=2, microbatches=m, schedule=schedule,
                                                **chunks, **preset)
                    r = run("pipeline", cfg, cluster=cluster)
                    f, busy, wall = r["bubble_formula"], r["bubble_busy"], r["bubble_fraction"]
                    b = {"stages": None, "messages": None, "per_stage": []} if schedule == "interleaved" \
                        else r["bubble_breakdown"]
                    rows.append({"schedule": schedule, "microbatches": m, "run": rep, "formula": f,
                                 "stages": b["stages"], "busy": busy, "messages": b["messages"], "wall": wall,
                                 "busy_ratio": busy / f, "wall_ratio": wall / f, "per_stage": b["per_stage"],
                                 "step_s": r.median_step_time(), "oversubscribed": cluster.oversubscribed})
    return rows


def print_bubble(rows: list[dict]) -> None:
    print("pipeline bubble, 2 stages, compute-dominated preset 'bubble', median over steps; interleaved: "
          "2 chunks per rank, formula (P−1)/(v·M+P−1), no rungs.\n"
          "  stages: replayed with each stage's mean forward and backward; busy: each action's busy time;\n"
          "  msgs: busy + each message's measured delay; wall: measured on the wall clock;\n"
          "  per stage, as shares of the step's window: off its core while computing, waiting in recv, "
          "between actions")
    print(f"{'schedule':>8} {'M':>2} {'run':>3} {'formula':>7} {'stages':>7} {'busy':>7} {'msgs':>7} "
          f"{'wall':>7} {'busy/f':>7} {'wall/f':>7} {'step ms':>8}  stage 0 / stage 1: off-core recv between")
    for r in rows:
        shares = " / ".join(f"{s['off_core']:.2f} {s['recv']:.2f} {s['between']:.2f}" for s in r["per_stage"])
        rung = {k: "      –" if r[k] is None else f"{r[k]:>7.3f}" for k in ("stages", "messages")}
        print(f"{r['schedule'][:8]:>8} {r['microbatches']:>2} {r['run']:>3} {r['formula']:>7.3f} "
              f"{rung['stages']} {r['busy']:>7.3f} {rung['messages']} {r['wall']:>7.3f} "
              f"{r['busy_ratio']:>7.2f} {r['wall_ratio']:>7.2f} {1e3 * r['step_s']:>8.0f}   {shares}")
    for key in dict.fromkeys((r["schedule"], r["microbatches"]) for r in rows):
        mine = [r for r in rows if (r["schedule"], r["microbatches"]) == key]
        lo_hi = {k: f"{min(r[k] for r in mine):.2f}–{max(r[k] for r in mine):.2f}"
                 for k in ("busy_ratio", "wall_ratio")}
        print(f"{key[0]:>8} M={key[1]}: busy/formula {lo_hi['busy_ratio']}, "
              f"wall/formula {lo_hi['wall_ratio']} over {len(mine)} runs")
    if rows and rows[0]["oversubscribed"]:
        print("note: more ranks than cores on this machine; wall-clock times include time-sharing")
