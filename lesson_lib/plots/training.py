"""Figures of chapters 0 and 1: data parallelism and the parameter server."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..results import RankResult
from .common import COLORS, _annotate, log_axes, oversubscription_note, titled


@titled
def model_growth(rows: list[dict]) -> go.Figure:
    """Parameters of landmark models by year, log scale (chapter 0). Labels go above their points, where
    they do not run into another's: beside a point that shares its year with a larger model, below one
    alone in its year that a larger model of a neighbouring year sits within half a decade of."""
    years, sizes = [int(r["year"]) for r in rows], [float(r["parameters"]) for r in rows]
    beside = [any(y == y2 and p < p2 for y2, p2 in zip(years, sizes)) for y, p in zip(years, sizes)]
    below = [years.count(y) == 1
             and any(abs(y - y2) == 1 and p < p2 < p * 10 ** 0.5 for y2, p2 in zip(years, sizes))
             for y, p in zip(years, sizes)]
    fig = go.Figure(go.Scatter(
        x=years, y=sizes, text=[r["model"] for r in rows], mode="markers+text",
        textposition=["middle right" if b else "bottom center" if lo else "top center"
                      for b, lo in zip(beside, below)],
        hovertext=[r["source"] for r in rows], marker={"size": 10}))
    fig.update_yaxes(type="log", title="parameters")
    # room on the right for a label beside a point of the last year; ticks only where there are years
    last_beside = any(b for y, b in zip(years, beside) if y == max(years))
    fig.update_xaxes(title="year", tickvals=list(range(min(years), max(years) + 1)),
                     range=[min(years) - 0.5, max(years) + (1.8 if last_beside else 0.5)])
    fig.update_layout(title="Model size 2012–2021 (sources in data/model_sizes.csv)", height=420)
    return log_axes(fig)  # decades labelled, 2…9 as minor ticks


@titled
def time_split(results: dict, title: str = "Where a step's time goes") -> go.Figure:
    """Per run and rank: median compute and communication time per step, with busy time beside."""
    fig = go.Figure()
    xs, compute, comm, busy = [], [], [], []
    for label, r in results.items():
        for rank, (c, m, b) in enumerate(zip(r.median_step("compute_s"), r.median_step("comm_s"),
                                             r.median_step("busy_s"))):
            xs.append(f"{label} · r{rank}")
            compute.append(1e3 * c)
            comm.append(1e3 * m)
            busy.append(1e3 * b)
    fig.add_bar(x=xs, y=compute, name="compute (wall)", marker_color=COLORS["compute"], offsetgroup=0)
    fig.add_bar(x=xs, y=comm, name="communication (wall)", marker_color=COLORS["comm"],
                offsetgroup=0, base=compute)
    fig.add_bar(x=xs, y=busy, name="busy (CPU time)", marker_color=COLORS["busy"], offsetgroup=1)
    fig.update_layout(title=title, yaxis_title="ms per step (median)", height=400, barmode="group")
    _annotate(fig, oversubscription_note(results.values()))
    return fig


@titled
def memory_by_category(result, title: str = "Memory per rank, by inventory") -> go.Figure:
    """What each rank knows it holds, by category: an inventory (metrics.memory_report), not the
    allocator's measured peak (lesson_lib.peakmem, chapters 0 and 4)."""
    fig = go.Figure()
    ranks = [f"rank {r.rank}" for r in result.per_rank]
    for cat in ("params", "grads", "optimizer", "activations", "buffers"):
        fig.add_bar(x=ranks, y=[r.memory[cat] / 1e6 for r in result.per_rank], name=cat,
                    marker_color=COLORS[cat])
    fig.update_layout(barmode="stack", title=title, yaxis_title="MB", height=360)
    return fig


def wait_split(per_rank: RankResult) -> dict:
    """One rank's time over its steps (the first skipped): busy (its main thread's CPU time),
    waiting for a core (runnable, but another process had the core: Linux's run-queue wait) and
    waiting for peers (blocked in a receive: the rest of the wall time). ``core`` is None where the
    run-queue wait was not measured (not Linux, or a milestone that does not record it)."""
    steps = per_rank.steps[1:] or per_rank.steps
    wall = sum(s.wall_s for s in steps)
    busy = sum(s.busy_s for s in steps)
    queued = [float("nan") if s.runqueue_s is None else s.runqueue_s for s in steps]
    core = sum(queued) if steps and all(q == q for q in queued) else None
    rest = max(0.0, wall - busy - (core or 0.0))
    return {"wall": wall, "busy": busy, "core": None if core is None else min(core, wall - busy),
            "peers": rest}


@titled
def busy_idle(result, title: str = "Busy and waiting time per rank") -> go.Figure:
    """Per rank: busy (CPU) time, time waiting for a core and time waiting for peers (idle resources)."""
    ranks = [f"rank {r.rank}" for r in result.per_rank]
    split = [wait_split(r) for r in result.per_rank]
    measured = all(s["core"] is not None for s in split)
    bars = [go.Bar(x=ranks, y=[s["busy"] for s in split], name="busy (CPU time)",
                   marker_color=COLORS["busy"])]
    if measured:
        bars.append(go.Bar(x=ranks, y=[s["core"] for s in split], name="waiting for a core (run queue)",
                           marker_color=COLORS["comm"]))
    bars.append(go.Bar(x=ranks, y=[s["peers"] for s in split], marker_color=COLORS["idle"],
                       name="waiting for peers (blocked in communication)" if measured
                       else "waiting (for peers or for a core)"))
    fig = go.Figure(bars)
    fig.update_layout(barmode="stack", title=title, yaxis_title="seconds (steps 1…, step 0 skipped)",
                      height=380)
    _annotate(fig, oversubscription_note([result]))
    return fig


@titled
def step_times(results: dict, title: str = "Wall time per step, and each rank's work (CPU time)"):
    """Per run: the slowest rank's wall time per step (solid) and each rank's busy time (dotted)."""
    fig = go.Figure()
    palette = ["#4C78A8", "#F58518", "#54A24B", "#E45756"]
    for i, (label, r) in enumerate(results.items()):
        color = palette[i % len(palette)]
        ts = r.step_times()[1:]
        steps = list(range(1, len(ts) + 1))
        fig.add_scatter(x=steps, y=[1e3 * t for t in ts], name=f"{label}: step (wall)", mode="lines+markers",
                        line={"color": color})
        for p in r.per_rank:
            fig.add_scatter(x=steps, y=[1e3 * s.busy_s for s in p.steps[1:]], mode="lines",
                            name=f"{label}: rank {p.rank} work (CPU)",
                            line={"color": color, "dash": "dot" if p.rank % 2 == 0 else "dash"})
    fig.update_layout(title=title, xaxis_title="step (warm-up step 0 not shown)", yaxis_title="ms",
                      height=400)
    _annotate(fig, oversubscription_note(results.values()))
    return fig


@titled
def comm_vs_size(rows: list[dict], title: str = "Communication grows with the model") -> go.Figure:
    """rows: {params, counted_bytes, formula_bytes, comm_ms, compute_ms, busy_ms} per model size."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("bytes sent per rank per step",
                                                        "time per step (median, ms)"))
    x = [r["params"] for r in rows]
    fig.add_scatter(x=x, y=[r["counted_bytes"] for r in rows], name="counted", mode="markers",
                    marker={"size": 11}, row=1, col=1)
    fig.add_scatter(x=x, y=[r["formula_bytes"] for r in rows], name="2(N−1)/N · S", mode="lines",
                    row=1, col=1)
    for key, name in (("compute_ms", "compute"), ("comm_ms", "communication"), ("busy_ms", "busy")):
        fig.add_scatter(x=x, y=[r[key] for r in rows], name=name, mode="lines+markers",
                        line={"color": COLORS[key[:-3] if key != "comm_ms" else "comm"]}, row=1, col=2)
    fig.update_xaxes(type="log", title="parameters")
    fig.update_yaxes(type="log")
    fig.update_layout(title=title, height=380)
    return log_axes(fig)  # decades labelled, 2…9 as minor ticks


@titled
def comm_share(rows: list[dict], title: str = "Share of the step spent communicating") -> go.Figure:
    """rows: {label, share} — e.g. one per world size."""
    fig = go.Figure(go.Bar(x=[r["label"] for r in rows], y=[100 * r["share"] for r in rows],
                           marker_color=COLORS["comm"]))
    fig.update_layout(title=title, yaxis_title="% of wall time in communication", height=340)
    return fig


# --------------------------------------------------------------------------- chapter 1


PHASE_COLORS = {"compute": COLORS["compute"], "push": COLORS["comm"], "pull (waiting)": COLORS["idle"]}


@titled
def loss_curves(curves: dict, title: str = "Loss against wall time and against updates") -> go.Figure:
    """curves: label → {"time": [...], "updates": [...], "loss": [...]} (chapter 1)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("against wall time", "against server updates"))
    for i, (label, c) in enumerate(curves.items()):
        color = ["#4C78A8", "#F58518", "#54A24B", "#E45756"][i % 4]
        fig.add_scatter(x=c["time"], y=c["loss"], name=label, line={"color": color}, row=1, col=1)
        fig.add_scatter(x=c["updates"], y=c["loss"], name=label, showlegend=False,
                        line={"color": color}, row=1, col=2)
    fig.update_yaxes(title_text="global training loss", row=1, col=1)
    fig.update_xaxes(title_text="seconds since step 0 ended", row=1, col=1)
    fig.update_xaxes(title_text="updates the server applied", row=1, col=2)
    fig.update_layout(title=title, height=380)
    return fig


@titled
def timeline(segments: list[dict], title: str, note: str | None = None) -> go.Figure:
    """Per-worker Gantt chart of measured phases: {worker, step, phase, start, end} (chapter 1)."""
    segments = [s for s in segments if s["step"] > 0] or segments  # step 0 is warm-up
    t0 = min(s["start"] for s in segments)
    fig = go.Figure()
    for phase, color in PHASE_COLORS.items():
        seg = [s for s in segments if s["phase"] == phase]
        fig.add_bar(y=[f"worker {s['worker']}" for s in seg], x=[1e3 * (s["end"] - s["start"]) for s in seg],
                    base=[1e3 * (s["start"] - t0) for s in seg], orientation="h", name=phase,
                    marker_color=color, hovertext=[f"step {s['step']}" for s in seg])
    fig.update_layout(title=title, barmode="overlay", xaxis_title="ms since step 1 began (warm-up step 0 "
                      "not shown)", height=220 + 40 * len({s["worker"] for s in segments}),
                      legend={"orientation": "v", "x": 1.01, "y": 1, "yanchor": "top"})  # clear of the bars
    _annotate(fig, note)
    return fig


@titled
def staleness_histogram(hist: dict, title: str = "Staleness of the gradients the server applied"):
    xs = sorted(int(k) for k in hist)
    fig = go.Figure(go.Bar(x=xs, y=[hist[str(x)] for x in xs], marker_color=COLORS["comm"]))
    fig.update_layout(title=title, xaxis_title="updates applied since the worker pulled its parameters",
                      yaxis_title="gradients", height=320)
    return fig


@titled
def traffic_vs_formula(rows: list[dict], x: str, xlabel: str, title: str, note: str | None = None):
    """rows: {x, counted, formula, step_ms[, busy_ms][, door_ms]} — counted bytes against the formula,
    and step time (with busy time beside it, or the time the bytes need on an emulated link)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("bytes per step", "step time (ms, median)"))
    xs = [str(r[x]) for r in rows]
    fig.add_bar(x=xs, y=[r["counted"] for r in rows], name="counted", marker_color=COLORS["comm"],
                row=1, col=1)
    fig.add_scatter(x=xs, y=[r["formula"] for r in rows], name="formula", mode="lines+markers",
                    line={"color": "black", "dash": "dot"}, row=1, col=1)
    fig.add_scatter(x=xs, y=[r["step_ms"] for r in rows], name="step time", mode="lines+markers",
                    row=1, col=2)
    if all("busy_ms" in r for r in rows):
        fig.add_scatter(x=xs, y=[r["busy_ms"] for r in rows], name="busy (CPU time)",
                        mode="lines+markers", line={"color": COLORS["busy"]}, row=1, col=2)
    if all("door_ms" in r for r in rows):
        fig.add_scatter(x=xs, y=[r["door_ms"] for r in rows], name="N·S / B: the server's link, each way",
                        mode="lines+markers", line={"color": "grey", "dash": "dash"}, row=1, col=2)
    fig.update_xaxes(title_text=xlabel, type="category")
    fig.update_layout(title=title, height=360)
    _annotate(fig, note)
    return fig


@titled
def overlap_timeline(runs: dict, title: str, note: str | None = None) -> go.Figure:
    """One step per run and rank: the backward, and each gradient bucket's all-reduce (chapter 0).

    ``runs`` maps a label to the run's ``timeline`` (one dict per rank: ``backward`` as
    (start, end) and ``buckets`` with ``start``/``end``), in ``time.perf_counter`` seconds; each
    rank's bars start at its own backward.
    """
    fig = make_subplots(rows=len(runs), cols=1, shared_xaxes=True, subplot_titles=list(runs),
                        vertical_spacing=0.18)
    legend = set()
    for row, per_rank in enumerate(runs.values(), start=1):
        for rank, t in enumerate(per_rank):
            t0, t1 = t["backward"]
            bars = [("backward (compute)", f"rank {rank} compute", t0, t1, COLORS["compute"], "")]
            bars += [("all-reduce (communication)", f"rank {rank} comm", b["start"], b["end"], COLORS["comm"],
                      f"bucket {b['bucket']}") for b in t["buckets"]]
            for name, y, start, end, color, text in bars:
                fig.add_bar(y=[y], x=[1e3 * (end - start)], base=[1e3 * (start - t0)], orientation="h",
                            name=name, marker_color=color, text=[text], textposition="inside",
                            showlegend=name not in legend, legendgroup=name, row=row, col=1)
                legend.add(name)
    fig.update_xaxes(title_text="ms since the rank's backward began", row=len(runs), col=1)
    fig.update_layout(title=title, barmode="overlay", height=200 + 150 * len(runs),
                      legend={"orientation": "h", "y": -0.25})
    _annotate(fig, note)
    return fig
