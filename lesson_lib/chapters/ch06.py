"""Chapter 6 — communication compression (notebooks/06_compression.ipynb).

Each function is one notebook cell's figure work: it runs real data-parallel training whose
gradients travel compressed (``lesson_lib.milestones.compression``) on a warm cluster, draws, and
returns measurements for the notebook's asserts.
"""

from __future__ import annotations

import math

from IPython.display import display

from .. import plots
from ..experiments import Result, run_warm
from ..milestones import compression as cm
from ..runtime.placement import cpu_count, share_note
from .ch06_exercises import crossover_case, exercises  # noqa: F401  (the notebook calls them here)

WORLD_SIZE = cm.Config.PRESETS["laptop"]["world_size"]
LATENCY_US = 100.0  # per emulated message; our choice, said on the figure
GBPS = (0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0)


def qsgd_label(bits: int) -> str:
    """A QSGD run named by what crosses the wire: s = 2^bits − 1 levels a side, in packed codes."""
    return f"qsgd, {2**bits - 1} levels ({cm.qsgd_width(bits)}-bit codes)"


QSGD_LABEL = qsgd_label(2)  # "qsgd, 3 levels (4-bit codes)"
SIGN_AR_LABEL = "sign, compressed all-reduce"  # 1-bit Adam's (Tang et al., 2021), scaled signs
ACCURACY_RUNS = {  # label → options
    "none": {"compressor": "none"},
    "fp16": {"compressor": "fp16"},
    QSGD_LABEL: {"compressor": "qsgd", "bits": 2},
    "powersgd, rank 2": {"compressor": "powersgd", "rank": 2},
    "randomk 1%": {"compressor": "randomk", "ratio": 0.01},
    "topk 1%": {"compressor": "topk", "ratio": 0.01},
    "topk 1%, no error feedback": {"compressor": "topk", "ratio": 0.01, "error_feedback": False},
    "sign": {"compressor": "sign"},
    "sign, no error feedback": {"compressor": "sign", "error_feedback": False},
    SIGN_AR_LABEL: {"compressor": "sign-allreduce"},
}


def config(compressor: str = "none", **options) -> cm.Config:
    """The chapter's task (``compression.Config.laptop()``) with ``compressor``."""
    return cm.Config.laptop(compressor=compressor, **options)


def run_one(cfg: cm.Config, live: plots.common.LiveRuns | None = None, label: str | None = None) -> Result:
    return run_warm(cfg, live, label or cfg.compressor)


def final_loss(r: Result, last: int = 30) -> float:
    """Mean loss of the last ``last`` steps (one step's loss is one noisy mini-batch)."""
    tail = r.losses[-last:]
    return sum(tail) / len(tail) if tail and all(math.isfinite(x) for x in tail) else float("nan")


def accuracy(runs: dict | None = None) -> dict:
    """Every compressor on the same task, live; loss vs step and vs bytes; a table."""
    live = plots.common.LiveRuns("Compressed gradients: loss per step, live")
    display(live)
    out = {label: run_one(config(**opts), live, label) for label, opts in (runs or ACCURACY_RUNS).items()}
    note = plots.common.oversubscription_note(list(out.values()), busy_shown=False)
    display(plots.compression.loss_curves(out, note))
    print(f"{'run':>28} {'loss (last 30 steps)':>21} {'bytes/step':>11} {'ratio':>7}")
    for label, r in out.items():
        print(f"{label:>28} {final_loss(r):>21.3f} {r['wire_bytes_per_step']:>11,.0f} "
              f"{r['compression_ratio']:>6.1f}×")
    return out


def wire_table(runs: dict) -> list[dict]:
    """Counted bytes per step of each run with error feedback, beside the fp32 and the bf16 ring."""
    rows = [{"label": label, "compressor": r.config["compressor"], **{k: r[k] for k in (
        "wire_bytes_per_step", "uncompressed_bytes_per_step", "compression_ratio", "param_count")},
        "bf16_ring_bytes_per_step": cm.ring_busiest_bytes(r["param_count"], 2, r.world_size)}
        for label, r in runs.items() if r.config["error_feedback"] or r.config["compressor"] == "none"]
    display(plots.compression.wire_bytes(rows))
    print(f"{'run':>28} {'bytes/step':>11} {'vs fp32 ring':>13} {'vs bf16 ring':>13}")
    for r in rows:
        print(f"{r['label']:>28} {r['wire_bytes_per_step']:>11,.0f} {r['compression_ratio']:>12.1f}× "
              f"{r['bf16_ring_bytes_per_step'] / r['wire_bytes_per_step']:>12.1f}×")
    return rows


SCALING_WORLDS = (2, 4, 8)
SCALING_RUNS = {**{c: {"compressor": c} for c in ("none", "fp16", "bf16")},  # every compressor, once
                **{label: opts for label, opts in ACCURACY_RUNS.items()
                   if opts.get("error_feedback", True) and opts["compressor"] not in ("none", "fp16")}}


def scaling(worlds=SCALING_WORLDS, steps: int = 2, runs: dict | None = None, up_to: int = 128) -> dict:
    """Counted gradient bytes per step on the busiest rank for every compressor at N = ``worlds``
    ranks (real runs of ``steps`` steps of the chapter's model), against the fp32 and bf16 rings.

    At N = 2 an all-gather and a ring all-reduce both send exactly one payload, so the counted bytes
    at 2 ranks ARE each compressor's payload P. From it: the all-gathered ones' (N−1)·P, the ring
    ones' 2(N−1)/N·P, the compressed all-reduce's exact count (:func:`cm.busiest_bytes`), and the N at
    which each all-gathered one stops saving against each ring (drawn to ``up_to`` ranks; the lines
    past the largest measured N are the formulas).
    """
    runs, big = runs or SCALING_RUNS, max(worlds)
    if 2 not in worlds:
        raise ValueError(f"worlds must include 2 (its counted bytes are the payloads), got {worlds!r}")
    res = {(label, n): run_one(config(**opts, world_size=n, steps=steps)) for n in worlds
           for label, opts in runs.items()}
    S = res["none", worlds[0]]["param_count"]
    counted = {label: {n: res[label, n]["wire_bytes_per_step"] for n in worlds} for label in runs}
    payload = {label: counted[label][2] for label in runs}
    gathered = [label for label, opts in runs.items() if opts["compressor"] in cm.ALL_GATHERED]
    chunked = [label for label, opts in runs.items() if opts["compressor"] == "sign-allreduce"]
    # ring all-reduces per step: the messages, 2(N−1) per ring, less the loss's ring
    rings = {label: res[label, big]["messages_per_step"] // (2 * (big - 1)) - 1
             for label in runs if label not in gathered + chunked}
    even = {label: cm.all_gather_break_even(payload[label], S) for label in gathered}  # fp32 ring
    even16 = {label: cm.all_gather_break_even(payload[label], S, 2) for label in gathered}  # bf16 ring
    xs = sorted({2, *worlds, *range(2, up_to + 1, 2), *(n for n in even.values() if n <= up_to),
                 *(n for n in even16.values() if n <= up_to)})
    formula = lambda label, n: ((n - 1) * payload[label] if label in gathered else cm.busiest_bytes(S, n)
                                if label in chunked else 2 * (n - 1) / n * payload[label])
    lines = {label: (xs, [formula(label, n) for n in xs]) for label in runs}
    baselines = {f"{name} ring 2(N−1)/N·{e}S": (xs, [cm.ring_busiest_bytes(S, e, n) for n in xs])
                 for name, e in (("fp32", 4), ("bf16", 2))}
    note = (f"{big} ranks share {cpu_count()} CPU cores{share_note()}: time-shared, so no times here; "
            "the byte counts are exact regardless" if any(r.oversubscribed for r in res.values()) else None)
    stars = [(label, n, (n - 1) * payload[label], ring) for ring, ev in (("fp32", even), ("bf16", even16))
             for label, n in ev.items() if n <= up_to]
    display(plots.compression.bytes_vs_ranks(counted, lines, baselines, stars, note))
    print(f"bytes per step on the busiest rank (counted); ×: N = {big} over N = 2\n{'compressor':<28} "
          + " ".join(f"{f'N = {n}':>9}" for n in worlds) + f" {'×':>6}")
    for label in runs:
        print(f"{label:<28} " + " ".join(f"{counted[label][n]:>9,.0f}" for n in worlds)
              + f" {counted[label][big] / payload[label]:>5.2f}×")
    print(f"\nthe first N at which it stops saving bytes against the ring\n{'compressor':<28} "
          f"{'collective':<23} {'fp32 ring':>9} {'bf16 ring':>9}")
    for label in runs:
        kind = ("all-gather" if label in gathered else "all-to-all + all-gather" if label in chunked
                else f"{rings[label]} ring" + "s" * (rings[label] > 1))
        stop = lambda ev, label=label: (f"N = {ev[label]}" if label in ev else "—"
                                        if label in ("none", "fp16", "bf16") else "never")
        print(f"{label:<28} {kind:<23} {stop(even):>9} {stop(even16):>9}")
    return {"bytes": counted, "payload": payload, "param_count": S, "all_gathered": gathered,
            "chunked": chunked, "rings": rings, "break_even": even, "break_even_bf16": even16,
            "worlds": tuple(worlds), "oversubscribed": note is not None}


# ranks → (bandwidths, steps per run): fewer of both at 4 ranks, to keep Run All's time
SWEEP_WORLDS = {2: (GBPS, 12), 4: ((0.03, 0.3, 3.0), 6)}  # 4 ranks: around the crossovers, fewer runs


def bandwidth_sweep(compressors=("none", "fp16", "topk", "powersgd"), worlds=SWEEP_WORLDS,
                    latency_us: float = LATENCY_US) -> dict:
    """Time per step on an emulated link for each compressor, beside chapter 2's α-β prediction, on
    each number of ranks in ``worlds`` (ranks → (bandwidths, steps)), with the ranks' busy time beside.

    First one run per compressor on the real link gives its compute time, messages and counted
    bytes per step; the model adds messages·α + bytes/bandwidth. Then each bandwidth is measured.
    ``base`` and ``rows`` are the first world's (2 ranks: the chapter's); ``by_world`` has them all.
    """
    by_world, panels, results = {}, {}, []
    for n, (gs, steps) in worlds.items():
        opts = {"steps": steps, "link_latency_us": latency_us, "rank": 2, "ratio": 0.01}
        base = {c: run_one(config(c, world_size=n, **opts)).to_dict() for c in compressors}
        rows = []
        for g in gs:
            for c in compressors:
                r = run_one(config(c, link_gbps=g, world_size=n, **opts))
                results.append(r)
                rows.append({"compressor": c, "gbps": g, "step_s": r.median_step_time(), "oversubscribed":
                             r.oversubscribed, "world_size": n, "busy_s": max(r.median_step("busy_s"))})
        xs = [gs[0] * (gs[-1] / gs[0]) ** (i / 40) for i in range(41)]
        predict = lambda c, g, base=base: cm.predicted_step_s(
            base[c]["compute_s_per_step"], base[c]["messages_per_step"], base[c]["wire_bytes_per_step"],
            g, latency_us * 1e-6)
        for row in rows:
            row["predicted_s"] = predict(row["compressor"], row["gbps"])
        rivals = [c for c in compressors if c != "none"]
        by_world[n] = {"base": base, "rows": rows,
                       "predicted_crossover": {c: cm.crossover_gbps(base["none"], base[c], latency_us * 1e-6)
                                               for c in rivals},
                       "measured_crossover": {c: measured_crossover(rows, c) for c in rivals}}
        panels[n] = (rows, {c: (xs, [predict(c, g) for g in xs]) for c in compressors})
    note = plots.common.oversubscription_note(results)
    display(plots.compression.bandwidth_sweep(panels, latency_us, note))
    print(f"{'ranks':>5} {'compressor':>10} {'predicted crossover':>20} "
          f"{'measured (between sweep points)':>32}")
    for n, w in by_world.items():
        for c, p in w["predicted_crossover"].items():
            m = w["measured_crossover"][c]
            print(f"{n:>5} {c:>10} {'—' if p is None else f'{p:.2f} Gbit/s':>20} "
                  f"{'—' if m is None else f'{m:.2f} Gbit/s':>32}")
    first = by_world[next(iter(worlds))]
    return {**first, "by_world": by_world, "latency_s": latency_us * 1e-6, "oversubscribed": note is not None}


SWEEP_LABELS = {"none": "none", "fp16": "fp16", "topk": "topk 1%", "powersgd": "powersgd, rank 2"}


def steps_to_target(losses: list[float], target: float, window: int = 10) -> int | None:
    """First step count after which the mean loss of the last ``window`` steps is at most ``target``."""
    for i in range(window, len(losses) + 1):
        if sum(losses[i - window:i]) / window <= target:
            return i
    return None


def time_to_target(runs: dict, sweep: dict, target: float = 0.9) -> list[dict]:
    """Steps to ``target`` (from the accuracy runs) × measured time per step on each emulated link."""
    rows = []
    for r in sweep["rows"]:
        steps = steps_to_target(runs[SWEEP_LABELS[r["compressor"]]].losses, target)
        rows.append({**r, "steps": steps, "time_s": None if steps is None else steps * r["step_s"]})
    display(plots.compression.time_to_target(rows, target, sweep["latency_s"] * 1e6, WORLD_SIZE))
    return rows


def measured_crossover(rows: list[dict], compressor: str) -> float | None:
    """Where ``compressor`` stops beating ``none`` as the bandwidth grows (log-interpolated), or
    None when the order never changes within the sweep."""
    t = {(r["compressor"], r["gbps"]): r["step_s"] for r in rows}
    gs = sorted({r["gbps"] for r in rows})
    diff = [math.log(t["none", g] / t[compressor, g]) for g in gs]  # > 0: compressed is faster
    for (g0, d0), (g1, d1) in zip(zip(gs, diff), zip(gs[1:], diff[1:])):
        if d0 > 0 >= d1:
            return math.exp(math.log(g0) + (math.log(g1) - math.log(g0)) * d0 / (d0 - d1))
    return None


def explorer():
    """Compressor, its parameter, error feedback and an emulated link → one run on real ranks."""
    import ipywidgets as W

    from .. import widgets

    def go(compressor, ratio, bits, rank, error_feedback, link_gbps):
        cfg = config(compressor, ratio=ratio, bits=bits, rank=rank, error_feedback=error_feedback,
                     link_gbps=link_gbps, link_latency_us=LATENCY_US)  # validated before any worker
        link = f"emulated link {link_gbps:g} Gbit/s" if link_gbps else "real link"
        live = plots.common.LiveRuns(
            f"{compressor}, error feedback {'on' if error_feedback else 'off'}, {link}")
        display(live)
        r = run_one(cfg, live)
        if compressor == "qsgd":
            print(f"{qsgd_label(bits)} cross the wire")
        print(f"loss (last 30 steps) {final_loss(r):.3f}; {r['wire_bytes_per_step']:,.0f} bytes per step "
              f"(×{r['compression_ratio']:.1f} fewer than the ring);\n{1e3 * r.median_step_time():.2f} ms "
              f"per step ({link})")

    return widgets.run_button("Train", {
        "compressor": W.Dropdown(options=list(plots.compression.COMP_COLORS), value="topk",
                                 description="compressor"),
        "ratio": W.FloatLogSlider(value=0.01, base=10, min=-3, max=0, step=0.25, description="k / S",
                                  readout_format=".3g"),
        "bits": W.IntSlider(value=2, min=1, max=7, description="QSGD b"),  # s = 2^b − 1 levels
        "rank": W.IntSlider(value=2, min=1, max=8, description="PowerSGD r"),
        "error_feedback": W.Checkbox(value=True, description="error feedback"),
        "link_gbps": W.Dropdown(options=[("real link (no emulation)", 0.0)] + [(f"{g:g} Gbit/s (emulated)", g)
                                                                               for g in GBPS],
                                value=0.0, description="link"),
    }, go)
