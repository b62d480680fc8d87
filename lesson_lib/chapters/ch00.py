"""Chapter 0 — why distributed (notebooks/00_why_distributed.ipynb).

Each function is one notebook cell: it runs real multi-process training on warm clusters
(``lesson_lib.runtime.warm_cluster``), displays its figures and returns the measurements so the
notebook can assert its claims.
"""

from __future__ import annotations

from IPython.display import display

from .. import plots, widgets
from ..comm import ring_bytes_sent
from ..costmodel import fits, memory_bill
from ..data import read_csv
from ..experiments import Result, run_warm
from ..milestones import data_parallel as dp
from .ch00_exercises import exercises
from .ch00_seeds import seeding

__all__ = ["model_growth", "memory_calculator", "memory_bill", "fits", "config", "data_parallel",
           "max_loss_gap", "comm_overhead", "overlap", "straggler", "straggler_explorer", "idle_resources",
           "waited_for_the_last", "failure_demo", "seeding", "exercises"]


def model_growth():
    return plots.training.model_growth(read_csv("model_sizes.csv"))


def memory_calculator(params: float = 1.5e9):
    return widgets.memory_calculator(params)


def config(world_size: int = 1, **options) -> dp.Config:
    """The chapter's training problem (``dp.Config.laptop()``) on ``world_size`` ranks."""
    return dp.Config.laptop(world_size=world_size, **options)


def _run(world_size: int, live: plots.common.LiveRuns | None = None, label: str | None = None,
         **options) -> Result:
    return run_warm(config(world_size, **options), live, label or f"{world_size} rank(s)")


def data_parallel(world_sizes=(1, 2, 4), **options) -> dict[int, Result]:
    """Train the same model on each world size with the same global batch; live plots."""
    live = plots.common.LiveRuns("Data parallel: one model, one global batch, 1 / 2 / 4 ranks")
    display(live)
    results = {n: _run(n, live, **options) for n in world_sizes}
    display(plots.training.time_split({f"{n} rank(s)": r for n, r in results.items()}))
    n = max(results)
    display(plots.training.memory_by_category(
        results[n], f"Memory per rank by inventory (what each rank knows it holds), {n} ranks"))
    return results


def max_loss_gap(results: dict[int, Result], **options) -> float:
    """Largest |loss difference| between any distributed run and single-process training."""
    ref = dp.reference(config(1, **options))
    gaps = {n: max(abs(a - b) for a, b in zip(r.losses, ref)) for n, r in results.items()}
    for n, g in gaps.items():
        print(f"{n} rank(s): largest loss difference from single-process training = {g:.2e}")
    return max(gaps.values())


def comm_overhead(hidden_sizes=(32, 128, 512, 1024), world_size: int = 2, results=None) -> dict:
    """Bytes and time of the gradient all-reduce as the model grows; share by world size."""
    rows = []
    for h in hidden_sizes:
        r = _run(world_size, hidden=h, steps=8)
        psi = r["param_count"]
        per_step = r.per_rank[0].ops["grad_all_reduce"]["bytes_sent"] / r.config["steps"]
        rows.append({"hidden": h, "params": psi, "counted_bytes": per_step,
                     "exact_bytes": ring_bytes_sent(psi, 4, world_size, 0),
                     "formula_bytes": r["grad_bytes_formula"],
                     "compute_ms": 1e3 * r.median_step("compute_s")[0],
                     "comm_ms": 1e3 * r.median_step("comm_s")[0],
                     "busy_ms": 1e3 * r.median_step("busy_s")[0]})
    display(plots.training.comm_vs_size(
        rows, f"Gradient all-reduce on {world_size} ranks as the model grows"))
    shares = []
    for n, r in (results or {}).items():
        comm, wall = sum(r.median_step("comm_s")), sum(r.median_step("wall_s"))
        sent = r.per_rank[0].ops.get("grad_all_reduce", {}).get("bytes_sent", 0) / r.config["steps"]
        shares.append({"label": f"{n} rank(s)", "share": comm / wall if wall else 0.0,
                       # counted: gradient bytes a rank sends per sample it computes
                       "bytes_per_sample": sent / (r.config["global_batch"] // n)})
    if shares:
        print(f"{'ranks':<10} {'bytes sent per sample (counted)':>32} "
              f"{'step in communication (measured)':>33}")
    for s in shares:
        print(f"{s['label']:<10} {s['bytes_per_sample']:>32,.0f} {s['share']:>33.0%}")
    if shares:
        display(plots.training.comm_share(
            shares, "Share of the step spent communicating (same global batch)"))
    return {"by_size": rows, "by_world_size": shares}


def overlap(bucket_mb: float = 2.0, world_size: int = 2, hidden: int = 1024, global_batch: int = 256,
            steps: int = 6, link_gbps: float | None = None) -> dict:
    """The same training with one all-reduce after the backward, then with buckets of ``bucket_mb``
    MiB all-reduced during it; a timeline of one step of each, per rank.

    What is certain by construction, and checked: every bucket is launched before the backward
    returns, and the losses are the same. How much of the communication the backward hides is
    measured and varies: on 2 cores the communication thread competes with the backward for the
    same cores. With ``link_gbps`` every transfer takes at least bytes / bandwidth on an *emulated*
    link (chapter 6's :func:`lesson_lib.comm.set_link`: the rank sleeps out the rest of that time,
    leaving its core free, as waiting on a network card would).
    """
    opts = {"hidden": hidden, "global_batch": global_batch, "steps": steps, "link_gbps": link_gbps or 0.0}
    runs = {"one all-reduce after the backward": _run(world_size, **opts),
            f"buckets of {bucket_mb:g} MiB during the backward":
                _run(world_size, bucket_mb=bucket_mb, **opts)}
    flat, bucketed = runs.values()
    hidden_share = []
    for t in bucketed["timeline"]:
        t0, t1 = t["backward"]
        comm = sum(b["end"] - b["start"] for b in t["buckets"])
        inside = sum(max(0.0, min(b["end"], t1) - max(b["start"], t0)) for b in t["buckets"])
        hidden_share.append(inside / comm if comm else 0.0)
    notes = [n for n in (plots.common.oversubscription_note([bucketed], busy_shown=False),
                         f"emulated link: {link_gbps:g} Gbit/s" if link_gbps is not None else None) if n]
    link = f", emulated {link_gbps:g} Gbit/s link" if link_gbps is not None else ""
    title = f"One step of a {flat['param_count']:,}-parameter model on {world_size} ranks{link}"
    display(plots.training.overlap_timeline({k: r["timeline"] for k, r in runs.items()}, title,
                                            "; ".join(notes) or None))
    claims = {"launched_during_backward": [sum(b["launched"] < t["backward"][1] for b in t["buckets"])
                                           for t in bucketed["timeline"]],
              "buckets": len(bucketed["timeline"][0]["buckets"]),
              "loss_gap": max(abs(a - b) for a, b in zip(flat.losses, bucketed.losses)),
              "hidden_share": hidden_share,
              "step_ms": {k: 1e3 * r.median_step_time() for k, r in runs.items()},
              "exposed_comm_ms": {k: 1e3 * max(r.median_step("comm_s")) for k, r in runs.items()}}
    print(f"median step, and the slowest rank's wait for communication{link}:")
    for k in runs:
        print(f"  {k:<40} step {claims['step_ms'][k]:7.1f} ms, "
              f"waiting {claims['exposed_comm_ms'][k]:6.1f} ms")
    print("buckets' communication that ran while the backward computed, per rank: "
          + ", ".join(f"{h:.0%}" for h in hidden_share))
    return claims


def straggler(factor: float = 3.0, rank: int = 1, world_size: int = 2, hidden: int = 512,
              global_batch: int = 256) -> dict:
    """The same run with and without one rank doing ``factor`` times the work.

    A bigger model and batch than the preset, so that compute (which the straggler multiplies)
    dominates the step on a laptop CPU. The claims compare the ranks *within* the straggler run
    (CPU time of each rank against the common step time): the wall clock of two separate runs
    also depends on whatever else the machine does meanwhile.
    """
    opts = {"hidden": hidden, "global_batch": global_batch}
    label = f"rank {rank} × {factor:g}"
    runs = {"no straggler": _run(world_size, **opts),
            label: _run(world_size, straggler=f"{rank}:{factor}", **opts)}
    # Only the straggler run on the figure: its ranks, compared within one run, show the same thing in
    # every run; the run without a straggler is another run, whose wall clock moves with the machine.
    display(plots.training.step_times(
        {label: runs[label]}, f"A synchronous step lasts as long as the slowest rank's work ({label})"))
    slow = runs[label]
    display(plots.training.busy_idle(slow, f"Busy and waiting time per rank, {label}"))
    split = [plots.training.wait_split(p) for p in slow.per_rank]
    idle = [1 - s["busy"] / s["wall"] for s in split]
    walls, busys = slow.median_step("wall_s"), slow.median_step("busy_s")
    fast = [i for i in range(world_size) if i != rank]
    claims = {"idle_share": idle, "straggler": rank,
              "step_ms": {"baseline": 1e3 * runs["no straggler"].median_step_time(),
                          "straggler": 1e3 * slow.median_step_time()},
              # a fast rank's step cannot end before the straggler has done its step's work
              "fast_rank_step_ms": 1e3 * min(walls[i] for i in fast),
              "fast_busy_ms": 1e3 * max(busys[i] for i in fast),
              "straggler_busy_ms": 1e3 * busys[rank]}
    print(f"{label}, median per step: rank {rank} worked {claims['straggler_busy_ms']:.1f} ms (CPU time), "
          f"the other rank(s) {claims['fast_busy_ms']:.1f} ms;\nevery rank's step lasted ≥ "
          f"{claims['fast_rank_step_ms']:.1f} ms (wall): the fast rank(s) waited out the difference.\n"
          f"Wall-clock step without / with the straggler (two separate runs): "
          f"{claims['step_ms']['baseline']:.1f} / {claims['step_ms']['straggler']:.1f} ms")
    return claims


def straggler_explorer(world_size: int = 2):
    import ipywidgets as W

    return widgets.run_button("Run with straggler", {
        "factor": W.FloatSlider(value=3.0, min=1.0, max=6.0, step=0.5, description="slowdown ×"),
        "rank": W.Dropdown(options=list(range(world_size)), value=world_size - 1, description="rank"),
    }, lambda factor, rank: straggler(factor, rank, world_size))



def idle_resources(results: dict[int, Result]) -> dict[int, dict]:
    """Per world size, shares of the ranks' wall time: busy (CPU time), waiting for a core (the OS
    ran something else: other ranks, a browser) and waiting for peers (blocked in the all-reduce)."""
    n = max(results)
    display(plots.training.busy_idle(results[n], f"Busy and waiting time per rank, {n} ranks, no straggler"))
    shares = {}
    for k, res in results.items():
        split = [plots.training.wait_split(p) for p in res.per_rank]
        wall = sum(s["wall"] for s in split)
        core = None if any(s["core"] is None for s in split) else sum(s["core"] for s in split) / wall
        shares[k] = {"busy": sum(s["busy"] for s in split) / wall, "core": core,
                     "peers": sum(s["peers"] for s in split) / wall}
    print(f"shares of the ranks' wall time\n{'ranks':>5} {'busy':>5} {'waiting for a core':>19} "
          f"{'waiting for peers':>18}")
    for k, s in shares.items():
        core = f"{s['core']:.0%}" if s["core"] is not None else "—"
        peers = f"{s['peers']:.0%}" + ("*" if k == 1 else " ")
        print(f"{k:>5} {s['busy']:>5.0%} {core:>19} {peers:>19}")
    if 1 in shares:
        print("*one rank has no peers: its rest is time off the CPU for other reasons (system calls, page "
              "faults, the clock's own reads), a floor under every row")
    if any(s["core"] is None for s in shares.values()):
        print("—: not measured (only Linux reports it); here it counts as waiting for peers")
    for k, res in results.items():
        shares[k]["waited_for_the_last"] = order = waited_for_the_last(res)
        if order is not None:
            lead, after = max(order["waited_ms"]), order["every_end_after_last_start"]
            print(f"{k} ranks, the last step's all-reduce: begun up to {lead:.2f} ms apart; every rank's "
                  f"ended after the last rank began its own: {after} (each earlier one waited its lead)")
    return shares


def waited_for_the_last(result) -> dict | None:
    """What the clock cannot change, from the last step's all-reduces (the ranks share one monotonic
    clock): no rank's ends before the last rank has begun its own, as each output needs every rank's
    input, so a rank that begins earlier waits at least the difference. None for one rank (no
    all-reduce, no peer)."""
    try:
        steps = [t.get("buckets") or [] for t in result["timeline"] or []]
    except KeyError:  # a milestone that records no timeline
        return None
    if len(steps) < 2 or not all(steps):
        return None
    last = [max(s[b]["start"] for s in steps) for b in range(len(steps[0]))]  # per bucket
    return {"every_end_after_last_start": all(e["end"] >= last[b] for s in steps for b, e in enumerate(s)),
            "waited_ms": [1e3 * (last[0] - s[0]["start"]) for s in steps]}


def failure_demo(world_size: int = 2) -> str:
    """Make rank 1 raise mid-run and show the error the notebook gets (no hang, no orphans)."""
    import torch
    import torch.distributed as dist

    from ..runtime import Cluster, WorkerError, context

    def raise_on(rank: int, message: str) -> int:  # sent by value: rank ``rank`` raises mid-job
        if context().rank == rank:
            raise ValueError(message)
        dist.all_reduce(torch.ones(1))  # the others are left waiting in a collective
        return context().rank

    with Cluster(world_size, quiet=True) as cluster:
        try:
            cluster.run(raise_on, world_size - 1, "a deliberate failure on this rank")
        except WorkerError as e:
            print(f"caught WorkerError from rank {e.rank}:\n{e}")
            return str(e)
    raise AssertionError("the failing job did not raise")
