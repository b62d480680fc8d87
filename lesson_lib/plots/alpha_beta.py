"""Figures of the α-β model at cluster scale (chapter 2 §8): a real interconnect's α and β, where
latency takes over, and which all-reduce algorithm the model says is fastest."""

from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .collectives import ALG_COLORS
from .common import log_axes, titled, wrap


@titled
def algorithms_at_scale(rows: list[dict], crossover: list[dict], sizes: list[float], nbytes: float,
                        title: str) -> go.Figure:
    """Left: rows {world_size, algorithm, size_bytes, time_s}, the model's time of the ring, the tree
    and halving-doubling for ``nbytes`` as N grows. Right: crossover {world_size, bytes}, the size
    above which the ring beats the double binary tree, with the message ``sizes`` as horizontal lines."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=(
        f"predicted all-reduce time, {nbytes / 1e6:g} MB", "ring or tree: which is faster"))
    for alg in ("ring", "tree", "halving-doubling"):  # the naive root, far above, would flatten these
        rs = [r for r in rows if r["algorithm"] == alg and r["size_bytes"] == nbytes]
        fig.add_scatter(x=[r["world_size"] for r in rs], y=[1e3 * r["time_s"] for r in rs], name=alg,
                        mode="lines+markers", line={"color": ALG_COLORS.get(alg),
                                                    "dash": "dash" if alg == "halving-doubling" else "solid"},
                        row=1, col=1)
    xs = [c["world_size"] for c in crossover]
    fig.add_scatter(x=xs, y=[c["bytes"] / 1e6 for c in crossover], name="ring = tree: S = N·(N−1−log₂N)·α/β",
                    mode="lines", line={"color": "black"}, row=1, col=2)
    for s in sizes:
        fig.add_scatter(x=[min(xs), max(xs)], y=[s / 1e6] * 2, mode="lines", showlegend=False,
                        line={"color": "#888", "dash": "dot", "width": 1}, row=1, col=2)
        fig.add_annotation(x=1, xref="x2 domain", xanchor="right", y=math.log10(s / 1e6), yref="y2",
                           yanchor="bottom",  # on a log axis an annotation sits at log10 of its value
                           text=f"{s / 1e6:g} MB", showarrow=False, font={"size": 11})
    for text, x, y in (("ring faster (above)", 0.05, 0.95), ("tree faster (below)", 0.95, 0.05)):
        fig.add_annotation(x=x, y=y, xref="x2 domain", yref="y2 domain", text=text, showarrow=False,
                           xanchor="left" if x < 0.5 else "right")
    fig.update_xaxes(type="log", title_text="ranks N")
    fig.update_yaxes(type="log", title_text="ms (model)", row=1, col=1)
    fig.update_yaxes(type="log", title_text="message size S (MB)", row=1, col=2)
    fig.update_layout(title=title, height=450, margin={"t": 110})
    return log_axes(fig)  # decades labelled, 2…9 as minor ticks


@titled
def at_scale(rows: list[dict], link: str, title: str) -> go.Figure:
    """rows: {link, algorithm, size_bytes, world_size, time_s, latency_share} from the α-β model.

    Left: the ring's predicted time with a real interconnect's α and β, and with this laptop's fitted
    ones beside it: an illustration of how far a loopback fit is from a network, not a prediction.
    Right: on that interconnect, the share of each all-reduce that is latency (2(N−1)·α for the ring,
    2·log₂N·α for halving-doubling), per message size; above 0.5 latency dominates.
    """
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12, subplot_titles=(
        "predicted all-reduce time, ring", wrap(f"share of it that is latency, {link}", 40)))
    sizes = sorted({r["size_bytes"] for r in rows})
    mid = sizes[len(sizes) // 2]
    for i, name in enumerate(dict.fromkeys(r["link"] for r in rows)):
        rs = [r for r in rows if r["link"] == name and r["algorithm"] == "ring" and r["size_bytes"] == mid]
        fig.add_scatter(x=[r["world_size"] for r in rs], y=[1e3 * r["time_s"] for r in rs],
                        name=f"{name}{' — illustration only' if i == 0 else ''}, {mid / 1e6:g} MB",
                        mode="lines+markers",
                        line={"dash": "dot" if i == 0 else "solid", "color": ALG_COLORS["ring"]},
                        row=1, col=1)
    shades = ["#9ECAE9", "#4C78A8", "#1F3B5A"]
    for j, s in enumerate(sizes):
        for alg, dash in (("ring", "solid"), ("halving-doubling", "dash")):
            rs = [r for r in rows if r["link"] == link and r["algorithm"] == alg and r["size_bytes"] == s]
            fig.add_scatter(x=[r["world_size"] for r in rs], y=[r["latency_share"] for r in rs],
                            name=f"{alg}, {s / 1e6:g} MB", mode="lines",
                            line={"dash": dash, "color": shades[j % len(shades)]}, row=1, col=2)
    fig.add_hline(y=0.5, line={"color": "#888", "width": 1}, row=1, col=2)
    fig.update_xaxes(type="log", title_text="ranks N")
    fig.update_yaxes(type="log", title_text="ms (model)", row=1, col=1)
    fig.update_yaxes(title_text="latency / total (model)", range=[0, 1], row=1, col=2)
    # the title wrapped and the legend below: beside the plots it squeezed them until their titles
    # overlapped, and the one-line title ran past the figure's edge
    fig.update_layout(title=wrap(title, 80), height=560, margin={"t": 130, "b": 40},
                      legend={"orientation": "h", "y": -0.2, "yanchor": "top", "x": 0})
    return log_axes(fig)  # decades labelled, 2…9 as minor ticks
