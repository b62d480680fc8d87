"""Chapter 6's figures: loss against steps and bytes, counted bytes per compressor and against the
number of ranks, time per step against an EMULATED link's bandwidth with the α-β prediction beside it."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .common import _with_note, legend_outside, log_axes, titled

COMP_COLORS = {"none": "#4C78A8", "fp16": "#72B7B2", "bf16": "#B279A2", "topk": "#F58518",
               "randomk": "#9D755D", "qsgd": "#EECA3B", "sign": "#E45756", "sign-allreduce": "#E45756",
               "powersgd": "#54A24B"}


def _style(label: str) -> dict:
    name = label.split(",")[0].split(" ")[0].lower()
    chunked = "compressed all-reduce" in label or name == "sign-allreduce"  # sign's colour, dashed
    return {"color": COMP_COLORS.get(name), "symbol": "diamond" if chunked else "circle",
            "dash": "dot" if "no error feedback" in label else "dash" if chunked else "solid"}


@titled
def loss_curves(runs: dict, note: str | None = None) -> go.Figure:
    """Training loss per step and against the gradient bytes a rank has sent, one line per run."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1, subplot_titles=(
        "training loss vs step", "training loss vs gradient bytes sent (busiest rank, counted)"))
    for label, r in runs.items():
        style = {k: v for k, v in _style(label).items() if k != "symbol"}
        fig.add_scatter(x=list(range(len(r.losses))), y=r.losses, name=label, line=style, row=1, col=1)
        fig.add_scatter(x=[max(b, 1) for b in r["grad_bytes_cumulative"]], y=r.losses, name=label,
                        showlegend=False, line=style, row=1, col=2)
    fig.update_yaxes(type="log", title_text="loss")
    fig.update_xaxes(title_text="step", row=1, col=1)
    fig.update_xaxes(type="log", title_text="bytes sent (log)", row=1, col=2)
    fig.update_layout(height=440, title=_with_note("Compressed vs uncompressed gradients (dotted: "
                                                   "without error feedback)", note),
                      legend={"orientation": "h", "y": -0.3}, margin={"t": 90})
    return log_axes(fig)  # decades labelled, 2…9 as minor ticks


@titled
def wire_bytes(rows: list[dict]) -> go.Figure:
    """Counted gradient bytes per step and rank for each compressor, against the uncompressed ring."""
    fig = go.Figure()
    labels = [r["label"] for r in rows]
    fig.add_bar(x=labels, y=[r["wire_bytes_per_step"] for r in rows], name="counted on the wire",
                marker_color=[COMP_COLORS.get(r["compressor"]) for r in rows],
                text=[f"{r['compression_ratio']:.1f}×" for r in rows], textposition="outside")
    fig.add_scatter(x=labels, y=[r["uncompressed_bytes_per_step"] for r in rows], mode="lines",
                    name="fp32 ring 2(N−1)/N·4S", line={"color": "black", "dash": "dash"})
    fig.add_scatter(x=labels, y=[r["bf16_ring_bytes_per_step"] for r in rows], mode="lines",
                    name="bf16 ring 2(N−1)/N·2S", line={"color": "grey", "dash": "dash"})
    fig.update_yaxes(type="log", title_text="bytes per step, busiest rank (log)")
    fig.update_layout(height=400, title="Bytes that really crossed per step (label: compression ratio "
                                        "against the fp32 ring)",
                      margin={"t": 60})
    return log_axes(legend_outside(fig))  # decades labelled, 2…9 as minor ticks; legend clear of the bars


@titled
def bytes_vs_ranks(counted: dict, lines: dict, baselines: dict, stars: list,
                   note: str | None = None) -> go.Figure:
    """Counted bytes per step on the busiest rank against the number of ranks N (markers: real runs),
    each compressor's formula from its payload (lines: (N−1)·P all-gathered, 2(N−1)/N·P all-reduced),
    the uncompressed rings (``baselines``: fp32 black, bf16 grey) and where each all-gathered line
    crosses them (``stars``: (label, N, bytes, ring); filled against fp32, open against bf16)."""
    fig = go.Figure()
    for (name, (xs, ys)), color in zip(baselines.items(), ("black", "grey")):
        fig.add_scatter(x=xs, y=ys, mode="lines", name=name, line={"color": color, "dash": "dash"})
    for label, by_n in counted.items():
        color = _style(label)["color"]
        if label != "none":
            fig.add_scatter(x=lines[label][0], y=lines[label][1], mode="lines", showlegend=False,
                            line={"color": color, "width": 1.5, "dash": _style(label)["dash"]},
                            hoverinfo="skip")
        fig.add_scatter(x=list(by_n), y=list(by_n.values()), mode="markers", name=label,
                        marker={"size": 9, "color": color, "symbol": _style(label)["symbol"]})
    for label, n, y, ring in stars:  # named in the legend: text beside stars a few N apart overlapped
        fig.add_scatter(x=[n], y=[y], mode="markers", name=f"{label} stops saving at N = {n} ({ring} ring)",
                        marker={"symbol": "star" if ring == "fp32" else "star-open", "size": 14,
                                "color": _style(label)["color"]})
    fig.update_xaxes(type="log", title_text="ranks N (log; markers measured, lines their formulas)")
    fig.update_yaxes(type="log", title_text="gradient bytes per step, busiest rank (log)")
    fig.update_layout(height=520, margin={"t": 90}, legend={"orientation": "h", "y": -0.25},
                      title=_with_note("Bytes per rank as ranks are added<br><sup>all-gathered: (N−1)·"
                                       "payload; all-reduced: 2(N−1)/N·payload; ★ where an all-gathered "
                                       "one stops saving against the fp32 ring, ☆ the bf16 ring</sup>", note))
    return log_axes(fig)  # decades labelled, 2…9 as minor ticks


@titled
def bandwidth_sweep(panels: dict, latency_us: float, note: str | None = None) -> go.Figure:
    """One panel per number of ranks (``panels``: N → (rows, predicted)): measured time per step
    (filled markers), each rank's busy (CPU) time (open markers: the slowest rank's median) and the
    α-β prediction (lines) against the EMULATED bandwidth."""
    fig = make_subplots(rows=1, cols=len(panels), shared_yaxes=True, horizontal_spacing=0.05,
                        subplot_titles=[f"{n} ranks" for n in panels])
    for col, (rows, predicted) in enumerate(panels.values(), start=1):
        for name, (xs, ys) in predicted.items():
            color, first = COMP_COLORS.get(name), col == 1
            fig.add_scatter(x=xs, y=[1e3 * y for y in ys], mode="lines", name=f"{name}: α-β prediction",
                            line={"color": color, "dash": "dot"}, legendgroup=name + "p", showlegend=first,
                            row=1, col=col)
            mine = sorted((r for r in rows if r["compressor"] == name), key=lambda r: r["gbps"])
            for key, label, symbol in (("step_s", "measured (wall)", "circle"),
                                       ("busy_s", "busy (CPU time)", "circle-open")):
                fig.add_scatter(x=[r["gbps"] for r in mine], y=[1e3 * r[key] for r in mine], mode="markers",
                                name=f"{name}: {label}", legendgroup=name + key, showlegend=first,
                                marker={"size": 10, "color": color, "symbol": symbol}, row=1, col=col)
    fig.update_xaxes(type="log", title_text="EMULATED link bandwidth (Gbit/s, log)")
    fig.update_yaxes(type="log", title_text="time per step, slowest rank (ms, log)", col=1)
    fig.update_layout(height=480, margin={"t": 110}, legend={"orientation": "h", "y": -0.3},
                      title=_with_note(f"Time per step on an emulated link ({latency_us:g} µs per "
                                       "message): when compression pays", note))
    return log_axes(fig)  # decades labelled, 2…9 as minor ticks


@titled
def time_to_target(rows: list[dict], target: float, latency_us: float, world_size: int) -> go.Figure:
    """Steps to reach a loss × the measured time per step, against the EMULATED bandwidth."""
    fig = go.Figure()
    for name in dict.fromkeys(r["compressor"] for r in rows):
        mine = sorted((r for r in rows if r["compressor"] == name and r["time_s"] is not None),
                      key=lambda r: r["gbps"])
        steps = mine[0]["steps"] if mine else "—"
        fig.add_scatter(x=[r["gbps"] for r in mine], y=[r["time_s"] for r in mine], mode="lines+markers",
                        name=f"{name} ({steps} steps)", line={"color": COMP_COLORS.get(name)})
    fig.update_xaxes(type="log", title_text="EMULATED link bandwidth (Gbit/s, log)")
    fig.update_yaxes(type="log", title_text="seconds to reach the loss (log)")
    fig.update_layout(height=420, margin={"t": 80}, legend={"orientation": "h", "y": -0.3},
                      title=f"Time to a training loss of {target:g}: steps it took (section 3) × time per "
                            f"step measured on the emulated link ({latency_us:g} µs, {world_size} ranks)")
    return log_axes(fig)  # decades labelled, 2…9 as minor ticks
