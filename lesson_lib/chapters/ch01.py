"""Chapter 1 — the parameter server (notebooks/01_parameter_server.ipynb).

One function per notebook cell: each runs the parameter-server milestone in real processes on
warm clusters, displays its figures and returns what the notebook asserts.
"""

from __future__ import annotations

import math
import statistics
import textwrap

from IPython.display import display

from .. import plots, widgets
from ..exercises import Exercise, Verdict, close_to, number, solution_text
from ..experiments import Result, run_warm
from ..milestones import parameter_server as ps
from ..runtime import WorkerError
from .ch01_exercises import check_average, reference_average, worker_step_exercise
from .ch01_replicas import replicated_failover  # noqa: F401  (the notebook calls it here)
from .ch01_staleness import (  # noqa: F401  (the notebook calls them here)
    fast_lead,
    staleness_explorer,
    staleness_sweep,
    tail_mean,
    waiting_share,
)


def config(workers: int = 3, **options) -> ps.Config:
    """The chapter's synchronous training problem (``ps.Config.laptop()``) with one server."""
    return ps.Config.laptop(mode="sync", workers=workers, **options)


def _run(mode: str = "sync", workers: int = 3, servers: int = 1, live=None, label=None, **options) -> Result:
    cfg = ps.Config.laptop(mode=mode, workers=workers, servers=servers, **options)
    # the workers report steps; the first worker (after the servers' ranks) carries the loss
    return run_warm(cfg, live, label or mode, ranks=workers, loss_rank=servers)


def curve(r: Result) -> dict:
    """Loss per round against wall time (when the last worker finished it) and server updates."""
    workers = [p for p in r.per_rank if p.steps]
    # From the end of the warm-up step 0 (its start-up costs differ from run to run).
    t0 = max(p["steps"][0]["start"] + p["steps"][0]["wall_s"] for p in workers)
    n = r.config["workers"] if r.config["mode"] == "async" else 1
    times = []
    for s in range(len(r.losses)):
        ends = [p["steps"][s]["start"] + p["steps"][s]["wall_s"] for p in workers if s < len(p["steps"])]
        times.append(max(ends) - t0)
    return {"time": times, "updates": [n * (s + 1) for s in range(len(r.losses))], "loss": r.losses}


def sync_vs_async(workers: int = 3, **options) -> dict[str, Result]:
    """The same training, synchronous then asynchronous; loss, timelines and staleness."""
    live = plots.common.LiveRuns(f"Parameter server, {workers} workers: sync vs async")
    display(live)
    runs = {m: _run(m, workers, live=live, **options) for m in ("sync", "async")}
    display(plots.training.loss_curves({m: curve(r) for m, r in runs.items()}))
    note = plots.common.oversubscription_note(runs.values(), busy_shown=False)
    for m, r in runs.items():
        display(plots.training.timeline(r["segments"], f"{m}: what each worker did, step by step", note))
    display(plots.training.staleness_histogram(runs["async"]["staleness"]))
    return runs


def max_loss_gap(r: Result) -> float:
    """Largest |loss difference| between a sync run and single-process SGD on the combined batch."""
    ref = ps.reference(ps.Config(**{k: r.config[k] for k in ps.Config().task()}))
    gap = max(abs(a - b) for a, b in zip(r.losses, ref))
    print(f"largest loss difference from single-process SGD: {gap:.2e}")
    return gap


def mean_staleness(r: Result) -> float:
    hist = {int(k): v for k, v in r["staleness"].items()}
    return sum(k * v for k, v in hist.items()) / max(1, sum(hist.values()))


def staleness_bites(workers: int = 3, lr: float = 0.3) -> dict:
    """Sync against async at a learning rate where stale gradients hurt; the mean loss of the last
    five rounds of each (single rounds are noisy: each is one small batch per worker)."""
    runs = {m: _run(m, workers, lr=lr) for m in ("sync", "async")}
    display(plots.training.loss_curves({m: curve(r) for m, r in runs.items()},
                                       f"lr = {lr:g}: loss against wall time and against updates"))
    last = {m: tail_mean(r.losses) for m, r in runs.items()}
    print(f"lr = {lr:g}, mean loss of the last 5 rounds: "
          + ", ".join(f"{m} {v:.3f}" for m, v in last.items()))
    return {"last5": last, "runs": runs}


def stragglers(workers: int = 3, factor: float = 4.0) -> dict:
    """Worker 0 does ``factor`` times the work: sync makes everyone wait, async does not.

    A batch of 1,536 (512 samples a worker), so that computing, not the server's turnaround, sets a
    worker's pace: at a small batch a worker mostly waits for the server, and on shared cores async's
    fast workers may get no further ahead than sync's."""
    runs = {m: _run(m, workers, straggler=f"0:{factor}", hidden=128, global_batch=1536)
            for m in ("sync", "async")}
    note = plots.common.oversubscription_note(runs.values(), busy_shown=False)
    for m, r in runs.items():
        display(plots.training.timeline(r["segments"], f"{m}, worker 0 × {factor:g}", note))
    shares = {m: waiting_share(r) for m, r in runs.items()}
    fast = {m: statistics.mean(s[1:]) for m, s in shares.items()}
    lead = {m: fast_lead(r) for m, r in runs.items()}
    print(f"{'mode':<6} {'fast workers pushing and pulling':>33} {'steps ahead of worker 0':>24}")
    for m in runs:
        print(f"{m:<6} {fast[m]:>33.0%} {lead[m]:>24.1f}")
    print("pushing and pulling: share of the wall clock, not computing (it moves with the load on the "
          "cores);\nsteps ahead: the most the fast workers had pushed beyond worker 0, at any of its pushes")
    return {"fast_wait": fast, "lead": lead, "runs": runs}


SERVER_GBPS = 0.05  # the server's EMULATED link: N·S bytes each way take N × 7 ms here


def bottleneck(worker_counts=(1, 2, 4), server_gbps: float = SERVER_GBPS) -> list[dict]:
    """Synchronous steps with more workers: counted server traffic against 2·N·S; then step time with
    the server behind an EMULATED link of ``server_gbps``, against the time its bytes need there: N·S
    in and N·S out, at once on a full-duplex link, so N·S / B — the one door every worker's bytes pass."""
    rows = []
    for n in worker_counts:
        r = _run("sync", n, steps=10, server_gbps=server_gbps)
        rows.append({"workers": n, "counted": r["server_bytes_per_step"],
                     "formula": r["server_bytes_formula"], "step_ms": 1e3 * r.median_step_time(),
                     "cycle_ms": 1e3 * first_worker_cycle(r),
                     "door_ms": 1e3 * r["server_bytes_formula"] / 2 * 8 / (server_gbps * 1e9)})
    display(plots.training.traffic_vs_formula(
        rows, "workers", "workers (N)", "Server bytes per sync step (2·N·S); step time on an emulated "
        f"{server_gbps:g} Gbit/s server link", EMULATED_NOTE))
    print(f"server link EMULATED at {server_gbps:g} Gbit/s\n"
          f"{'workers':>7} {'step (ms)':>10} {'server bytes, each way (ms)':>28}")
    for r in rows:
        print(f"{r['workers']:>7} {r['step_ms']:>10.1f} {r['door_ms']:>28.1f}")
    return rows


def first_worker_cycle(r: Result) -> float:
    """Mean seconds from one step's start to the next (step 1 on) on the first worker, whom the sync
    server answers first each round: all N pushes of a round reach the server between two of its
    replies, so each cycle holds the server link's N·S / B. A step's own time, without the few
    microseconds of bookkeeping between steps, can dip just under it (a median of 7.087 ms against
    7.092 once, in the browser test)."""
    starts = [s.start for s in r.per_rank[r.config["servers"]].steps]
    return (starts[-1] - starts[1]) / (len(starts) - 2)


EMULATED_NOTE = ("emulated link: the server's transfers are held to the link's speed (comm.set_link); the "
                 "real ones are memory copies between processes")


def sharding(workers: int = 2, server_counts=(1, 2, 4)) -> list[dict]:
    """Split the server into K shards, as DistBelief (Dean et al., 2012) and Li et al. (2014) did from
    the start: each shard carries 1/K of the traffic."""
    rows = []
    for k in server_counts:
        r = _run("sync", workers, servers=k, steps=10)
        rows.append({"servers": k, "counted": max(r["per_server_bytes"]) / r.config["steps"],
                     "formula": r["server_bytes_formula"] / k,
                     "step_ms": 1e3 * r.median_step_time(), "busy_ms": _busy_ms(r)})
    display(plots.training.traffic_vs_formula(rows, "servers", "server shards (K)",
                                              "Busiest server's traffic per step: 2·N·S / K",
                                              plots.common.oversubscription_note([r])))
    return rows


def _busy_ms(r: Result) -> float:
    """Median per-step CPU time of the busiest worker."""
    return 1e3 * max(b for b in r.median_step("busy_s") if b == b)  # skip servers (nan)


def server_failure(workers: int = 2) -> str:
    """Server 0 dies at step 3: every worker stops — the single point of failure."""
    try:
        _run("sync", workers, fail_server=3, steps=10)
    except WorkerError as e:
        print("Training stopped. The runtime reports:\n"
              + textwrap.fill(str(e).splitlines()[0], 96, initial_indent="  ", subsequent_indent="  ")
              + "\nRank 0 was the parameter server: with it gone, no worker can pull parameters.")
        return str(e)
    raise AssertionError("the run survived its server's death?")


def worker_failure(mode: str, workers: int = 3, steps: int = 30, lr: float = 0.05) -> dict:
    """Worker 1 stops responding at step 4. Async goes on without it; sync cannot.

    A smaller learning rate and a larger batch than the preset, so that the survivors' loss falls
    clearly over the rounds (single rounds are noisy); the mean of the first four rounds (three
    of them with all workers) is compared with the mean of the last five.
    """
    try:
        r = _run(mode, workers, fail_worker="1:4", lost_after_s=2.0, steps=steps, lr=lr, global_batch=96)
    except WorkerError as e:
        print(f"{mode}: training failed:\n" + textwrap.fill(str(e).splitlines()[0], 96, initial_indent="  ",
                                                           subsequent_indent="  "))
        return {"finished": False, "error": str(e)}
    first = sum(r.losses[:4]) / 4
    last = tail_mean(r.losses)
    print(f"{mode}: finished {len(r.losses)} rounds; lost workers {r['lost_workers']}\n"
          f"mean loss: first 4 rounds {first:.3f} → last 5 rounds {last:.3f}")
    display(plots.training.loss_curves({f"{mode}, worker 1 lost at step 4": curve(r)},
                                       "The surviving workers go on training"))
    return {"finished": True, "lost": r["lost_workers"], "result": r, "first4": first, "last5": last}


def explorer():
    import ipywidgets as W

    def go(workers, mode, slowdown, servers, lr):
        r = _run(mode, workers, servers=servers, lr=lr,
                 straggler=f"0:{slowdown}" if slowdown > 1 else "")
        display(plots.training.loss_curves({mode: curve(r)}))
        display(plots.training.timeline(r["segments"], f"{mode}: {workers} workers, {servers} shard(s)",
                                        plots.common.oversubscription_note([r], busy_shown=False)))

    return widgets.run_button("Run", {
        "workers": W.IntSlider(value=3, min=1, max=4, description="workers"),
        "mode": W.ToggleButtons(options=["sync", "async"], description="mode"),
        "slowdown": W.FloatSlider(value=1.0, min=1.0, max=5.0, step=0.5, description="worker 0 ×"),
        "servers": W.IntSlider(value=1, min=1, max=3, description="shards"),
        "lr": W.FloatLogSlider(value=0.1, base=10, min=-2, max=0, description="lr"),
    }, go)


# --------------------------------------------------------------------------- exercises


def _check_divergence(lr) -> Verdict:
    lr = number(lr, "a learning rate")
    if not 0 < lr <= 5:
        return Verdict(False, "pick a learning rate between 0 and 5")
    out = {m: _run(m, 4, lr=lr, global_batch=64) for m in ("sync", "async")}
    # Single rounds are noisy (one small batch per worker): compare the first three with the last five.
    first = {m: sum(r.losses[:3]) / 3 for m, r in out.items()}
    last = {m: tail_mean(r.losses) for m, r in out.items()}
    end = "diverged" if math.isinf(last["async"]) else f"{last['async']:.3f}"
    msg = (f"mean loss, first 3 → last 5 rounds: sync {first['sync']:.3f} → {last['sync']:.3f}, "
           f"async {first['async']:.3f} → {end}")
    if not last["sync"] < first["sync"] - 0.05:
        if last["async"] < first["async"] - 0.05:  # async learned where sync did not: no "either"
            return Verdict(False, msg + ": synchronous training did not learn at this rate, though "
                                        "asynchronous training did: the exercise needs a rate at which "
                                        "synchronous training learns and asynchronous diverges")
        return Verdict(False, msg + ": synchronous training did not learn either at this rate "
                                    "(too small to learn in 30 steps, or too large for anyone)")
    if last["async"] < first["async"]:
        return Verdict(False, msg + ": asynchronous training still learns here — push the rate up")
    return Verdict(True, msg)


def exercises(param_bytes: int | None = None) -> dict[str, Exercise]:
    """The chapter's exercises. S, the model's bytes, is the chapter's own model's (``ps.Config.laptop()``)
    unless given: no prompt depends on a cell run earlier."""
    n = 4
    if param_bytes is None:
        param_bytes = 4 * ps.param_count(ps.Config.laptop())
    if param_bytes <= 0:
        raise ValueError(f"param_bytes must be a positive number of bytes, got {param_bytes}")
    return {
        "worker_step": worker_step_exercise(),
        "average": Exercise(
            key="average", title="the server's update",
            prompt="Write <code>server_update(shard, grads, lr)</code>: given the server's parameter shard, "
                   "the list of the workers' gradients for it and the learning rate, return the new shard "
                   "after one synchronous SGD step (no momentum).",
            check=check_average, hint="Average the gradients first; the step is against the gradient.",
            solution=solution_text(reference_average()), reference=reference_average),
        "traffic": Exercise(
            key="traffic", title="predict the server's traffic",
            prompt=f"With N = {n} workers and S = {param_bytes:,} bytes of parameters, how many bytes go "
                   "into plus out of the server in one synchronous step? Then run "
                   "<code>ch01.bottleneck((4,))</code> and compare with the counter.",
            check=close_to(2 * n * param_bytes, 1e-9, " bytes"),
            hint="Each worker pushes a full gradient and pulls the full parameters.",
            solution=f"2 · N · S = 2 × {n} × {param_bytes:,} = {2 * n * param_bytes:,} bytes: every worker "
                     "sends S bytes of gradient in and receives S bytes of parameters.",
            reference=lambda: 2 * n * param_bytes),
        "divergence": Exercise(
            key="divergence", title="when staleness hurts",
            prompt="Find a learning rate at which asynchronous training with 4 workers diverges (its loss "
                   "ends no lower than it started, or becomes NaN) while synchronous training still learns. "
                   "Submit the learning rate; the check runs both. Why does async break first?",
            check=_check_divergence,
            hint="Async applies 4 updates per round, each computed on parameters that are several updates "
                 "old; try learning rates a few times larger than the preset's 0.1.",
            solution="0.5, for example (the check runs both at your rate; near the edge between learning "
                     "and diverging, a run can go either way, because async losses depend on the order in "
                     "which gradients arrive). Each async worker's gradient is applied with the full "
                     "learning rate, so a round moves the weights about N times further than a sync "
                     "step, and in directions computed for older weights; momentum amplifies it.",
            reference=lambda: 0.5),
    }
