"""Figures of chapter 4: ZeRO memory against the paper, traffic per stage."""

from __future__ import annotations

import plotly.graph_objects as go

from .common import COLORS, titled, wrap
from .training import traffic_vs_formula


@titled
def memory_vs_formula(rows: list[dict], title: str) -> go.Figure:
    """rows: {label, measured: {cat: bytes}, formula: {cat: bytes}} — stacked bars (an inventory) per
    stage, with the paper's total as a marker (chapter 4)."""
    fig = go.Figure()
    labels = [r["label"] for r in rows]
    for cat in ("params", "grads", "optimizer", "buffers"):
        fig.add_bar(x=labels, y=[r["measured"].get(cat, 0) / 1e6 for r in rows],
                    name=cat if cat != "buffers" else "transient buffers (peak)", marker_color=COLORS[cat])
    fig.add_scatter(x=labels, y=[r["formula"]["total"] / 1e6 for r in rows], mode="markers",
                    marker={"symbol": "line-ew-open", "size": 60, "color": "black",
                            "line": {"width": 4, "color": "black"}},
                    name="paper's formula (model states)")
    fig.update_layout(barmode="stack", title=wrap(title, 70), yaxis_title="MB on rank 0", height=460,
                      margin={"t": 90}, legend={"orientation": "h", "y": -0.12})
    return fig


@titled
def stage_traffic(rows: list[dict], title: str = "Bytes each rank sends per step, and step time",
                  note: str | None = None):
    """rows: {label, counted, formula, step_ms, busy_ms}."""
    fig = traffic_vs_formula(rows, "label", "ZeRO stage", title, wrap(note, 110) if note else None)
    fig.update_layout(margin={"t": 115 if note else 80}, legend={"orientation": "h", "y": -0.25}, height=430,
                      title_y=0.97, title_yanchor="top")
    return fig


@titled
def fits_table(rows: list[dict], columns: list[str], title: str) -> go.Figure:
    """A plain table figure: rows of dicts, the given columns."""
    values = [[r[c] for r in rows] for c in columns]
    # each column as wide as its longest entry, so no cell wraps onto a second line, and the figure
    # tall enough for every row (a wrapped cell or a fixed height cut the last rows off in the browser)
    widths = [max(7, *(len(str(v)) for v in [c, *col])) + 2 for c, col in zip(columns, values)]
    fig = go.Figure(go.Table(columnwidth=widths, header={"values": columns, "align": "left", "height": 30},
                             cells={"values": values, "align": "left", "height": 28}))
    fig.update_layout(title=title, height=110 + 30 + 28 * len(rows), margin={"t": 60, "b": 10})
    return fig


@titled
def gradient_peaks(rows: list[dict], whole: int, title: str) -> go.Figure:
    """Stage 2 with buckets: the most bytes of full gradients a rank held at once (bars, the largest
    over ranks), the bound one bucket + one layer (marks) and the whole gradient (line) (chapter 4)."""
    fig = go.Figure()
    labels = [r["label"] for r in rows]
    fig.add_bar(x=labels, y=[r["peak"] / 1e3 for r in rows], name="measured peak of full gradients",
                marker_color=COLORS["comm"])
    fig.add_scatter(x=labels, y=[r["bound"] / 1e3 for r in rows], mode="markers",
                    name="one bucket + one layer",
                    marker={"symbol": "line-ew-open", "size": 28, "line": {"width": 3}, "color": "black"})
    fig.add_hline(y=whole / 1e3, line_dash="dot", annotation_text="the whole gradient")
    fig.update_layout(title=wrap(title), yaxis_title="kB", height=380,
                      legend={"orientation": "h", "y": -0.2})
    return fig


@titled
def measured_vs_inventory(rows: list[dict], title: str) -> go.Figure:
    """rows: {label, measured: [bytes per rank] (the allocator's peak), states, buffers, activations:
    [bytes per rank] (the inventory), formula: bytes (the paper)} — a bar per rank for the measured
    peak, the inventory stacked beside them (rank 0), the formula as a mark (chapter 4)."""
    fig = go.Figure()
    labels = [r["label"] for r in rows]
    for k in range(max(len(r["measured"]) for r in rows)):
        fig.add_bar(x=labels, y=[r["measured"][k] / 1e6 for r in rows], name=f"measured peak, rank {k}",
                    marker_color=COLORS["busy"], opacity=1 - 0.35 * k, offsetgroup=f"rank {k}")
    states = [r["states"][0] / 1e6 for r in rows]
    fig.add_bar(x=labels, y=states, name="inventory: model states (rank 0)", marker_color=COLORS["params"],
                offsetgroup="inventory")
    buffers = [r["buffers"][0] / 1e6 for r in rows]
    fig.add_bar(x=labels, y=buffers, base=states, offsetgroup="inventory",
                name="inventory: transient buffers (peak)", marker_color=COLORS["buffers"])
    fig.add_bar(x=labels, y=[r["activations"][0] / 1e6 for r in rows], offsetgroup="inventory",
                base=[s + b for s, b in zip(states, buffers)], name="inventory: activations",
                marker_color=COLORS["activations"])
    fig.add_scatter(x=labels, y=[r["formula"] / 1e6 for r in rows], mode="markers",
                    marker={"symbol": "line-ew-open", "size": 60, "line": {"width": 4}, "color": "black"},
                    name="paper's formula (model states)")
    fig.update_layout(barmode="group", title=wrap(title, 80), yaxis_title="MB per rank", height=480,
                      margin={"t": 110}, legend={"orientation": "h", "y": -0.12})
    return fig


@titled
def side_by_side(rows: list[dict], title: str) -> go.Figure:
    """rows: {label, measured: [bytes per rank] (the allocator's peak), states: [bytes per rank] (the
    inventory of the model states)} — our ZeRO-3 beside FSDP2's (chapter 4, section 8): a bar per rank
    for the measured peak, one for the inventory of rank 0."""
    fig = go.Figure()
    labels = [r["label"] for r in rows]
    for k in range(max(len(r["measured"]) for r in rows)):
        fig.add_bar(x=labels, y=[r["measured"][k] / 1e6 for r in rows], name=f"measured peak, rank {k}",
                    marker_color=COLORS["busy"], opacity=1 - 0.35 * k)
    fig.add_bar(x=labels, y=[r["states"][0] / 1e6 for r in rows], marker_color=COLORS["params"],
                name="inventory: model states (rank 0)")
    fig.update_layout(barmode="group", title=wrap(title, 80), yaxis_title="MB per rank", height=440,
                      margin={"t": 100}, legend={"orientation": "h", "y": -0.15})
    return fig


PREFETCH_LANES = {"compute": COLORS["compute"], "gather, in the forward": COLORS["comm"],
                  "gather, communication thread": "#FFBF79", "waiting for the gather": COLORS["idle"]}


@titled
def prefetch_timeline(runs: dict[str, list[dict]], title: str, lanes: dict | None = None,
                      x_title: str = "ms since the forward's first gather") -> go.Figure:
    """One forward of ZeRO-3 per run (``label → spans {lane, layer, start, end}``, rank 0): each
    layer's compute, its gather (in the forward, or ahead on the communication thread) and any wait
    for a prefetched gather, one row per lane; the bars carry the layer's number (chapter 4)."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=len(runs), cols=1, subplot_titles=[wrap(k, 90) for k in runs],
                        vertical_spacing=0.22, shared_xaxes=True)
    shown: set[str] = set()  # one legend entry per lane, from the first run that has it
    for row, spans in enumerate(runs.values(), start=1):
        for lane, color in (lanes or PREFETCH_LANES).items():
            mine = [s for s in spans if s["lane"] == lane]
            fig.add_bar(y=[lane] * len(mine), x=[1e3 * (s["end"] - s["start"]) for s in mine],
                        base=[1e3 * s["start"] for s in mine], orientation="h", marker_color=color,
                        text=[str(s["layer"]) for s in mine], textposition="inside", name=lane,
                        legendgroup=lane, showlegend=bool(mine) and lane not in shown, row=row, col=1,
                        hovertemplate="layer %{text}: %{base:.2f} ms + %{x:.2f} ms"
                                      f"<extra>{lane}</extra>")
            if mine:
                shown.add(lane)
        fig.update_yaxes(categoryorder="array", categoryarray=list(lanes or PREFETCH_LANES)[::-1], row=row,
                         col=1)
    fig.update_xaxes(title_text=x_title, row=len(runs), col=1)
    fig.update_layout(title=title, barmode="overlay", height=170 + 190 * len(runs),
                      legend={"orientation": "h", "y": -0.18})
    return fig


GROUP_PARTS = {"param_all_gather": ("all-gather, shard group", COLORS["comm"]),
               "grad_reduce_scatter": ("reduce-scatter, shard group", "#FFBF79"),
               "all_reduce_ring_sent": ("all-reduce, replicate group", COLORS["grads"])}


@titled
def group_traffic(rows: list[dict], title: str) -> go.Figure:
    """Bytes a rank sends per step, stacked by collective and group (``rows``: ``label`` and a value
    per key of :data:`GROUP_PARTS`), beside each row's ``measured`` peak memory per rank (chapter 4)."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=["bytes sent per rank per step (counted)",
                                                        "peak allocated per rank (measured, MB)"])
    labels = [r["label"] for r in rows]
    for key, (name, color) in GROUP_PARTS.items():
        fig.add_bar(x=labels, y=[r[key] / 1e6 for r in rows], name=name, marker_color=color, row=1, col=1)
    fig.add_bar(x=labels, y=[max(r["measured"]) / 1e6 for r in rows], name="measured peak",
                marker_color=COLORS["busy"], row=1, col=2)
    fig.update_yaxes(title_text="MB", row=1, col=1)
    fig.update_layout(barmode="stack", title=wrap(title, 90), height=430, margin={"t": 110},
                      legend={"orientation": "h", "y": -0.2})
    return fig


BACKWARD_LANES = {"all-gather, backward": COLORS["comm"], "backward compute": COLORS["compute"],
                  "reduce-scatter": "#FFBF79"}


@titled
def backward_timeline(runs: dict[str, list[dict]], title: str) -> go.Figure:
    """FSDP2's backward on rank 0 per run (``label → spans {lane, layer, start, end}``): each layer's
    all-gather, its reduce-scatter and the compute between them, one row per lane (chapter 4)."""
    return prefetch_timeline(runs, title, lanes=BACKWARD_LANES,
                             x_title="ms since the backward's first gather")
