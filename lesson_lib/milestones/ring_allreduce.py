"""Ring all-reduce (chapter 2): no central server; every rank talks to its two ring neighbours.

Every rank sends 2(N−1)/N·S bytes, the bandwidth-optimal volume (Patarasuk & Yuan, 2009). One run
times ``steps`` all-reduces of ``size_mb`` with one algorithm and checks every result; the module
also compares and times our all-reduces against the backend's.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist

from .. import comm
from ..comm.algorithms import BYTES_SENT, formula_bytes_sent
from ..config import CommonConfig, opt
from ..metrics import StepRecorder, counters, memory_report, per_rank_summary, sync
from ..runtime import Cluster, context

NAME = "ring-allreduce"
DTYPES = ("float32", "float64", "bfloat16")
MAX_SIZE_MB = 1024.0


@dataclass
class Config(CommonConfig):
    # laptop: chapter 2's traffic jam (1 MiB on 4 ranks); tiny: a quarter MiB on 2, for tests.
    PRESETS = {"laptop": {"world_size": 4, "size_mb": 1.0, "steps": 3},
               "tiny": {"world_size": 2, "size_mb": 0.25, "steps": 2}}

    steps: int = opt(10, "timed all-reduces (after one untimed warm-up)")
    size_mb: float = opt(4.0, "tensor size in MiB (2^20 bytes) per rank")
    algorithm: str = opt("ring", "ring | pipelined-ring | halving-doubling | naive (reduce to rank 0 + "
                                 "broadcast) | library (the backend's dist.all_reduce)")
    dtype: str = opt("float32", "float32 | float64 | bfloat16")
    global_batch: int = opt(64, "not used: no training here", cli=False)
    lr: float = opt(0.01, "not used: no training here", cli=False)

    def validate(self) -> "Config":
        super().validate()
        if isinstance(self.size_mb, bool) or not isinstance(self.size_mb, (int, float)) \
                or not 0 <= self.size_mb <= MAX_SIZE_MB:
            raise ValueError(f"size_mb must be a number of MiB in [0, {MAX_SIZE_MB:g}], got {self.size_mb!r}")
        if self.algorithm not in comm.ALGORITHMS:
            raise ValueError(f"algorithm must be one of {', '.join(comm.ALGORITHMS)}, "
                             f"got {self.algorithm!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        return self

    def numel(self) -> int:
        return int(self.size_mb * 2**20) // getattr(torch, self.dtype).itemsize


def rank_values(numel: int, rank: int, dtype: torch.dtype, device=None) -> torch.Tensor:
    """Each rank's input: values in {−1, 0, 1}, so every partial sum is exact, even in bfloat16."""
    i = torch.arange(numel, device=device)
    return ((i + rank) % 3 - 1).to(dtype)


def expected_sum(numel: int, world_size: int, dtype: torch.dtype) -> torch.Tensor:
    return sum(rank_values(numel, r, torch.int64) for r in range(world_size)).to(dtype)


def worker(cfg: Config) -> dict:
    ctx = context()
    dtype = getattr(torch, cfg.dtype)
    numel = cfg.numel()
    x = rank_values(numel, ctx.rank, dtype, ctx.device)
    expected = expected_sum(numel, ctx.world_size, dtype).to(ctx.device)
    comm.all_reduce(x, cfg.algorithm, op="warm-up")  # the first call pays for connections
    counters().reset()
    rec = StepRecorder(ctx.device, ctx.emit)
    wrong = 0
    for step in range(cfg.steps):
        x.copy_(rank_values(numel, ctx.rank, dtype, ctx.device))
        dist.barrier()  # start together, so a rank's time is the all-reduce, not its peers' lag
        with rec.step(step):
            comm.all_reduce(x, cfg.algorithm, op="all_reduce")
        wrong += int((x != expected).sum())
    memory = memory_report(buffers=[x], device=ctx.device)
    return {"losses": [], "per_rank": per_rank_summary(ctx.rank, rec, memory, skip_first=False),
            "numel": numel, "wrong_elements": wrong}


def summarize(cfg: Config, outs: list[dict]) -> dict:
    """Per rank: counted bytes per call against the exact count and the formula; the slowest rank's
    median time per call and the algorithm bandwidth S / time."""
    n, alg = cfg.world_size, cfg.algorithm
    numel = outs[0]["numel"]
    es = getattr(torch, cfg.dtype).itemsize
    size = numel * es
    ranks = range(n)
    sent = [o["per_rank"]["ops"].get("all_reduce", {}).get("bytes_sent", 0) // cfg.steps for o in outs]
    recv = [o["per_rank"]["ops"].get("all_reduce", {}).get("bytes_recv", 0) // cfg.steps for o in outs]
    steps = list(zip(*(o["per_rank"]["steps"] for o in outs)))
    t = statistics.median(max(s["wall_s"] for s in per_step) for per_step in steps)
    return {
        "algorithm": alg, "dtype": cfg.dtype, "numel": numel, "size_bytes": size,
        "counted": alg != "library",  # the library's own traffic is modelled, not counted
        "bytes_sent_per_call": sent, "bytes_recv_per_call": recv,
        "exact_bytes_sent": [BYTES_SENT[alg](numel, es, n, r) for r in ranks] if alg in BYTES_SENT else None,
        "formula_bytes_sent": [formula_bytes_sent(alg, size, n, r) for r in ranks],
        "time_s": t, "time_s_per_rank": [statistics.median(s["wall_s"] for s in o["per_rank"]["steps"])
                                          for o in outs],
        "algbw_GBps": size / t / 1e9 if t > 0 else 0.0,
        "busbw_GBps": size / t / 1e9 * 2 * (n - 1) / n if t > 0 else 0.0,
        "correct": all(o["wrong_elements"] == 0 for o in outs),
    }


# --------------------------------------------------------------------------- checks and timing


TOLERANCE = {"float32": 1e-5, "float64": 1e-12, "bfloat16": 0.0}


def compare_with_library(cases: list[tuple[int, str, int]], algorithms: list[str]) -> list[dict]:
    """On every rank, per case (length, dtype, seed): each algorithm against ``dist.all_reduce`` —
    the largest difference, and counted against exact bytes. bfloat16 inputs are small integers
    and must match exactly; float sums may differ in the last bits.
    """
    ctx = context()
    rows = []
    for length, dtype, seed in cases:
        dt = getattr(torch, dtype)
        g = torch.Generator().manual_seed(seed * 1009 + ctx.rank)
        if dtype == "bfloat16":
            x = torch.randint(-3, 4, (length,), generator=g).to(dt)
        else:
            x = torch.randn(length, generator=g, dtype=torch.float64).to(dt)
        ref = x.clone()
        dist.all_reduce(ref)
        for a in algorithms:
            counters().reset()
            y = x.clone()
            comm.all_reduce(y, a, op="check")
            err = float((y.double() - ref.double()).abs().max()) if length else 0.0
            sent = counters().ops["check"].bytes_sent if "check" in counters().ops else 0
            recv = counters().ops["check"].bytes_recv if "check" in counters().ops else 0
            exact = BYTES_SENT[a](length, dt.itemsize, ctx.world_size, ctx.rank) if a in BYTES_SENT else None
            rows.append({"length": length, "dtype": dtype, "algorithm": a, "rank": ctx.rank,
                         "max_error": err, "ok": err <= TOLERANCE[dtype] * ctx.world_size,
                         "bytes_sent": sent, "bytes_recv": recv, "exact_bytes_sent": exact})
    counters().reset()
    return rows


def interleaved(calls: dict, repeats: int, k: int = 1) -> dict:
    """On every rank: seconds of each call, {name: [[per call] per repeat]}.

    The calls take turns in a rotating order, each turn from a barrier, ``k`` timed calls back to
    back, so shared-machine load falls on all alike and medians skip a lost scheduler tick. The first
    round is a dropped warm-up.
    """
    device = context().device
    names = list(calls)
    times: dict = {a: [] for a in names}
    for i in range(repeats + 1):
        for a in names[i % len(names):] + names[:i % len(names)]:
            got = []
            dist.barrier()
            for _ in range(k):
                t0 = time.perf_counter()
                calls[a]()
                sync(device)
                got.append(time.perf_counter() - t0)
            if i:
                times[a].append(got)
    return times


def time_algorithms(sizes: list[int], algorithms: list[str], repeats: int = 5,
                    dtype: str = "float32", batch_bytes: int = 2**23) -> dict:
    """On every rank: seconds of each all-reduce, {size: {algorithm: [[per call] per repeat]}}, via
    :func:`interleaved`; small messages run as batches moving about ``batch_bytes``."""
    dt = getattr(torch, dtype)
    out: dict = {}
    for nbytes in sizes:
        x = torch.zeros(nbytes // dt.itemsize, dtype=dt, device=context().device)  # zeros: no overflow
        k = max(1, min(50, batch_bytes // max(nbytes, 1)))
        out[nbytes] = interleaved({a: partial(comm.all_reduce, x, a, op="bench") for a in algorithms},
                                  repeats, k)
    counters().reset()
    return out


# --------------------------------------------------------------------------- bandwidth (chapter 2)

ALLREDUCE_SIZES = tuple(4096 * 4**k for k in range(8))  # 4 KiB … 64 MiB
ALLREDUCE_ALGORITHMS = ("ring", "pipelined-ring", "library", "naive", "halving-doubling")


def bandwidth(sizes=ALLREDUCE_SIZES, world_sizes=(2, 4), algorithms=ALLREDUCE_ALGORITHMS,
              repeats: int = 15, cluster_for=None, batch_bytes: int = 2**23) -> list[dict]:
    """Algorithm bandwidth (S / time) of our all-reduces and the backend's, in the same run.

    One row per (world size, size, algorithm): ``time_s``, the median of the slowest rank's time;
    ``vs_library``, the median paired ratio library time / ours. ``cluster_for(n)`` supplies warm
    clusters (default: a fresh one per world size). Few repeats leave the ratios noisy, and so do
    fewer ``batch_bytes`` (small messages run in batches moving about that many, at most 50 calls).
    """

    algorithms = list(algorithms)
    rows = []
    for n in world_sizes:
        cluster = cluster_for(n) if cluster_for else Cluster(n, quiet=True)
        try:
            outs = cluster.run(time_algorithms, list(sizes), algorithms, repeats, "float32", batch_bytes)
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


def bandwidth_fits(rows: list[dict]) -> dict[tuple[int, str], dict]:
    """The ring's α-β model fitted to each (world size, algorithm) of :func:`bandwidth`'s rows,
    the library's too: α vs β says whether a gap is latency or bandwidth."""
    from ..costmodel import fit_alpha_beta

    fits = {}
    for n in dict.fromkeys(r["world_size"] for r in rows):
        for a in ("ring", "pipelined-ring", "library"):
            mine = [r for r in rows if r["algorithm"] == a and r["world_size"] == n]
            if len(mine) >= 2:
                fits[n, a] = fit_alpha_beta(mine, "ring")
    return fits


def bandwidth_table(rows: list[dict]) -> tuple[list[dict], list[str]]:
    """:func:`bandwidth`'s rows as one table (rows, columns): per world size and algorithm, its α-β
    fit and library time ÷ ours at each size (> 1: ours is faster)."""
    by = {(r["algorithm"], r["world_size"], r["size_bytes"]): r for r in rows}
    sizes = list(dict.fromkeys(r["size_bytes"] for r in rows))
    table = []
    for (n, a), fit in bandwidth_fits(rows).items():
        row = {"ranks": n, "algorithm": "Gloo's dist.all_reduce" if a == "library" else a,
               "α (µs per step)": f"{1e6 * fit['alpha_s']:.0f}", "1/β (GB/s)": f"{fit['bandwidth_GBps']:.2f}"}
        for s in sizes:
            ratio = by.get((a, n, s), {}).get("vs_library")
            row[size_label(s)] = f"{ratio:.2f}" if ratio and a != "library" else ""
        table.append(row)
    return table, ["ranks", "algorithm", "α (µs per step)", "1/β (GB/s)", *map(size_label, sizes)]
