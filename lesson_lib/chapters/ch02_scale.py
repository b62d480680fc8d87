"""Chapter 2 §6 and §8: reading published all-reduce bandwidths (nccl-tests' algbw and busbw), and
the α-β model at cluster scale with a real interconnect's α and β — the ring, the double binary tree
and halving-doubling (notebooks/02_ring_allreduce.ipynb). ``ch02`` re-exports these functions.
"""

from __future__ import annotations

import textwrap

from IPython.display import display

from .. import costmodel, plots
from ..comm import schedules
from ..milestones.ring_allreduce import size_label

LAPTOP = "this laptop (fitted)"
ALGORITHMS_AT_SCALE = ("ring", "tree", "halving-doubling", "naive")
WORLD_SIZES = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def bus_bandwidth(bw: dict, algorithms=("ring", "library")) -> list[dict]:
    """nccl-tests' two figures for each all-reduce that ``bandwidth`` timed at its largest size: the
    algorithm bandwidth S / time, and the bus bandwidth algbw · 2(N−1)/N. For our ring, the bytes
    each rank sends (the exact count of §5) over the same time: the bus bandwidth, measured."""
    top = max(r["size_bytes"] for r in bw["rows"])
    rows = []
    for r in bw["rows"]:
        if r["algorithm"] not in algorithms or r["size_bytes"] != top:
            continue
        n, busbw = r["world_size"], costmodel.bus_bandwidth(r["algbw_GBps"], r["world_size"])
        ours = r["algorithm"] == "ring"
        sent = schedules.ring_bytes_sent(top // 4, 4, n, 0) / r["time_s"] / 1e9 if ours else None
        rows.append({"ranks": n, "algorithm": "our ring" if ours else "Gloo's dist.all_reduce",
                     "size": size_label(top), "algbw": r["algbw_GBps"], "busbw": busbw, "sent_per_s": sent})
    shown = [{**r, "algbw (GB/s)": f"{r['algbw']:.2f}", "busbw (GB/s)": f"{r['busbw']:.2f}",
              "bytes a rank sends ÷ time (GB/s)": "" if r["sent_per_s"] is None else f"{r['sent_per_s']:.2f}"}
             for r in rows]
    display(plots.memory.fits_table(shown, ["ranks", "algorithm", "size", "algbw (GB/s)", "busbw (GB/s)",
                                            "bytes a rank sends ÷ time (GB/s)"],
                                    "nccl-tests' convention on this run: busbw = algbw · 2(N−1)/N"))
    return rows


def model_scaling(link: str = "ib-hdr", nbytes: float = 100e6, sizes=None, world_sizes=WORLD_SIZES) -> dict:
    """The α-β model with a real interconnect's α and β (``data/links.csv``): the time of each
    all-reduce algorithm as N grows, and the message size above which the ring beats the double
    binary tree, S = N·(N−1−log₂N)·α/β. Figures here are the model's, not measurements."""
    sizes = tuple(sizes or SIZES_AT_SCALE)
    net = costmodel.links()[link]
    alpha, beta = net["alpha"], net["beta"]
    rows = [{"world_size": n, "algorithm": alg, "size_bytes": s,
             "time_s": costmodel.allreduce_time(alg, n, s, alpha, beta)}
            for alg in ALGORITHMS_AT_SCALE for s in sorted({*sizes, nbytes}) for n in world_sizes]
    crossover = [{"world_size": n, "bytes": costmodel.ring_beats_tree_bytes(n, alpha, beta)}
                 for n in world_sizes if n > 2]  # at N = 2 the ring is never slower
    display(plots.alpha_beta.algorithms_at_scale(
        rows, crossover, sizes, nbytes, f"The α-β model on {net['name']}:<br>ring, double binary tree, "
        f"halving-doubling (α = {alpha * 1e6:g} µs assumed, 1/β = {1 / beta / 1e9:g} GB/s)"))
    t = {(r["algorithm"], r["size_bytes"], r["world_size"]): r["time_s"] for r in rows}
    n = max(world_sizes)
    print(f"{nbytes / 1e6:g} MB on {n:,} ranks: naive {t['naive', nbytes, n]:.1f} s, ring "
          f"{1e3 * t['ring', nbytes, n]:.1f} ms, tree {1e3 * t['tree', nbytes, n]:.1f} ms")
    print(f"of the N drawn:\n{'S (MB)':>7} {'ring faster up to N':>20} {'tree faster from N':>19}")
    for s in sizes:
        ring = max(n for n in world_sizes if t["ring", s, n] <= t["tree", s, n])
        tree = min((n for n in world_sizes if t["tree", s, n] < t["ring", s, n]), default=None)
        print(f"{s / 1e6:>7g} {ring:>20,} {f'{tree:,}' if tree else '—':>19}")
    print("halving-doubling is never slower than either")
    return {"rows": rows, "crossover": crossover, "link": net}


# Gradient sizes at scale: DDP's default bucket (25 MB, the size one all-reduce carries), 100 MB of
# fp32 gradients (25M parameters), 1 GB (a 250M-parameter model in one bucket).
SIZES_AT_SCALE = (25e6, 100e6, 1e9)


def at_scale(fit: dict, link: str = "ib-hdr", sizes=SIZES_AT_SCALE,
             world_sizes=(2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)) -> dict:
    """The α-β model with a real interconnect's α and β (``data/links.csv``) beside this laptop's fit.

    For each message size S the ring's latency term 2(N−1)·α overtakes its bandwidth term
    2(N−1)/N·S·β where α = S·β/N, at N* = S·β/α ranks; halving-doubling pays 2·log₂N latencies
    for the same bytes. Figures here are the model's, not measurements; the laptop's rows only
    illustrate how far a loopback fit is from a network (nothing is claimed from them).
    """
    net = costmodel.links()[link]
    fits = {LAPTOP: (fit["alpha_s"], fit["beta_s_per_byte"]),
            net["name"]: (net["alpha"], net["beta"])}
    rows = []
    for name, (alpha, beta) in fits.items():
        for alg in ("ring", "halving-doubling"):
            for s in sizes:
                for n in world_sizes:
                    a, b = costmodel.allreduce_terms(alg, n, s)
                    t = a * alpha + b * beta
                    rows.append({"link": name, "algorithm": alg, "size_bytes": s, "world_size": n,
                                 "time_s": t, "latency_share": a * alpha / t})
    crossover = {s: s * net["beta"] / net["alpha"] for s in sizes}
    display(plots.alpha_beta.at_scale(
        rows, net["name"], f"The α-β model at cluster scale: {net['name']} (α = {net['alpha'] * 1e6:g} µs "
        f"assumed, 1/β = {1 / net['beta'] / 1e9:g} GB/s) beside this laptop's fit"))
    print(f"fitted here: α {fit['alpha_s'] * 1e6:.0f} µs per ring step, "
          f"1/β {fit['bandwidth_GBps']:.2f} GB/s\n"
          f"{net['name']}: α {net['alpha'] * 1e6:g} µs (assumed, {fit['alpha_s'] / net['alpha']:.0f}× less), "
          f"1/β {1 / net['beta'] / 1e9:g} GB/s\n"
          + textwrap.fill(f"source: {net['source']}", 96, initial_indent="  ", subsequent_indent="  "))
    print("\nwhere the ring's latency term overtakes its bandwidth term, N* = S·β/α:")
    for s, n in crossover.items():
        print(f"  S = {s / 1e6:>5g} MB: N* = {n:>7,.0f} ranks")
    return {"rows": rows, "crossover_n": crossover, "link": net}
