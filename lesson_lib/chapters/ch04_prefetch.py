"""Chapter 4's prefetch timeline (notebooks/04_zero.ipynb §3): one forward of ZeRO-3 on rank 0,
layer by layer, without prefetching and with it, on an emulated link where a gather takes about as
long as a layer's compute — what the forward waits for, and what the communication thread hides."""

from __future__ import annotations

import statistics

from IPython.display import display

from .. import plots
from ..experiments import run_warm
from ..milestones import zero
from ..runtime import warm_cluster

# Each rank's share of a 4,096-sample batch makes a layer's forward long enough to hide most of the
# next layer's gather over 1 Gbit/s (a 256 × 256 layer: 131 kB per rank on 2 ranks), so that hiding
# can be seen.
TIMELINE = {"world_size": 2, "global_batch": 4096, "link_gbps": 1.0, "steps": 3}


# Counted in every run, so that what the forward stood still for is told by events, not by ms: which
# gathers ran inside the forward (it waits for all of each) and which on the communication thread.
_LANES = {"gathers_in_forward": "gather, in the forward", "gathers_ahead": "gather, communication thread"}


def _count(spans: list[dict], lane: str) -> int:
    return sum(1 for s in spans if s["lane"] == lane)


def _waits(spans: list[dict]) -> dict:
    """ms the forward stood still for parameters, ms of gathers on the communication thread, the
    forward's length (from its first gather to its last layer's end)."""
    dur = lambda lane: sum(s["end"] - s["start"] for s in spans if s["lane"] == lane)
    waited = dur("gather, in the forward") + dur("waiting for the gather")
    return {"waiting_ms": 1e3 * waited, "compute_ms": 1e3 * dur("compute"),
            "hidden_gather_ms": 1e3 * dur("gather, communication thread"),
            "forward_ms": 1e3 * max(s["end"] for s in spans)}


def prefetch_timeline(depths=(0, 1), repeats: int = 5, **options) -> dict[int, dict]:
    """ZeRO-3 at each prefetch depth on :data:`TIMELINE`'s emulated link, ``repeats`` runs each, taking
    turns: the figure of rank 0's last forward in the last run, and per depth the medians over the
    runs of its waits (:func:`_waits`). Medians, because one forward alone is at the mercy of the
    shared cores: another process on them can swap which depth waits longer. Training is the same
    at every depth."""
    job = {**TIMELINE, **options}
    runs: dict[int, list] = {d: [] for d in depths}
    for _ in range(repeats):
        for d in depths:
            runs[d].append(run_warm(zero.Config.laptop(stage=3, prefetch=d, timeline=True, **job)))
    label = lambda d: (f"prefetch = {d}: the next {d} layer(s) gathered on the communication thread"
                       if d else "prefetch = 0: each layer gathered just before its forward")
    display(plots.memory.prefetch_timeline(
        {label(d): rs[-1]["timeline"] for d, rs in runs.items()},
        f"ZeRO-3, one forward on rank 0 of {job['world_size']}, EMULATED link of {job['link_gbps']:g} "
        "Gbit/s: gathers, compute and waits"))
    out = {}
    print(f"medians of {repeats} runs, ms: the forward waiting for parameters, computing, the gathers on\n"
          f"the communication thread, and the whole forward\n"
          f"{'prefetch':>8} {'waited':>7} {'computed':>9} {'gathers hidden':>15} {'forward':>8}")
    for d, rs in runs.items():
        waits = [_waits(r["timeline"]) for r in rs]
        out[d] = {k: statistics.median(w[k] for w in waits) for k in waits[0]}
        out[d].update(losses=[r.losses for r in rs], traffic=[r["traffic_per_step"] for r in rs],
                      **{k: sorted({_count(r["timeline"], lane) for r in rs}) for k, lane in _LANES.items()})
        w = out[d]
        print(f"{d:>8} {w['waiting_ms']:>7.1f} {w['compute_ms']:>9.1f} {w['hidden_gather_ms']:>15.1f} "
              f"{w['forward_ms']:>8.1f}")
    return out


def backward_prefetch(world_size: int = 2) -> dict:
    """FSDP2 on the ``laptop`` run, with its default backward prefetch and with it turned off: rank 0's
    last backward, from the collectives' own events (our ring does them: each notes its layer, start
    and end), the compute between them, and per run how many layers' all-gathers were issued before
    the next layer in the model had finished its backward (:func:`zero.hsdp.prefetched_in_backward`)."""
    cfg = zero.Config.laptop(stage=3, world_size=world_size)
    out, spans = {}, {}
    for on in (True, False):
        o = warm_cluster(world_size).run(zero.hsdp.mesh_worker, cfg, (), "fp32", "fp32", on)[0]
        back = [e for e in o["events"] if e["lane"] in ("all-gather, backward", "reduce-scatter")]
        t0 = min(e["start"] for e in back)
        back = [{**e, "start": e["start"] - t0, "end": e["end"] - t0} for e in back]
        rs = sorted((e for e in back if e["lane"] == "reduce-scatter"), key=lambda e: e["start"])
        computes = [{"lane": "backward compute", "layer": e["layer"], "end": e["start"],
                     "start": max(x["end"] for x in back if x["end"] <= e["start"])} for e in rs]
        label = ("default: gathers the previous layer in this layer's pre-backward" if on else
                 "set_modules_to_backward_prefetch([itself]): no prefetch")
        spans[label] = back + computes
        out[on] = {"prefetched": zero.hsdp.prefetched_in_backward(o["events"]), "layers": len(rs),
                   "losses": o["losses"], "sent": o["bytes_sent"]}
        print(f"backward prefetch {'on ' if on else 'off'}: {out[on]['prefetched']} of {len(rs) - 1} layers' "
              "all-gathers issued before\n  the next layer's backward had finished "
              "(its reduce-scatter began)")
    display(plots.memory.backward_timeline(
        spans, f"FSDP2, rank 0 of {world_size}, the last step's backward (layers run {len(rs) - 1} → 0): "
               "when each all-gather is issued"))
    return out
