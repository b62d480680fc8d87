"""Chapter 1 §3–4: what a straggler costs each mode, and stale synchronous parallel between them
(notebooks/01_parameter_server.ipynb). ``ch01`` re-exports these functions."""

from __future__ import annotations

import math
import statistics

from IPython.display import display

from .. import plots, widgets
from ..experiments import Result, run_warm
from ..milestones import parameter_server as ps

BOUNDS = (0, 1, 2, 4, -1)  # −1: unbounded, plain asynchronous training


def waiting_share(r: Result) -> list[float]:
    """Per worker: the share of its time not computing — pushing and pulling. Both can wait for the
    server: a synchronous server takes the workers' gradients in turn, so a fast worker's push can
    sit until the straggler's has arrived, and its pull waits for the round's update."""
    return [(w["push"] + w["pull (waiting)"]) / (w["compute"] + w["push"] + w["pull (waiting)"])
            for w in r["worker_time"]]


def fast_lead(r: Result, straggler: int = 0) -> float:
    """How far the fast workers ran ahead of the straggler: at each of the straggler's pushes, how
    many more pushes the others had finished (their mean); the largest over the run. Sync cannot
    exceed 1 (a worker's next push needs the round that waits for the straggler); async is not held
    back. It counts steps, not seconds, so a busy machine changes it little."""
    ends: dict[int, list[float]] = {}
    for seg in r["segments"]:
        if seg["phase"] == "push":
            ends.setdefault(seg["worker"], []).append(seg["end"])
    slow = sorted(ends.pop(straggler))
    return max(statistics.mean(sum(e <= t for e in mine) - i for mine in ends.values())
               for i, t in enumerate(slow, start=1))


def tail_mean(losses: list[float], k: int = 5) -> float:
    tail = losses[-k:]
    mean = sum(tail) / len(tail)
    return mean if math.isfinite(mean) else math.inf  # a diverged run: worse than any finite loss


def bound_label(bound: int) -> str:
    return "∞ (async)" if bound < 0 else str(bound)


def ssp_run(bound: int, workers: int = 3, factor: float = 3.0, **options) -> Result:
    """Asynchronous training with staleness bound ``bound`` (−1: none) and worker 0 ``factor`` times
    slower. 512 samples a worker, as in §3, so that computing, not the server, sets the pace."""
    cfg = ps.Config.laptop(mode="async", workers=workers, staleness_bound=bound, straggler=f"0:{factor:g}",
                           hidden=128, global_batch=512 * workers, **options)
    return run_warm(cfg, ranks=workers, loss_rank=cfg.servers)


def ssp_row(bound: int, r: Result) -> dict:
    """One run's row: the fast workers' time per step (computing, waiting), the loss of the last five
    rounds, and how far ahead workers ran — measured by the server (its clock lead when it let a
    worker go on) and by the workers' own clocks (pushes ahead of the straggler)."""
    fast = [w for w in r["worker_time"] if w["worker"] != 0]
    per_step = 1e3 / r.config["steps"]
    return {"bound": bound, "label": bound_label(bound), "max_lead": r["max_lead"],
            "worker_lead": fast_lead(r),
            "compute_ms": per_step * statistics.mean(w["compute"] for w in fast),
            "wait_ms": per_step * statistics.mean(w["push"] + w["pull (waiting)"] for w in fast),
            "loss": tail_mean(r.losses), "max_staleness": max(int(k) for k in r["staleness"])}


def staleness_sweep(bounds=BOUNDS, workers: int = 3, factor: float = 3.0) -> list[dict]:
    """The same straggler run under each staleness bound, from 0 (round by round) to unbounded."""
    rows = [ssp_row(b, ssp_run(b, workers, factor)) for b in bounds]
    display(plots.consistency.staleness_sweep(
        rows, f"Stale synchronous parallel: {workers} workers, worker 0 × {factor:g}, one run per bound"))
    print(f"{'bound':<10} {'wait (ms/step)':>14} {'ahead: server':>14} {'ahead: clocks':>14} "
          f"{'oldest':>7} {'loss':>6}")
    for row in rows:
        print(f"{row['label']:<10} {row['wait_ms']:>14.1f} {row['max_lead']:>14} {row['worker_lead']:>14.1f} "
              f"{row['max_staleness']:>7} {row['loss']:>6.3f}")
    print("wait: the fast workers pushing and pulling; ahead: the most pushes a worker ran ahead, by the\n"
          "server's count and by the workers' clocks (of worker 0); oldest: a gradient's largest staleness,\n"
          "in updates; loss: the mean of the last 5 rounds")
    return rows


def staleness_explorer():
    """A slider from bound 0 (round by round) to unbounded (async); each click runs real ranks."""
    import ipywidgets as W

    def go(bound, slowdown):
        r = ssp_run(bound, factor=slowdown)
        row = ssp_row(bound, r)
        title = f"staleness bound {row['label']}, worker 0 × {slowdown:g}"
        display(plots.training.timeline(r["segments"], title,
                                        plots.common.oversubscription_note([r], busy_shown=False)))
        print(f"fast workers: {row['compute_ms']:.1f} ms computing, {row['wait_ms']:.1f} ms waiting a step\n"
              f"most pushes ahead of the slowest (server): {row['max_lead']}\n"
              f"loss of the last 5 rounds: {row['loss']:.3f}")

    options = [("0 (round by round)" if b == 0 else bound_label(b), b) for b in (0, 1, 2, 3, 4, 6, 8, -1)]
    return widgets.run_button("Run", {
        "bound": W.SelectionSlider(options=options, value=1, description="staleness bound",
                                   layout={"width": "520px"}),
        "slowdown": W.FloatSlider(value=3.0, min=1.0, max=5.0, step=0.5, description="worker 0 ×"),
    }, go)
