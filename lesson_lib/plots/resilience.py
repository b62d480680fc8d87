"""Figures of chapter 10: goodput against the checkpoint interval, a replica's death and return step
by step, and DiLoCo against data parallelism (held-out loss by bytes and by time over a slow link)."""

from __future__ import annotations

import math

import plotly.graph_objects as go

from .common import COLORS, log_axes, room_for_labels, titled, wrap


@titled
def goodput_curve(rows: list[dict], marks: dict[str, float], title: str) -> go.Figure:
    """``rows``: ``{"tau_s", "goodput"}`` along the interval; ``marks``: name → (interval (s), goodput)."""
    fig = go.Figure()
    fig.add_scatter(x=[r["tau_s"] / 60 for r in rows], y=[r["goodput"] for r in rows], mode="lines",
                    name="goodput (first-order model)", line={"color": COLORS["compute"]})
    for i, (name, (tau, g)) in enumerate(marks.items()):  # markers, not vlines: shapes on a log axis
        fig.add_scatter(x=[tau / 60], y=[g], mode="markers+text", text=[name], name=name,
                        textposition="top center" if i else "bottom center",
                        marker={"size": 11, "color": COLORS["comm"] if i else "#E45756"})
    shown = [r["goodput"] for r in rows] + [g for _, g in marks.values()]
    fig.update_layout(title=wrap(title, 80), xaxis_title="checkpoint interval τ (minutes, log)",
                      xaxis_type="log", yaxis_title="useful time / wall time", height=420, margin={"t": 90},
                      yaxis_range=room_for_labels(shown, below=0.2))  # the first mark's label hangs below
    return log_axes(fig)  # decades labelled, 2…9 as minor ticks


@titled
def replica_steps(runs: dict[str, dict], title: str, marks: tuple = ()) -> go.Figure:
    """``runs``: name → one replica's ``times`` (``{"step", "t", "s"}``, ``t`` on the machine's monotonic
    clock, which every process shares); each step's wall time against one clock, so a replica that was
    killed and restarted shows the gap. ``marks``: ``(name, step, text)``, a step labelled on a line
    (the discarded step, the heal)."""
    fig = go.Figure()
    t0 = min((t["t"] - t["s"] for times in runs.values() for t in times), default=0)
    for i, (name, times) in enumerate(runs.items()):
        fig.add_scatter(x=[t["t"] - t0 for t in times], y=[t["s"] * 1e3 for t in times], name=name,
                        mode="lines+markers", line={"color": [COLORS["compute"], COLORS["comm"],
                                                             COLORS["busy"]][i % 3]})
    for j, (name, step, text) in enumerate(marks):
        point = next((t for t in runs.get(name, ()) if t["step"] == step), None)
        if point is not None:
            fig.add_annotation(x=point["t"] - t0, y=math.log10(point["s"] * 1e3), text=text, showarrow=True,
                               arrowhead=2, ax=0, ay=-40 if j % 2 == 0 else 40, bgcolor="white")
    fig.update_layout(title=wrap(title, 80), xaxis_title="seconds since the first replica's first step",
                      yaxis_title="the step's wall time (ms, log)", yaxis_type="log", height=420,
                      margin={"t": 90}, legend={"orientation": "h", "y": -0.2})
    return log_axes(fig)  # decades labelled, 2…9 as minor ticks


@titled
def diloco_quality(rows: list[dict], title: str) -> go.Figure:
    """``rows``: ``{"label", "floats_sent", "held_out"}``: final held-out loss against floats sent."""
    fig = go.Figure()
    fig.add_scatter(x=[r["floats_sent"] for r in rows], y=[r["held_out"] for r in rows],
                    text=[r["label"] for r in rows], mode="markers+text", textposition="top center",
                    marker={"size": 12, "color": COLORS["comm"]}, showlegend=False)
    fig.update_layout(title=wrap(title, 80), xaxis_title="floats each replica sent (log)", xaxis_type="log",
                      yaxis_title="held-out loss after the same tokens", height=420, margin={"t": 90},
                      yaxis_range=room_for_labels([r["held_out"] for r in rows]))
    return log_axes(fig)  # decades labelled, 2…9 as minor ticks


@titled
def time_to_target(curves: dict[str, list], target: float, title: str, note: str) -> go.Figure:
    """``curves``: name → ``[(seconds, held-out loss), …]``; the target loss drawn across."""
    fig = go.Figure()
    for i, (name, pts) in enumerate(curves.items()):
        fig.add_scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], name=name, mode="lines",
                        line={"color": [COLORS["compute"], COLORS["comm"], COLORS["busy"]][i % 3]})
    fig.add_hline(y=target, line={"dash": "dot", "color": "#E45756"}, annotation_text="target loss")
    fig.add_annotation(text=wrap(note, 90), xref="paper", yref="paper", x=0, y=-0.24, yanchor="top",
                       showarrow=False, align="left")  # hung below the axis title, not over it
    fig.update_layout(title=wrap(title, 80), xaxis_title="wall seconds on the emulated link",
                      yaxis_title="held-out loss", height=490, margin={"t": 90, "b": 150})
    return fig


@titled
def internet_scale(rows: list[dict], title: str, note: str) -> go.Figure:
    """``rows``: ``{"label", "factor"}``: how many times fewer bytes than data parallelism, as reported."""
    fig = go.Figure()
    fig.add_bar(x=[r["label"] for r in rows], y=[r["factor"] for r in rows], marker_color=COLORS["comm"],
                text=[f"{r['factor']:,.0f}×" for r in rows], textposition="outside")
    fig.add_annotation(text=wrap(note, 90), xref="paper", yref="paper", x=0, y=-0.45, showarrow=False,
                       align="left")
    fig.update_layout(title=wrap(title, 80), yaxis_title="times fewer bytes than data parallel (log)",
                      yaxis_type="log", height=480, margin={"t": 90, "b": 170})
    return log_axes(fig)  # decades labelled, 2…9 as minor ticks
