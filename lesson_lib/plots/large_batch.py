"""Chapter 5's figures: loss against samples and time, quality against batch, trust ratios, cost."""

from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .common import _with_note, level, log_axes, titled

OPT_COLORS = {"sgd": "#E45756", "adam": "#4C78A8", "lars": "#F58518", "lamb": "#54A24B"}
_DASHES = ["solid", "dash", "dot", "dashdot", "longdash"]


@titled
def curves(results: dict, note: str | None = None) -> go.Figure:
    """Training loss against samples seen and against wall-clock time, per (optimizer, batch)."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1, subplot_titles=(
        "training loss vs samples seen", "training loss vs wall-clock time (s)"))
    batches = sorted({b for _, b in results})
    for (name, batch), r in results.items():
        samples = [s.samples for s in r.per_rank[0].steps]
        wall, t = [], 0.0
        for per_step in zip(*(p.steps for p in r.per_rank)):
            t += max(s.wall_s for s in per_step)
            wall.append(t)
        style = {"color": OPT_COLORS.get(name), "dash": _DASHES[batches.index(batch) % len(_DASHES)]}
        label = f"{name}, B={batch}"
        fig.add_scatter(x=samples, y=r.losses, name=label, line=style, row=1, col=1)
        fig.add_scatter(x=wall, y=r.losses, name=label, line=style, showlegend=False, row=1, col=2)
    fig.update_yaxes(type="log", title_text="loss")
    fig.update_xaxes(title_text="samples seen", row=1, col=1)
    fig.update_xaxes(title_text="seconds (slowest rank, summed over steps)", row=1, col=2)
    fig.update_layout(height=420, title=_with_note("Same budget of samples, growing batch", note),
                      legend={"orientation": "h", "y": -0.25}, margin={"t": 90})
    return log_axes(fig)  # decades labelled, 2…9 as minor ticks


@titled
def quality_vs_batch(rows: list[dict], base_batch: int, b_simple: float | None = None) -> go.Figure:
    """Held-out accuracy at the end of the budget, against the batch (x for a diverged run), with
    the measured noise scale B_simple as a vertical line when given."""
    fig = go.Figure()
    if b_simple is not None and math.isfinite(b_simple) and b_simple > 0:
        level(fig, b_simple, f"B_simple ≈ {b_simple:,.0f} (end of LAMB's B₀ run)", axis="x", log=True)
    for name in OPT_COLORS:
        mine = sorted((r for r in rows if r["optimizer"] == name), key=lambda r: r["batch"])
        if not mine:
            continue
        acc = [None if math.isnan(r["eval_accuracy"]) else r["eval_accuracy"] for r in mine]
        fig.add_scatter(x=[r["batch"] for r in mine], y=acc, name=name, mode="lines+markers",
                        line={"color": OPT_COLORS[name]})
        lost = [r for r in mine if math.isnan(r["eval_accuracy"])]
        if lost:
            fig.add_scatter(x=[r["batch"] for r in lost], y=[0.0] * len(lost), mode="markers",
                            marker={"symbol": "x", "size": 14, "color": OPT_COLORS[name]},
                            name=f"{name}: diverged (NaN)")
    fig.update_xaxes(type="log", title_text=f"global batch (base B₀ = {base_batch})")
    fig.update_yaxes(title_text="held-out accuracy", range=[0, 1])
    fig.update_layout(height=380, title="Quality at a fixed budget of samples, as the batch grows",
                      margin={"t": 60})
    return log_axes(fig)  # decades labelled, 2…9 as minor ticks


@titled
def trust_heatmap(ratios: list[list[float]], title: str) -> go.Figure:
    """Per-layer trust ratio (rows) over steps (columns)."""
    layers = len(ratios[0]) if ratios else 0
    z = [[step[i] for step in ratios] for i in range(layers)]
    fig = go.Figure(go.Heatmap(z=z, x=list(range(len(ratios))), y=[f"layer {i}" for i in range(layers)],
                               colorscale="Viridis", colorbar={"title": "ratio"}))
    fig.update_layout(height=320, title=title, xaxis_title="step", margin={"t": 60})
    return fig


@titled
def epoch_cost(rows: list[dict], note: str | None = None) -> go.Figure:
    """Time per epoch (wall and busy) and counted gradient bytes per epoch, against the batch."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12, subplot_titles=(
        "time per epoch (s)", "gradient bytes sent per epoch (busiest rank)"))
    rows = sorted(rows, key=lambda r: r["batch"])
    xs = [r["batch"] for r in rows]
    fig.add_scatter(x=xs, y=[r["epoch_wall_s"] for r in rows], name="wall clock", mode="lines+markers",
                    row=1, col=1)
    fig.add_scatter(x=xs, y=[r["epoch_busy_s"] for r in rows], name="busy (CPU time)",
                    mode="lines+markers", line={"dash": "dot"}, row=1, col=1)
    fig.add_scatter(x=xs, y=[r["grad_bytes_per_epoch"] for r in rows], name="counted",
                    mode="markers", marker={"size": 11}, row=1, col=2)
    fig.add_scatter(x=xs, y=[r["grad_bytes_per_epoch_formula"] for r in rows],
                    name="steps per epoch × 2(N−1)/N·S", mode="lines", row=1, col=2)
    fig.update_xaxes(type="log", title_text="global batch")
    fig.update_yaxes(type="log")
    fig.update_layout(height=380, title=_with_note("What a bigger batch saves per epoch", note),
                      margin={"t": 90}, legend={"orientation": "h", "y": -0.25})
    return log_axes(fig)  # decades labelled, 2…9 as minor ticks


@titled
def noise_scale(evals: list[dict], batches=()) -> go.Figure:
    """B_simple = tr(Σ)/|G|² at each evaluation (McCandlish et al., 2018), the batches beside it."""
    fig = go.Figure()
    fig.add_scatter(x=[e["epoch"] for e in evals], y=[e["b_simple"] for e in evals], mode="lines+markers",
                    name="B_simple = tr(Σ)/|G|², measured on the training set",
                    line={"color": OPT_COLORS["lamb"]})
    for b in batches:
        level(fig, b, f"B = {b:,}", log=True)
    fig.update_yaxes(type="log", title_text="batch size (samples)")
    fig.update_xaxes(title_text="epoch of LAMB's B₀ run")
    fig.update_layout(height=360, title="The simple noise scale grows as the loss falls", margin={"t": 60},
                      legend={"orientation": "h", "y": -0.25})
    return log_axes(fig)  # decades labelled, 2…9 as minor ticks


@titled
def accumulation(rows: list[dict]) -> go.Figure:
    """Gradient accumulation at one global batch (chapter 5, §7): rank 0's measured peak of allocated
    bytes per k, split at the first step, and the counted all-reduce bytes per step beside k times
    them (what all-reducing every micro-batch would send: a formula, not a run)."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12, subplot_titles=(
        "peak of allocated bytes, rank 0 (MB, measured)", "all-reduce bytes per step, rank 0"))
    xs = [f"k = {r['k']} ({r['micro_batch']} samples)" for r in rows]
    first = [r["at_first_step"][0] / 1e6 for r in rows]
    fig.add_bar(x=xs, y=first, name="alive at the first step (data set, model, gradient bucket)",
                row=1, col=1, marker_color="#BAB0AC")
    fig.add_bar(x=xs, y=[r["peak"][0] / 1e6 - f for r, f in zip(rows, first)], row=1, col=1,
                name="added during a step (activations of one micro-batch, momentum)", marker_color="#4C78A8")
    fig.add_scatter(x=xs, y=[r["grad_bytes_per_step"] for r in rows], mode="markers", marker={"size": 11},
                    name="counted: one all-reduce per step", row=1, col=2)
    fig.add_scatter(x=xs, y=[r["k"] * r["grad_bytes_per_step"] for r in rows], mode="lines+markers",
                    line={"dash": "dot"}, name="k × that: an all-reduce per micro-batch (formula)",
                    row=1, col=2)
    fig.update_yaxes(rangemode="tozero")
    fig.update_layout(barmode="stack", height=380, margin={"t": 70}, legend={"orientation": "h", "y": -0.25},
                      title="Gradient accumulation: one global batch in k micro-batches")
    return fig


@titled
def race(rows: list[dict], batch: int, small_batch_accuracy: float | None = None) -> go.Figure:
    """The fair race: held-out accuracy against the learning rate at ``batch``, one line per
    optimizer over its sweep (○ square-root rule, □ linear; ✕ at 0 for a run that diverged), and
    the small-batch accuracy as a horizontal line."""
    fig = go.Figure()
    if small_batch_accuracy is not None:
        level(fig, small_batch_accuracy, f"LAMB at B₀: {small_batch_accuracy:.3f}")
    for name in OPT_COLORS:
        mine = sorted((r for r in rows if r["optimizer"] == name), key=lambda r: r["lr"])
        if not mine:
            continue
        symbols = ["x" if r["diverged"] else "circle" if r["rule"] == "sqrt" else "square" for r in mine]
        fig.add_scatter(x=[r["lr"] for r in mine], y=[r["eval_accuracy"] for r in mine], name=name,
                        mode="lines+markers", line={"color": OPT_COLORS[name]},
                        marker={"size": 10, "symbol": symbols},
                        text=[f"×{r['multiplier']:g} base, {r['rule']} rule" for r in mine])
    fig.update_xaxes(type="log", title_text=f"learning rate at B = {batch:,} (after warm-up)")
    fig.update_yaxes(title_text="held-out accuracy", range=[-0.04, 1.02])  # a ✕ at 0 shown whole
    fig.update_layout(height=400, margin={"t": 60},
                      title=f"The same tuning budget for every optimizer at B = {batch:,}: "
                            "○ square-root rule, □ linear, ✕ diverged")
    return log_axes(fig)  # decades labelled, 2…9 as minor ticks
