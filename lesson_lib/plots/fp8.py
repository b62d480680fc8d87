"""Chapter 9's figures: the FP8 grids, each recipe's error as outliers grow, the loss curves."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .common import log_axes, titled

COLORS = {"fp32": "#4C78A8", "bf16": "#F58518", "fp8": "#54A24B", "fp8 unscaled": "#E45756"}


@titled
def grids(values: dict) -> go.Figure:
    """``values``: format → its non-negative finite values (:func:`formats.grid`), on a log axis."""
    fig = go.Figure()
    for i, (name, v) in enumerate(values.items()):
        v = [x for x in v.tolist() if x > 0]
        fig.add_scatter(
            x=v, y=[i] * len(v), mode="markers", name=name, marker={"symbol": "line-ns-open", "size": 14}
        )
    fig.update_xaxes(type="log", title_text="value (log scale)")
    fig.update_yaxes(
        tickvals=list(range(len(values))), ticktext=list(values), range=[-0.7, len(values) - 0.3]
    )
    fig.update_layout(
        height=260,
        title="Every positive value e4m3 and e5m2 hold: e4m3 finer, e5m2 wider",
        showlegend=False,
        margin={"t": 50},
    )
    return log_axes(fig)  # decades labelled, 2…9 as minor ticks


@titled
def outlier_sweep(rows: list[dict]) -> go.Figure:
    fig = go.Figure()
    for recipe in dict.fromkeys(r["recipe"] for r in rows):
        mine = [r for r in rows if r["recipe"] == recipe]
        fig.add_scatter(
            x=[r["outlier"] for r in mine], y=[r["error"] for r in mine], name=recipe, mode="lines+markers"
        )
    fig.update_xaxes(type="log", title_text="outlier size (× the bulk of the activations)")
    fig.update_yaxes(type="log", title_text="mean relative error per row")
    fig.update_layout(
        height=340,
        title="A matmul in e4m3 against fp32: per-tensor scaling fails once "
        "outliers push the bulk into the subnormals",
        margin={"t": 50},
    )
    return log_axes(fig)  # decades labelled, 2…9 as minor ticks


@titled
def losses(runs: dict, title: str) -> go.Figure:
    """``runs``: label → losses per step."""
    fig = make_subplots(rows=1, cols=1)
    for name, ls in runs.items():
        key = name.split(",")[0]
        fig.add_scatter(
            x=list(range(len(ls))),
            y=ls,
            name=name,
            line={"color": COLORS.get(key), "dash": "dot" if "÷" in name else "solid"},
        )
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text="training loss")
    fig.update_layout(height=360, title=title, margin={"t": 50})
    return fig


@titled
def terms(rows: list[dict], title: str) -> go.Figure:
    """``rows``: label → {term: seconds}, stacked."""
    fig = go.Figure()
    for term in rows[0]["terms"]:
        fig.add_bar(x=[r["label"] for r in rows], y=[r["terms"][term] for r in rows], name=term)
    fig.update_layout(
        barmode="stack", height=360, title=title, yaxis_title="seconds per step", margin={"t": 50}
    )
    return fig
