"""Figures of chapter 3: the live Gantt chart, the bubble, activation memory."""

from __future__ import annotations

import time

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .common import COLORS, _annotate, clear_of_modebar, log_axes, titled, wrap
from .live import LiveFigure, swap_in

# "weight": the weight-gradient half of a split backward (zero-bubble schedules; "backward" is then B)
PIPE_COLORS = {"forward": "#4C78A8", "backward": "#54A24B", "weight": "#B279A2", "send": "#F58518",
               "recv": "#BAB0AC"}
# Bars per stage row: compute in the middle, sends in a thin band above, receives below.
_PIPE_BAND = {"forward": (0.56, -0.28), "backward": (0.56, -0.28), "weight": (0.56, -0.28),
              "send": (0.16, -0.48), "recv": (0.16, 0.32)}
_LIVE_KINDS = ("forward", "backward", "send", "recv")  # the live chart draws GPipe and 1F1B only


def _pipe_t0(events: list[dict]) -> float:
    """Where a timeline starts: its first forward (a stage may have been waiting since before)."""
    return min((e["start"] for e in events if e["kind"] == "forward"), default=0.0)


# one shade per model chunk (interleaved 1F1B): chunk 0 in the kind's colour, later chunks lighter
_CHUNK_SHADES = {"forward": ["#4C78A8", "#9ECAE9", "#2A4A73", "#C6DBEF"],
                 "backward": ["#54A24B", "#A6D96A", "#2F6B2A", "#D9F0A3"]}


def _pipe_times(e: dict, unit: str) -> str:
    if unit != "ms":
        return f"{e['end'] - e['start']:.3g} {unit}"
    return f"{1e3 * (e['end'] - e['start']):.2f} ms wall, {1e3 * e['busy']:.2f} ms busy"


def _pipe_bars(events: list[dict], t0: float, kinds=tuple(PIPE_COLORS), legend: bool = True,
               unit: str = "ms") -> list:
    """One horizontal bar trace per event kind (and model chunk): x = duration, base = start (ms
    since ``t0``, or ``unit``); waits begun before ``t0`` start at ``t0``."""
    scale = 1e3 if unit == "ms" else 1.0
    traces = []
    for kind in kinds:
        ev = [{**e, "start": max(e["start"], t0)} for e in events if e["kind"] == kind and e["end"] > t0]
        width, offset = _PIPE_BAND[kind]
        compute = kind in ("forward", "backward", "weight")
        chunks = sorted({e["chunk"] for e in ev if "chunk" in e}) if compute else []
        for chunk in chunks or [None]:
            mine = [e for e in ev if e.get("chunk") == chunk]
            color = PIPE_COLORS[kind] if chunk is None else _CHUNK_SHADES[kind][chunk % 4]
            where = "" if chunk is None else f" · chunk {chunk}"
            ink = "black" if (chunk or 0) % 2 else "white"  # dark text on the light shades
            traces.append(go.Bar(
                y=[e["rank"] for e in mine], x=[scale * (e["end"] - e["start"]) for e in mine],
                base=[scale * (e["start"] - t0) for e in mine], orientation="h",
                name=kind if chunk is None else f"{kind}, chunk {chunk}", width=width, offset=offset,
                marker_color=color, showlegend=legend, legendgroup=f"{kind}{where}",
                text=[str(e["microbatch"]) for e in mine] if compute else None, textposition="inside",
                insidetextanchor="middle", textfont={"color": ink, "size": 10},
                hovertext=[f"stage {e['rank']}{where} · {kind} of micro-batch {e['microbatch']} · "
                           f"step {e['step']}<br>{_pipe_times(e, unit)}" for e in mine], hoverinfo="text"))
    return traces


def _pipe_axes(fig, stages: int, **where) -> None:
    fig.update_yaxes(tickvals=list(range(stages)), ticktext=[f"stage {k}" for k in range(stages)],
                     range=[stages - 0.4, -0.6], **where)


class LiveGantt:
    """Chapter 3: a pipeline's measured timeline, drawn while the stages train; ``track()`` returns
    the ``on_event`` callback that appends each step's events as bars."""

    def __init__(self, stages: int, title: str = "", min_interval_s: float = 0.25):
        fig = go.Figure(_pipe_bars([], 0.0, _LIVE_KINDS))
        fig.update_layout(title=title, barmode="overlay", height=140 + 55 * stages,
                          xaxis_title="ms since the first forward (wall clock)")
        _pipe_axes(fig, stages)
        clear_of_modebar(fig)
        import ipywidgets as W

        self.fig = LiveFigure(fig)
        self.box = W.VBox([self.fig], layout=W.Layout(width="100%"))  # holds the figure swapped in
        self.min_interval_s = min_interval_s
        self.events: list[dict] = []
        self._last = 0.0

    def _ipython_display_(self):
        from IPython.display import display

        display(self.box)

    def done(self) -> None:
        """Every event is in: draw them all, in a figure whose whole state the browser receives at once."""
        self.redraw()
        self.fig = swap_in(self.box, self.fig)

    def track(self):
        def on_event(ev: dict) -> None:
            if ev.get("kind") != "pp_events":
                return
            self.events += ev["events"]
            now = time.monotonic()
            if now - self._last >= self.min_interval_s:
                self._last = now
                self.redraw()

        return on_event

    def redraw(self) -> None:
        if not self.events:
            return
        t0 = _pipe_t0(self.events)
        with self.fig.batch_update():
            for trace, new in zip(self.fig.data, _pipe_bars(self.events, t0, _LIVE_KINDS)):
                trace.y, trace.x, trace.base = new.y, new.x, new.base
                trace.text, trace.hovertext = new.text, new.hovertext


@titled
def pipeline_gantt(panels: dict, stages: int, title: str, note: str | None = None,
                   unit: str = "ms") -> go.Figure:
    """Timelines of one step stacked: ``panels`` maps a label to its events ``{rank, kind,
    microbatch, start, end[, chunk]}``. Times in seconds, drawn in ms, or as given with another
    ``unit``. Only the bottom panel has an x-axis title (others collided with panel labels).
    """
    fig = make_subplots(rows=len(panels), cols=1, subplot_titles=[wrap(t, 75) for t in panels],
                        vertical_spacing=0.16)
    seen = set()  # a legend entry per kind (and chunk) at its first appearance in any panel
    for row, events in enumerate(panels.values(), start=1):
        for tr in _pipe_bars(events, _pipe_t0(events), unit=unit):
            tr.showlegend = bool(len(tr.x)) and tr.name not in seen
            seen |= {tr.name} if tr.showlegend else set()
            fig.add_trace(tr, row=row, col=1)
        _pipe_axes(fig, stages, row=row, col=1)
        fig.update_xaxes(ticksuffix=" ms" if unit == "ms" else "", row=row, col=1)
    fig.update_xaxes(title_text="ms since the step's first forward" if unit == "ms" else unit,
                     row=len(panels), col=1)
    fig.update_layout(title=title, barmode="overlay", height=130 + (60 + 45 * stages) * len(panels),
                      margin={"t": 105 if note else 80}, legend={"orientation": "h", "y": -0.12},
                      title_y=0.98, title_yanchor="top")
    _annotate(fig, note)
    return fig


@titled
def bubble_vs_microbatches(rows: list[dict], title: str, note: str | None = None) -> go.Figure:
    """rows: {stages, microbatches, wall, busy, formula} — the measured idle share against M."""
    fig = go.Figure()
    palette = ["#4C78A8", "#E45756", "#54A24B", "#B279A2"]
    for i, p in enumerate(sorted({r["stages"] for r in rows})):
        rs = sorted((r for r in rows if r["stages"] == p), key=lambda r: r["microbatches"])
        ms, c = [r["microbatches"] for r in rs], palette[i % 4]
        fig.add_scatter(x=ms, y=[r["formula"] for r in rs], mode="lines", line={"color": c, "dash": "dot"},
                        name=f"P={p}: formula (P−1)/(M+P−1)")
        fig.add_scatter(x=ms, y=[r["busy"] for r in rs], mode="lines+markers", line={"color": c},
                        marker={"size": 9}, name=f"P={p}: measured, replayed from busy time")
        fig.add_scatter(x=ms, y=[r["wall"] for r in rs], mode="markers", marker={"color": c, "size": 10,
                        "symbol": "x"}, name=f"P={p}: measured on the wall clock")
    fig.update_xaxes(type="log", title="micro-batches per step (M)",
                     tickvals=sorted({r["microbatches"] for r in rows}))
    fig.update_yaxes(title="bubble: idle share of each stage's time", tickformat=".0%", rangemode="tozero")
    fig.update_layout(title=title, height=480)
    _annotate(fig, note)
    return log_axes(fig)  # decades labelled, 2…9 as minor ticks


@titled
def bubble_causes(rows: list[dict], title: str, note: str | None = None) -> go.Figure:
    """rows: {label, formula, stages, busy, wall} — one group of bars per run, the bubble
    rebuilt one cause at a time (:func:`lesson_lib.milestones.pipeline.schedules.bubble_breakdown`)."""
    rungs = [("formula", "formula (P−1)/(M+P−1): equal actions, free messages", "#BAB0AC"),
             ("stages", "replayed: each stage's mean forward and backward", "#72B7B2"),
             ("busy", "replayed: each action's busy time", "#4C78A8"),
             ("wall", "measured on the wall clock", "#E45756")]
    fig = go.Figure()
    for key, name, color in rungs:
        fig.add_bar(x=[r["label"] for r in rows], y=[r[key] for r in rows], name=name, marker_color=color,
                    text=[f"{r[key]:.1%}" for r in rows], textposition="outside")
    fig.update_yaxes(title="bubble: idle share of each stage's time", tickformat=".0%", rangemode="tozero")
    fig.update_layout(title=title, barmode="group", height=480, legend={"orientation": "h", "y": -0.15})
    _annotate(fig, note)
    return fig


@titled
def activation_peaks(rows: list[dict], title: str) -> go.Figure:
    """rows: {schedule, microbatches, stage, peak, per_microbatch} — each stage's peak saved
    activations against M, one line per schedule and stage."""
    fig = go.Figure()
    colors = {"gpipe": "#E45756", "1f1b": "#4C78A8", "naive": "#BAB0AC"}
    dashes = ["solid", "dash", "dot", "dashdot"]
    for sched in sorted({r["schedule"] for r in rows}):
        for k in sorted({r["stage"] for r in rows}):
            rs = sorted((r for r in rows if r["schedule"] == sched and r["stage"] == k),
                        key=lambda r: r["microbatches"])
            fig.add_scatter(x=[r["microbatches"] for r in rs], y=[r["peak"] / 1e6 for r in rs],
                            mode="lines+markers", name=f"{sched}, stage {k}",
                            line={"color": colors.get(sched, "#333"), "dash": dashes[k % 4]})
    fig.update_xaxes(title="micro-batches per step (M), same micro-batch size", type="log",
                     tickvals=sorted({r["microbatches"] for r in rows}))
    fig.update_yaxes(title="peak activation memory (MB, saved tensors)")
    fig.update_layout(title=title, height=420)
    return log_axes(fig)  # decades labelled, 2…9 as minor ticks


@titled
def stage_params(rows: list[dict], unsplit_bytes: int, title: str) -> go.Figure:
    """rows: {stage, layers, param_bytes} — measured parameter memory per stage vs the whole model."""
    names = [f"stage {r['stage']}<br>layers {r['layers'][0]}–{r['layers'][1] - 1}" for r in rows]
    fig = go.Figure(go.Bar(x=names, y=[r["param_bytes"] / 1e6 for r in rows], marker_color=COLORS["params"],
                           name="parameters held by the stage (measured)"))
    fig.add_hline(y=unsplit_bytes / 1e6, line_dash="dot", annotation_text="the unsplit model on one device",
                  annotation_position="top left")
    fig.update_layout(title=title, yaxis_title="MB", height=360, yaxis_rangemode="tozero")
    return fig


@titled
def measured_activations(rows: list[dict], title: str) -> go.Figure:
    """rows: {label, stage, measured, inventory} (bytes) — per stage, the allocator's step peak (bar)
    and the saved tensors held at once (mark), one bar group per run."""
    fig = go.Figure()
    colors = ["#E45756", "#4C78A8", "#F2A2A3", "#9ECAE9"]
    labels = list(dict.fromkeys(r["label"] for r in rows))
    for j, label in enumerate(labels):
        rs = sorted((r for r in rows if r["label"] == label), key=lambda r: r["stage"])
        x = [f"stage {r['stage']}" for r in rs]
        fig.add_bar(x=x, y=[r["measured"] / 1e6 for r in rs], name=f"{label}: measured (allocator)",
                    marker_color=colors[j % len(colors)], offsetgroup=label)
        fig.add_scatter(x=x, y=[r["inventory"] / 1e6 for r in rs], mode="markers", offsetgroup=label,
                        marker={"symbol": "line-ew-open", "size": 18, "line": {"width": 3}, "color": "black"},
                        name="inventory (saved tensors)", showlegend=j == 0)
    fig.update_layout(barmode="group", scattermode="group", title=wrap(title, 80), height=460,
                      yaxis_title="MB above the step's start", margin={"t": 100},
                      legend={"orientation": "h", "y": -0.15})
    return fig
