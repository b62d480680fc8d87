"""Figures of chapter 8: counted bytes beside their formulas, memory per rank, experts' load."""

from __future__ import annotations

import plotly.graph_objects as go

from .common import COLORS, legend_outside, titled, wrap


def _categories(labels: list[str], width: int = 16) -> list[str]:
    """Bar labels broken into lines: long ones would be turned sideways and cut at the figure's foot."""
    return [wrap(label, width) for label in labels]


@titled
def bytes_vs_formula(rows: list[dict], title: str) -> go.Figure:
    """rows: {label, counted, formula} in bytes per rank — bars counted, markers the formula."""
    labels = _categories([r["label"] for r in rows])
    fig = go.Figure()
    fig.add_bar(x=labels, y=[r["counted"] / 1e3 for r in rows], name="counted<br>(our ring's messages)",
                marker_color=COLORS["comm"])
    fig.add_scatter(x=labels, y=[r["formula"] / 1e3 for r in rows], mode="markers", name="formula",
                    marker={"symbol": "line-ew-open", "size": 40, "color": "black", "line": {"width": 3}})
    fig.update_layout(title=wrap(title, 80), yaxis_title="kB sent per rank", height=420, margin={"t": 90})
    fig.update_xaxes(automargin=True, tickangle=0)
    return legend_outside(fig)


@titled
def memory_per_rank(rows: list[dict], title: str) -> go.Figure:
    """rows: {label, params, block_activations, measured_peak} in bytes (one rank each)."""
    labels = _categories([r["label"] for r in rows])
    fig = go.Figure()
    fig.add_bar(x=labels, y=[r["params"] / 1e6 for r in rows], name="parameters<br>(inventory)",
                marker_color=COLORS["params"])
    fig.add_bar(x=labels, y=[r["block_activations"] / 1e6 for r in rows],
                name="activations the blocks<br>save (inventory)", marker_color=COLORS["activations"])
    fig.add_scatter(x=labels, y=[r["measured_peak"] / 1e6 for r in rows], mode="markers",
                    name="peak allocated, forward<br>+ backward (measured)",
                    marker={"symbol": "diamond", "size": 14, "color": "black"})
    fig.update_layout(barmode="group", title=wrap(title, 80), yaxis_title="MB on one rank", height=440,
                      margin={"t": 90})
    fig.update_xaxes(automargin=True, tickangle=0)
    return legend_outside(fig)


@titled
def expert_load(loads: list[list[int]], capacity: int, title: str) -> go.Figure:
    """loads[rank][expert]: tokens each rank's router sent to each expert; the capacity line."""
    fig = go.Figure()
    experts = list(range(len(loads[0])))
    for r, load in enumerate(loads):
        fig.add_bar(x=[f"expert {e}" for e in experts], y=load, name=f"from rank {r}")
    fig.add_hline(y=capacity, line_dash="dash", annotation_text=f"capacity {capacity} per rank")
    fig.update_layout(barmode="group", title=wrap(title, 80), yaxis_title="tokens routed", height=400,
                      margin={"t": 90})
    return legend_outside(fig)


@titled
def ring_blocks(held: list[list[int]], causal: bool, title: str) -> go.Figure:
    """held[rank][step]: the K/V block each rank held at each step of the ring; under ``causal``,
    the blocks of later tokens (block > rank) are marked skipped, the rank's own one triangular."""
    ranks, steps = len(held), len(held[0])

    def label(r: int, j: int) -> str:
        if not causal or j < r:
            return f"block {j}"
        return f"block {j}<br>(own: triangle)" if j == r else f"block {j}<br>(skipped: later)"

    fig = go.Figure(go.Heatmap(
        z=held, x=[f"step {s}" for s in range(steps)], y=[f"rank {r}" for r in range(ranks)],
        text=[[label(r, j) for j in row] for r, row in enumerate(held)], texttemplate="%{text}",
        colorscale="Viridis", zmin=0, zmax=ranks - 1, xgap=3, ygap=3,
        colorbar={"title": "K/V block", "tickvals": list(range(ranks))},
        hovertemplate="%{y}, %{x}: %{text}<extra></extra>"))
    fig.update_layout(title=wrap(title, 80), height=120 + 70 * ranks, margin={"t": 90},
                      yaxis={"autorange": "reversed"})
    return fig
