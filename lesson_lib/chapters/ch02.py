"""Chapter 2 — ring all-reduce (notebooks/02_ring_allreduce.ipynb). Each function is one notebook
cell: it runs real all-reduces on warm clusters (``lesson_lib.runtime.warm_cluster``), displays its
figures and returns the measurements so the notebook can assert its claims.
"""

from __future__ import annotations

import statistics
from functools import partial
from types import SimpleNamespace

import torch
import torch.distributed as dist
from IPython.display import display

from .. import comm, costmodel, experiments, plots, widgets
from ..comm import schedules
from ..experiments import Result, run_warm
from ..milestones import data_parallel as dp
from ..milestones import ring_allreduce as ra
from ..runtime import warm_cluster
from .ch02_exercises import exercises  # noqa: F401  (the notebook calls it here)
from .ch02_scale import at_scale, bus_bandwidth, model_scaling  # noqa: F401  (the notebook calls them here)

# The laptop preset: sizes up to 16 MiB and 3 repeats keep the bandwidth cell under a minute.
SIZES = tuple(4096 * 4**k for k in range(7))  # 4 KiB … 16 MiB
OURS = ("ring", "halving-doubling", "naive")
PIPELINED = "pipelined-ring"  # the ring with each chunk in segments (section 7)


def _run(world_size: int, size_mb: float, algorithm: str, steps: int = 3, **options) -> Result:
    return run_warm(ra.Config(world_size=world_size, size_mb=size_mb, algorithm=algorithm, steps=steps,
                              **options))


def traffic_jam(world_size: int = 4, size_mb: float = 1.0) -> dict:
    """The parameter-server pattern against the ring: counted bytes through each rank's link."""
    rows, results = [], {}
    for alg in ("naive", "ring"):
        r = results[alg] = _run(world_size, size_mb, alg)
        rows += [{"algorithm": alg, "rank": i, "sent": s, "recv": v}
                 for i, (s, v) in enumerate(zip(r["bytes_sent_per_call"], r["bytes_recv_per_call"]))]
    size = results["ring"]["size_bytes"]
    display(plots.collectives.bytes_per_rank(
        rows, f"One all-reduce of {size / 2**20:g} MiB on {world_size} ranks: "
              "bytes through each rank (counted)"))
    root = rows[0]["sent"] + rows[0]["recv"]
    ring = [r["sent"] + r["recv"] for r in rows if r["algorithm"] == "ring"]
    print(f"naive: the root moves {root / 1e6:.2f} MB = 2(N−1)·S; every other rank {2 * size / 1e6:.2f} MB\n"
          f"ring: every rank moves {min(ring) / 1e6:.2f}–{max(ring) / 1e6:.2f} MB ≈ 2 · 2(N−1)/N·S")
    return {"size_bytes": size, "rows": rows, "root_bytes": root, "ring_bytes": ring,
            "correct": all(r["correct"] for r in results.values())}


def ring_animation(world_size: int = 4) -> list[dict]:
    """Animate the very schedule ``comm.ring_all_reduce`` runs (``schedules.ring_schedule``)."""
    frames = schedules.ring_states(world_size)
    display(plots.collectives.ring_animation(frames))
    return frames


def pipelined_animation(world_size: int = 4, segments: int = 2) -> list[dict]:
    """Animate the pipelined ring slot by slot (``schedules.pipelined_ring_slots``), from the schedule
    ``comm.pipelined_ring_all_reduce`` runs (``schedules.pipelined_ring_schedule``)."""
    frames = schedules.pipelined_ring_slots(world_size, segments)
    display(plots.collectives.pipelined_ring_animation(frames))
    return frames


def check_against_library(world_sizes=(1, 2, 3, 4), lengths=(0, 1, 3, 5, 1000, 1001),
                          dtypes=("float32", "float64", "bfloat16"), algorithms=(*OURS, PIPELINED)) -> dict:
    """Each of our all-reduces against ``dist.all_reduce`` on the same random inputs."""
    out = {}
    print(f"{'ranks':>5} {'inputs':>6} {'algorithms':>10} {'largest difference':>18} {'bytes = exact':>13}")
    for n in world_sizes:
        cases = [(le, dt, seed) for seed, (le, dt) in enumerate((le, d) for le in lengths for d in dtypes)]
        rows = [row for rank in warm_cluster(n).run(ra.compare_with_library, cases, list(algorithms))
                for row in rank]
        out[n] = rows
        worst = max((r["max_error"] for r in rows), default=0.0)
        exact = all(r["bytes_sent"] == r["exact_bytes_sent"] for r in rows)
        print(f"{n:>5} {len(cases):>6} {len(algorithms):>10} {worst:>18.1e} {str(exact):>13}")
    print("largest difference: from dist.all_reduce; bytes = exact: counted bytes equal the exact count")
    return out


def traffic_table(world_sizes=(2, 3, 4), size_mb: float = 1.0, algorithms=(*OURS, PIPELINED)) -> list[dict]:
    """Counted bytes per rank against the exact count and the textbook formula, asserted in the notebook."""
    rows = []
    for n in world_sizes:
        for alg in algorithms:
            r = _run(n, size_mb, alg, steps=2)
            for rank in range(n):
                rows.append({"ranks": n, "algorithm": alg, "rank": rank,
                             "counted": r["bytes_sent_per_call"][rank], "exact": r["exact_bytes_sent"][rank],
                             "formula": r["formula_bytes_sent"][rank], "size_bytes": r["size_bytes"]})
    shown = [{**r, "formula": f"{r['formula']:,.1f}",
              "counted / formula": f"{r['counted'] / r['formula']:.5f}"} for r in rows]
    columns = ["ranks", "algorithm", "rank", "counted", "exact", "formula", "counted / formula"]
    display(plots.memory.fits_table(
        shown, columns, f"Bytes each rank sends in one all-reduce of {size_mb:g} MiB: "
                        "counted vs formula"))
    return rows


def bandwidth(sizes=SIZES, world_sizes=(2, 4), repeats: int = 3,
              algorithms=("ring", PIPELINED, "library", "naive"), batch_bytes: int = 2**21) -> dict:
    """Measure the algorithm bandwidth of ours and Gloo's in one run; fit α-β to both rings.

    Both are fitted with the ring's model, T = 2(N−1)·α + 2(N−1)/N·S·β, so α is the cost of one
    ring step and β the cost of a byte (the pipelined ring's extra messages, one per segment, grow
    with the bytes: their cost lands in β). Small messages run in batches of about ``batch_bytes``,
    2 MiB here rather than ``bench allreduce``'s 8 (benchmarks/history/ring-allreduce.md).
    """
    rows = ra.bandwidth(sizes, world_sizes, algorithms, repeats, cluster_for=warm_cluster,
                        batch_bytes=batch_bytes)
    rings = [a for a in ("ring", PIPELINED) if a in algorithms]
    fits = {a: {} for a in rings}
    models = {n: {} for n in world_sizes}
    xs = [sizes[0] * 2 ** (k / 4) for k in range(4 * (len(sizes) - 1) * 2 + 1)]
    for a in rings:
        for n in world_sizes:
            f = fits[a][n] = costmodel.fit_alpha_beta([r for r in rows if r["algorithm"] == a
                                                       and r["world_size"] == n])
            models[n][a] = (xs, [s / costmodel.allreduce_time("ring", n, s, f["alpha_s"],
                                                             f["beta_s_per_byte"]) / 1e9 for s in xs])
    note = plots.common.oversubscription_note([SimpleNamespace(**r) for r in rows], busy_shown=False)
    display(plots.collectives.allreduce_bandwidth(rows, models, note))
    ratios = {a: {(r["world_size"], r["size_bytes"]): r["vs_library"] for r in rows if r["algorithm"] == a}
              for a in rings}
    display(plots.memory.fits_table(*ra.bandwidth_table(rows), "Gloo's time ÷ ours at each size (> 1: "
                                    "ours is faster; median of paired ratios), and the α-β fit of each"))
    return {"rows": rows, "fits": fits.get("ring"), "ratios": ratios.get("ring"),
            "pipelined_fits": fits.get(PIPELINED), "pipelined_ratios": ratios.get(PIPELINED)}


def pipelining_fit(bw: dict) -> dict:
    """The α-β fits of the ring and the pipelined ring from one run (``bandwidth``), side by side,
    with which way each moved in this run. Returns, per world size, both fits."""
    out, table = {}, []
    for n, ring in bw["fits"].items():
        pipe = bw["pipelined_fits"][n]
        out[n] = {"ring": ring, "pipelined": pipe}
        for name, f in (("ring", ring), (PIPELINED, pipe)):
            table.append({"ranks": n, "algorithm": name, "α (µs per step)": f"{1e6 * f['alpha_s']:.1f}",
                          "1/β (GB/s)": f"{f['bandwidth_GBps']:.2f}",
                          "fit error (rms)": f"{100 * f['rms_rel_error']:.0f} %"})
    display(plots.memory.fits_table(table, list(table[0]), "α-β fitted to each ring, same run: "
                                                           "T = 2(N−1)·α + 2(N−1)/N·S·β"))
    print("this run, plain ring → pipelined ring:")
    for n, o in out.items():
        (ar, br), (ap, bp) = ((f["alpha_s"], f["bandwidth_GBps"]) for f in (o["ring"], o["pipelined"]))
        print(f"  {n} ranks: α {1e6 * ar:.0f} → {1e6 * ap:.0f} µs per step, 1/β {br:.2f} → {bp:.2f} GB/s: "
              f"{'faster' if bp > br else 'no faster'} per byte")
    return out


def time_segments(nbytes: int, segment_sizes: list[int], repeats: int = 5) -> dict:
    """On every rank: seconds of each call, {variant: [[one call] per repeat]}, for the library, the
    plain ring and the pipelined ring with each segment size, taking turns (``ra.interleaved``)."""
    x = torch.zeros(nbytes // 4)
    calls = {"library": partial(dist.all_reduce, x), "ring": partial(comm.ring_all_reduce, x),
             **{b: partial(comm.pipelined_ring_all_reduce, x, segment_bytes=b) for b in segment_sizes}}
    return ra.interleaved(calls, repeats)


def segment_sweep(world_size: int = 2, size_mb: float = 4.0, repeats: int = 5,
                  segment_sizes=tuple(2**k for k in (21, 20, 19, 18, 17, 16, 15, 14))) -> dict:
    """One all-reduce of ``size_mb`` with the pipelined ring cut into ever smaller segments, beside the
    plain ring and the library, interleaved; the cost of one more segment fitted by least squares."""
    import numpy as np

    nbytes = int(size_mb * 2**20)
    outs = warm_cluster(world_size).run(time_segments, nbytes, list(segment_sizes), repeats)
    median = {k: statistics.median(max(o[k][i][0] for o in outs) for i in range(repeats)) for k in outs[0]}
    chunk = -(-nbytes // world_size)
    rows = [{"segment_bytes": b, "segments": max(1, -(-chunk // b)), "time_s": median[b]}
            for b in segment_sizes]
    k = np.array([r["segments"] for r in rows], dtype=float)
    t = np.array([r["time_s"] for r in rows])
    slope, base = np.polyfit(k, t, 1)
    per_message = slope / (2 * (world_size - 1))  # each of the 2(N−1) steps sends one more message
    display(plots.collectives.segments_plot(
        rows, {"ring": median["ring"], "library": median["library"]}, (base, slope),
        f"Pipelined ring, one all-reduce of {size_mb:g} MiB on {world_size} ranks: "
        "time against the number of segments per chunk"))
    print(f"each extra segment per chunk costs {1e6 * slope:.0f} µs per all-reduce here, about "
          f"{1e6 * per_message:.0f} µs per message ({2 * (world_size - 1)} steps)\n"
          f"plain ring {1e3 * median['ring']:.2f} ms, Gloo {1e3 * median['library']:.2f} ms")
    return {"rows": rows, "ring_s": median["ring"], "library_s": median["library"],
            "slope_s": float(slope), "base_s": float(base), "per_message_s": float(per_message)}


def scaling(world_sizes=(1, 2, 4), steps: int = 8, **options) -> list[dict]:
    """Data-parallel training with the ring vs the chapter-1 parameter server (one server), same model.

    The parameter server is included when its experiment is registered. The model (2.1M parameters,
    8.4 MB of gradients) is large enough that bandwidth, not latency, decides the step.
    """
    opts = {"steps": steps, "global_batch": 48, "hidden": 1024, "depth": 3, **options}
    rows, results = [], []
    for n in world_sizes:
        r = run_warm(_config(dp.Config, world_size=n, allreduce="ring", optimizer="sgd", **opts))
        grads = [p.ops.get("grad_all_reduce", {}) for p in r.per_rank]
        sent = [schedules.ring_bytes_sent(r["param_count"], 4, n, i) for i in range(n)]
        rows.append({"label": "data parallel, ring", "n": n, "step_ms": 1e3 * r.median_step_time(),
                     "bytes": max(g.get("bytes_sent", 0) + g.get("bytes_recv", 0) for g in grads) / steps,
                     "exact": max(sent[i] + sent[i - 1] for i in range(n))})  # i receives from i−1
        results.append(r)
    if "parameter-server" in experiments.EXPERIMENTS:
        ps = experiments.load("parameter-server")
        for n in world_sizes:
            cfg = _config(ps.Config, mode="sync", workers=n, servers=1, **opts)
            r = run_warm(cfg)
            rows.append({"label": "parameter server (1 server)", "n": n,
                         "step_ms": 1e3 * r.median_step_time(),
                         "bytes": r["server_bytes_per_step"], "exact": r["server_bytes_formula"]})
            results.append(r)
    else:
        print("the parameter-server experiment is not registered here: showing the ring alone")
    display(plots.collectives.ring_vs_parameter_server(
        rows, plots.common.oversubscription_note(results, busy_shown=False)))
    return rows


def _config(cls, **options):
    """``cls(**options)`` keeping only the options ``cls`` has (the two milestones differ a little)."""
    names = set(cls.__dataclass_fields__)
    return cls(**{k: v for k, v in options.items() if k in names}).validate()


def allreduce_once(world_size: int = 4, size_mb: float = 4.0, algorithm: str = "ring") -> dict:
    """One run of the milestone: counted bytes per rank against the formula, time and bandwidth."""
    r = _run(world_size, size_mb, algorithm, steps=3)
    kind = "counted" if r["counted"] else "modelled"  # the library's collective reports no traffic
    rows = [{"algorithm": f"{algorithm} ({kind})", "kind": kind, "rank": i, "sent": s, "recv": v}
            for i, (s, v) in enumerate(zip(r["bytes_sent_per_call"], r["bytes_recv_per_call"]))]
    display(plots.collectives.bytes_per_rank(rows, f"{algorithm}, {world_size} rank(s), {size_mb:g} MiB"))
    print(f"{kind}: {[f'{b / 1e6:.3f}' for b in r['bytes_sent_per_call']]} MB sent per rank; formula "
          f"{[f'{b / 1e6:.3f}' for b in r['formula_bytes_sent']]} MB; time {1e3 * r['time_s']:.2f} ms "
          f"(median of 3), {r['algbw_GBps']:.3f} GB/s; result correct: {r['correct']}")
    return r.to_dict()


def explorer():
    import ipywidgets as W

    return widgets.run_button("Run all-reduce", {
        "world_size": W.Dropdown(options=[1, 2, 3, 4], value=4, description="ranks"),
        "size_mb": W.FloatLogSlider(value=4.0, base=2, min=-8, max=6, step=1, description="MiB"),
        "algorithm": W.Dropdown(options=["ring", "halving-doubling", "naive", "library"], value="ring",
                                description="algorithm"),
    }, allreduce_once)
