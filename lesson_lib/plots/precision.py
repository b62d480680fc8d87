"""Chapter 4's precision figure: fp32, fp16 with and without loss scaling, bf16 (§10)."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .common import titled

COLORS = {"fp32": "#4C78A8", "fp16": "#E45756", "fp16+scaling": "#54A24B", "bf16": "#F58518"}


@titled
def loss_scaling(runs: dict) -> go.Figure:
    """Per precision (``runs``: name → ``loss_scaling.train``'s result): the training loss per step
    and the share of gradient values that are exactly zero, per step."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12, subplot_titles=(
        "training loss", "gradient values exactly zero (share)"))
    for name, r in runs.items():
        style = {"color": COLORS.get(name), "dash": "dot" if name == "fp16+scaling" else "solid"}
        steps = list(range(len(r["losses"])))
        fig.add_scatter(x=steps, y=r["losses"], name=name, line=style, legendgroup=name, row=1, col=1)
        fig.add_scatter(x=steps, y=r["zero_share"], name=name, line=style, legendgroup=name,
                        showlegend=False, row=1, col=2)
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(range=[0, 1], row=1, col=2)
    fig.update_layout(height=380, margin={"t": 70}, legend={"orientation": "h", "y": -0.25},
                      title="One start, the same batches, four precisions: unscaled fp16 loses gradients")
    return fig


@titled
def reduce_gaps(gaps: dict[str, list[float]], tolerance: float, title: str) -> go.Figure:
    """Per run (``gaps``: label → |loss − fp32 reference| per step) the gap per step, and the rounding
    tolerance as a line (chapter 4, §8: the precision FSDP2 reduces gradients in)."""
    fig = go.Figure()
    for (label, g), color in zip(gaps.items(), ("#F58518", "#4C78A8", "#54A24B")):
        fig.add_scatter(x=list(range(len(g))), y=g, name=label, mode="lines+markers", line={"color": color})
    fig.add_hline(y=tolerance, line_dash="dash", line_color="#BAB0AC",
                  annotation_text="bf16 rounding allows", annotation_position="top left")
    fig.update_layout(title=title, height=380, margin={"t": 70}, xaxis_title="step",
                      yaxis_title="|loss − fp32 single process|", legend={"orientation": "h", "y": -0.25})
    return fig
