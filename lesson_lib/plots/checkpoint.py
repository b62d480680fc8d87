"""Figure of chapter 4, section 9: the loss of an uninterrupted run beside a run whose rank was
killed and that resumed from its last checkpoint on fresh processes."""

from __future__ import annotations

import plotly.graph_objects as go

from .common import COLORS, titled, wrap


@titled
def resumed_loss(run: dict, title: str) -> go.Figure:
    """``run``: what ``zero.checkpoint.survive`` returned — loss by step uninterrupted, killed (up to
    the kill) and resumed (from the restored step), with the kill and the restore marked."""
    fig = go.Figure()
    base = run["uninterrupted"]
    fig.add_scatter(x=list(range(len(base))), y=base, name="uninterrupted", mode="lines",
                    line={"color": "#BAB0AC", "width": 8})
    killed, resumed = run["killed"], run["resumed"]
    fig.add_scatter(x=list(killed), y=list(killed.values()), name=f"rank {run['kill_rank']} killed",
                    mode="lines+markers", line={"color": COLORS["compute"]})
    fig.add_scatter(x=list(resumed), y=list(resumed.values()), name="resumed on fresh processes",
                    mode="lines+markers", line={"color": COLORS["comm"], "dash": "dash"},
                    marker={"symbol": "circle-open", "size": 10})
    fig.add_vline(x=run["kill_step"], line={"color": "#E45756", "dash": "dot"},
                  annotation_text=f"SIGKILL, step {run['kill_step']}", annotation_position="top right")
    fig.add_vline(x=run["restored_step"], line={"color": COLORS["busy"], "dash": "dot"},
                  annotation_text=f"resumed from the checkpoint after {run['restored_step']} steps",
                  annotation_position="bottom left")
    for s in range(run["every"], len(base) + 1, run["every"]):
        fig.add_vline(x=s - 0.5, line={"color": "#888888", "width": 1})  # saved after step s - 1
    fig.update_layout(title=wrap(title, 80), xaxis_title="step (thin grey lines: a checkpoint saved)",
                      yaxis_title="global training loss", height=430, margin={"t": 90},
                      legend={"orientation": "h", "y": -0.2})
    return fig
