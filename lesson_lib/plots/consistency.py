"""Figures of chapter 1 §4 and §6: bounded staleness, and a replicated shard surviving its primary."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .common import COLORS, RUN_COLORS, titled


@titled
def staleness_sweep(rows: list[dict], title: str) -> go.Figure:
    """rows: {label, bound, compute_ms, wait_ms, loss, max_lead, worker_lead}, one per staleness bound.

    Left: the fast workers' time per step, computing and waiting. Middle: the loss of the last
    rounds. Right: how far ahead workers ran — the server's measure (clock lead when it let a worker
    go on), the workers' own (pushes ahead of the straggler), and the bound itself.
    """
    fig = make_subplots(rows=1, cols=3, subplot_titles=(
        "fast workers: ms per step", "loss, mean of the last 5 rounds", "pushes ahead of the slowest"))
    xs = [r["label"] for r in rows]
    fig.add_bar(x=xs, y=[r["compute_ms"] for r in rows], name="computing", marker_color=COLORS["compute"],
                row=1, col=1)
    fig.add_bar(x=xs, y=[r["wait_ms"] for r in rows], name="pushing and waiting", marker_color=COLORS["idle"],
                row=1, col=1)
    fig.add_scatter(x=xs, y=[r["loss"] for r in rows], name="loss", mode="lines+markers",
                    line={"color": RUN_COLORS[3]}, row=1, col=2)
    fig.add_bar(x=xs, y=[r["max_lead"] for r in rows], name="most, seen by the server",
                marker_color=COLORS["comm"], row=1, col=3)
    fig.add_scatter(x=xs, y=[r["worker_lead"] for r in rows], name="ahead of worker 0, workers' clocks",
                    mode="markers", marker={"color": "black", "symbol": "diamond", "size": 9}, row=1, col=3)
    bounded = [r for r in rows if r["bound"] >= 0]
    fig.add_scatter(x=[r["label"] for r in bounded], y=[r["bound"] for r in bounded], name="the bound s",
                    mode="markers", marker={"color": "black", "symbol": "line-ew-open", "size": 22},
                    row=1, col=3)
    fig.update_xaxes(title_text="staleness bound s", type="category")
    for col, text in ((1, "ms (wall clock)"), (2, "loss"), (3, "pushes")):
        fig.update_yaxes(title_text=text, row=1, col=col)
    fig.update_layout(title=title, barmode="stack", height=400)
    return fig


@titled
def failover(losses: dict[str, list[float]], fail_at: int, run: dict, title: str) -> go.Figure:
    """Left: loss per step of each run (label → losses), the primary's departure marked. Right: the
    bytes of the failed run by kind, counted against the formula (``parameter_server.replicas.summarize``)."""
    fig = make_subplots(rows=1, cols=2, column_widths=[0.55, 0.45], subplot_titles=(
        "global training loss", "bytes over the run, counted (bars) and formula (dots)"))
    for i, (label, ys) in enumerate(losses.items()):
        fig.add_scatter(x=list(range(len(ys))), y=ys, name=label, mode="lines+markers",
                        line={"color": RUN_COLORS[i], "dash": ["solid", "dash", "dot"][i % 3]}, row=1, col=1)
    fig.add_vline(x=fail_at, line={"color": "#888", "dash": "dash"}, annotation_text="the primary leaves",
                  annotation_position="top right", row=1, col=1)
    kinds = {"pushes and pulls": "serving", "replication": "replication", "take-over": "recovery"}
    xs = list(kinds)
    fig.add_bar(x=xs, y=[run[f"{k}_bytes"] / 1e6 for k in kinds.values()], name="counted",
                marker_color=COLORS["comm"], row=1, col=2)
    fig.add_scatter(x=xs, y=[run[f"{k}_formula"] / 1e6 for k in kinds.values()], name="formula",
                    mode="markers", marker={"color": "black", "size": 9}, row=1, col=2)
    fig.update_xaxes(title_text="step", row=1, col=1)
    fig.update_yaxes(title_text="loss", row=1, col=1)
    fig.update_yaxes(title_text="MB", row=1, col=2)
    fig.update_layout(title=title, height=400)
    return fig
