"""Chapter 7's figures: the talk's chart from the cost model, the measured dashboard, and the
model's predicted step times beside the measured ones."""

from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .common import COLORS, _with_note, clear_of_modebar, legend_outside, log_axes, titled, wrap

NO_FIT = "#BAB0AC"
FITS = "#4C78A8"


EMULATED = "/"  # bar pattern of a record measured on an emulated link


def label(record: dict) -> str:
    """The record's label, with the bandwidth of its emulated link (its label says "emulated link")."""
    gbps = record.get("link_gbps")
    return record["label"] + (f" ({gbps:g} Gbit/s)" if gbps else "")


LEGEND_PX = 95  # the talk chart's legend: up to three rows at 700 px
OVERLAP_COLORS = ("#4C78A8", "#9ECAE9")  # fitting bars: nothing hidden, then all that compute covers


def bar_text(r: dict) -> str:
    """A milestone's label under its bars: its name, a parameter server's K and server machines,
    "does not fit", and a compressed run that assumes no extra steps marked as what it is, a bound."""
    plan = r["plan"]
    k = r.get("servers")
    return (r["milestone"] + (f" (K={k:,})<br>+{k:,} servers" if k else "")
            + ("" if r["fits"] else "<br>does not fit")
            + ("<br>bound: no extra steps" if plan.compression != 1 and not plan.extra_steps else ""))


def talk_chart(by_overlap: dict, title: str, assumptions: list[str]) -> go.Figure:
    """Modelled days to train per milestone in the talk's order (one bar per ``overlap``) and memory per
    device; grey "does not fit" bars where the model exceeds the device. Parameter-server bars name K
    and add a hatched bar for each server's memory."""
    overlaps = list(by_overlap)
    rows = by_overlap[overlaps[0]]
    names = [bar_text(r) for r in rows]
    short = [r["milestone"] + (f" (K={r['servers']:,})" if r.get("servers") else "") for r in rows]
    # one line per tick (the bars' grey says "does not fit", the legend says so): the multi-line names,
    # turned sideways, overlapped each other
    ticks = [s + (" (bound)" if "bound:" in n else "") for s, n in zip(short, names)]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.08, column_widths=[0.55, 0.45], subplot_titles=(
        "days to train (modelled)", "memory, GB (modelled)"))  # short: side by side at 700 px
    days = []
    for i, ov in enumerate(overlaps):
        these = by_overlap[ov]
        days += [r["days"] for r in these]
        name = f"overlap {ov:g}" + (" (nothing hidden)" if ov == 0 else " (all compute covers hidden)"
                                    if ov == 1 else f" ({ov:.0%} hidden)")
        fig.add_bar(x=names, y=[r["days"] for r in these], text=[f"{r['days']:.3g} d" for r in these],
                    marker_color=[OVERLAP_COLORS[i % 2] if r["fits"] else NO_FIT for r in these],
                    marker_pattern_shape="" if i == 0 else ".", textposition="outside", textangle=-90,
                    row=1, col=1, name=name, legendgroup=name, showlegend=False,
                    hovertext=[f"overlap {ov:g}, dominant: {r['dominant']}" for r in these])
        fig.add_bar(x=[None], y=[None], marker_color=OVERLAP_COLORS[i % 2], name=name, legendgroup=name,
                    marker_pattern_shape="" if i == 0 else ".", row=1, col=1)  # the legend's swatch
    colors = [FITS if r["fits"] else NO_FIT for r in rows]
    fig.add_bar(x=short, y=[r["memory"]["total"] / 1e9 for r in rows], marker_color=colors,
                name="per device (a worker)", row=1, col=2, textangle=-90, showlegend=False,
                text=[f"{r['memory']['total'] / 1e9:.3g}" for r in rows], textposition="outside")
    fig.add_bar(x=[None], y=[None], marker_color=FITS, name="per device (a worker)", row=1, col=2)  # swatch
    server = [r["memory"].get("server", 0) / 1e9 or None for r in rows]
    if any(server):
        fig.add_bar(x=short, y=server, marker_color=COLORS["optimizer"], marker_pattern_shape="/",
                    name="per server (12Ψ/K)", row=1, col=2, textangle=-90,
                    text=[f"{g:.3g}" if g else "" for g in server], textposition="outside")
    cap = rows[0]["memory"]["device"] / 1e9
    # the device's memory named in the legend: its label on the line sat on the bars' numbers
    fig.add_hline(y=cap, line={"dash": "dash", "color": "#444"}, row=1, col=2)
    fig.add_scatter(x=[None], y=[None], mode="lines", line={"dash": "dash", "color": "#444"},
                    name=f"device memory {cap * 1e9 / 2**30:g} GB (binary: {cap:.1f}e9 bytes)", row=1, col=2)
    if not all(r["fits"] for r in rows):
        fig.add_bar(x=[None], y=[None], marker_color=NO_FIT, name="grey: does not fit in device memory",
                    row=1, col=1)
    # log axes with labels above the bars: plotly's autorange runs away, so give the range
    gb = [r["memory"]["total"] / 1e9 for r in rows] + [g for g in server if g]
    for col, values in ((1, days), (2, gb + [cap])):
        lo, hi = math.log10(min(values)), math.log10(max(values))
        fig.update_yaxes(type="log", range=[lo - 0.3, hi + 1.4], title_text="days" if col == 1 else "GB",
                         row=1, col=col)
    notes = "<br>".join(wrap("• " + a, 120) for a in assumptions)  # 120: within 700 px
    fig.update_xaxes(tickvals=names, ticktext=ticks, tickangle=-60, row=1, col=1)
    fig.update_xaxes(tickangle=-60, row=1, col=2)
    fig.update_layout(height=640 + 15 * notes.count("<br>"), barmode="group",
                      title=title, margin={"b": 200 + 15 * notes.count("<br>")},
                      uniformtext={"minsize": 9, "mode": "show"})
    clear_of_modebar(fig)  # the title under the modebar; the legend in rows of its own below the title
    height, top = fig.layout.height, fig.layout.margin.t
    fig.update_layout(margin={"t": top + LEGEND_PX},
                      legend={"orientation": "h", "x": 0, "xanchor": "left", "yref": "container",
                              "y": 1 - (top - 30) / height, "yanchor": "top"})
    # below the rotated milestone names, whatever the plot's height (a shift in pixels, not paper units)
    fig.add_annotation(text=notes, xref="paper", yref="paper", x=0, y=0, yshift=-185, showarrow=False,
                       align="left", xanchor="left", yanchor="top", font={"size": 10})
    return log_axes(fig)  # decades labelled, 2…9 as minor ticks


@titled
def dashboard(records: list[dict], target: float, note: str | None = None) -> go.Figure:
    """Measured on this machine: time to the target loss, bytes per step of the busiest rank,
    and the peak memory of the rank that holds most, by category."""
    names = [label(r) for r in records]
    hatch = [EMULATED if r.get("link_gbps") else "" for r in records]
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.08, subplot_titles=(  # two lines: one ran
        f"seconds to<br>loss {target:g}", "bytes per step,<br>busiest rank",  # into the next at 700 px
        "memory of the<br>fullest rank, KB"))
    reached = [r["reached_target"] for r in records]
    seconds = [r["time_to_target_s"] if ok else r["time_run_s"] for r, ok in zip(records, reached)]
    fig.add_bar(x=names, y=seconds,
                marker_color=[FITS if ok else NO_FIT for ok in reached], marker_pattern_shape=hatch,
                showlegend=False, row=1, col=1,
                text=[f"{r['steps']} steps" if ok else "not reached" for r, ok in zip(records, reached)],
                textposition="outside")
    fig.add_bar(x=names, y=[r["bytes_per_step_busiest"] for r in records], marker_color=COLORS["comm"],
                marker_pattern_shape=hatch, showlegend=False, row=1, col=2)
    fullest = [max(r["peak_memory_per_rank"], key=lambda m: sum(m.values())) for r in records]
    for cat in ("params", "grads", "optimizer", "activations", "buffers"):
        fig.add_bar(x=names, y=[m[cat] / 1e3 for m in fullest], name=cat, marker_color=COLORS[cat],
                    row=1, col=3)
    if any(hatch):
        note = " ".join(filter(None, [note, "Hatched: an EMULATED link (comm.set_link), not a network."]))
    fig.update_layout(barmode="stack", height=480, title=_with_note(
        "One model, one data set, every milestone — measured here", note), margin={"t": 150})
    fig.update_xaxes(tickangle=-35)
    return legend_outside(fig)  # not below, over the slanted milestone names


@titled
def predicted_vs_measured(records: list[dict], note: str | None = None) -> go.Figure:
    """Median step time measured beside the cost model's prediction from measured α, β, FLOP/s."""
    names = [label(r) for r in records]
    fig = go.Figure()
    fig.add_bar(x=names, y=[1e3 * r["median_step_s"] for r in records], name="measured (median step)")
    fig.add_bar(x=names, y=[1e3 * r["predicted_step_s"] for r in records], name="cost model",
                text=[f"{r['predicted_step_s'] / r['median_step_s'] - 1:+.0%}" for r in records],
                textposition="outside")
    fig.update_layout(barmode="group", height=420, yaxis_title="ms per step", title=_with_note(
        "The cost model, fed α, β and FLOP/s measured here, against the measured steps", note),
                      margin={"t": 90})
    return legend_outside(fig)
