"""Colours, the CPU-fallback note, and the live training figure shared by every chapter."""

from __future__ import annotations

import math
import numbers
import textwrap
import time

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..runtime import cpu_count, share_note
from .live import LiveFigure, swap_in

COLORS = {"compute": "#4C78A8", "comm": "#F58518", "busy": "#54A24B", "idle": "#BAB0AC",
          "params": "#4C78A8", "grads": "#72B7B2", "optimizer": "#F58518",
          "activations": "#E45756", "buffers": "#B279A2"}


def oversubscription_note(results, busy_shown: bool = True) -> str | None:
    """The CPU-fallback note for a figure of ``results``, or None when no run had ranks outnumber cores.

    ``busy_shown``: whether the figure draws busy (CPU) time beside the wall clock.
    """
    worst = max((r for r in results if r.oversubscribed), key=lambda r: r.world_size, default=None)
    if worst is None:
        return None
    note = (f"CPU fallback: {worst.world_size} ranks share {cpu_count()} cores{share_note()}, so wall-clock "
            "times are stretched by time-sharing.")
    return note + (" Busy time (CPU time of each rank) is shown beside them." if busy_shown else "")


def _annotate(fig, note: str | None) -> None:
    """Put the CPU-fallback note under the figure's title (call after setting the title)."""
    if note:
        fig.update_layout(title=_with_note(fig.layout.title.text or "", note))


# --------------------------------------------------------------------------- live


# Vega's tableau10: ten colours told apart also in print, with the first six the course has always used.
RUN_COLORS = ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#B279A2", "#72B7B2", "#EECA3B", "#FF9DA6",
              "#9D755D", "#BAB0AC")


class LiveRuns:
    """Loss and slowest-rank step time, drawn while the workers train (chapter 0 onwards)."""

    def __init__(self, title: str = "", min_interval_s: float = 0.25):
        import ipywidgets as W

        base = make_subplots(rows=1, cols=2, subplot_titles=(
            "global training loss", "slowest rank's step (ms), from step 1"))
        # Full notebook width; the legend sits in its own bottom margin, below the "step" titles.
        base.update_layout(title=title, height=400, autosize=True, margin={"b": 110, "t": 80},
                           legend={"orientation": "h", "yref": "container", "y": 0.01, "yanchor": "bottom",
                                   "x": 0, "xanchor": "left"})
        clear_of_modebar(base)
        base.update_xaxes(title_text="step")
        base.add_annotation(text="", showarrow=False, xref="x domain", yref="y domain", x=1, y=1,
                            xanchor="right", yanchor="top", align="right", name="coincide",
                            font={"size": 11, "color": "#555"}, bgcolor="rgba(255,255,255,0.8)")
        # until the first step arrives (the ranks start, the first batch runs), say so on the empty axes
        base.add_annotation(text=self.WAITING, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5,
                            name="waiting", font={"size": 14, "color": "#777"})
        self.fig = LiveFigure(base)
        self.progress = W.IntProgress(value=0, min=0, max=1, description="waiting",
                                      style={"description_width": "initial"})  # the run's whole label
        self.widget = W.VBox([self.progress, self.fig], layout=W.Layout(width="100%"))
        self.min_interval_s = min_interval_s
        self._runs: dict[str, dict] = {}

    def _ipython_display_(self):
        from IPython.display import display

        from ..runtime.output import reserve

        reserve()  # the banners of clusters the runs start go above the plot, not below it
        display(self.widget)

    def track(self, label: str, steps: int, world_size: int, loss_rank: int = 0):
        """Add traces for one run and return the ``on_event`` callback that feeds them.
        ``loss_rank``: the rank whose events carry the global loss."""
        i = len(self._runs)
        color = RUN_COLORS[i % len(RUN_COLORS)]  # chapter 5 draws 8 runs in one figure: all distinct
        self.fig.add_scatter(x=[], y=[], name=label, line={"color": color}, row=1, col=1)
        self.fig.add_scatter(x=[], y=[], name=label, showlegend=False, line={"color": color},
                             row=1, col=2)
        # One legend entry explains every dotted line: each run's busy time has its run's colour.
        self.fig.add_scatter(x=[], y=[], name="dotted: busy (CPU time) of the same run",
                             legendgroup="busy", showlegend=i == 0,
                             line={"color": color, "dash": "dot"}, row=1, col=2)
        run = {"loss": {}, "wall": {}, "busy": {}, "traces": (3 * i, 3 * i + 1, 3 * i + 2), "last": 0.0,
               "steps": steps, "world": world_size, "final": False}
        self._runs[label] = run
        self.progress.max, self.progress.value, self.progress.description = steps, 0, label

        def on_event(ev: dict) -> None:
            if ev.get("kind") != "step":
                return
            s = ev["step"]
            run["wall"].setdefault(s, {})[ev["rank"]] = ev["wall_s"]
            run["busy"].setdefault(s, {})[ev["rank"]] = ev.get("busy_s", 0.0)
            if ev["rank"] == loss_rank:
                run["loss"][s] = ev["loss"]
            if self._complete(run):  # every rank's last step is in: the one full redraw
                self._final(run)
            elif time.monotonic() - run["last"] >= self.min_interval_s:
                self._draw(run)

        return on_event

    def finish(self, label: str) -> None:
        """Draw ``label``'s run in full as it ended, also one that stopped early."""
        self._final(self._runs[label])

    def _complete(self, run: dict) -> bool:
        last = run["steps"] - 1
        return len(run["loss"]) == run["steps"] and len(run["wall"].get(last, ())) == run["world"]

    def _final(self, run: dict) -> None:
        if not run["final"]:
            run["final"] = True
            self._draw(run)
            self.fig = swap_in(self.widget, self.fig)  # the ended run drawn from the whole figure

    WAITING = "waiting for the first step: the ranks are starting"

    @property
    def waiting(self):
        """The note on the empty axes before the first step is drawn (its text empty after)."""
        return next(a for a in self.fig.layout.annotations if a.name == "waiting")

    def _draw(self, run: dict) -> None:
        if self.waiting.text:
            self.waiting.text = ""
        run["last"] = time.monotonic()
        self._redraw(run)
        self.progress.value = len(run["loss"])

    # Points per curve in a live redraw (every k-th step and the latest); the last redraw sends all.
    LIVE_POINTS = 500

    def _redraw(self, run: dict) -> None:
        lt, wt, bt = run["traces"]
        finished = run["final"]
        full = self._thin(sorted(s for s, w in run["wall"].items() if len(w) == run["world"] and s > 0),
                          finished)
        losses = self._thin(sorted(run["loss"]), finished)
        with self.fig.batch_update():
            self.fig.data[lt].x = losses
            # A diverged run's inf or NaN as a gap: a widget's update is JSON, which has neither
            self.fig.data[lt].y = [v if math.isfinite(v := run["loss"][s]) else None for s in losses]
            self.fig.data[wt].x = full
            self.fig.data[wt].y = [1e3 * max(run["wall"][s].values()) for s in full]
            self.fig.data[bt].x = full  # the busiest rank's CPU time: what the wall clock hides
            self.fig.data[bt].y = [1e3 * max(run["busy"][s].values()) for s in full]
            if finished:
                self._mark_coinciding()

    def _thin(self, steps: list[int], finished: bool) -> list[int]:
        """Every step once the run has finished; before, every k-th and the latest, ≤ LIVE_POINTS + 1."""
        k = -(-len(steps) // self.LIVE_POINTS)
        return steps if finished or k <= 1 else steps[::k] + ([steps[-1]] if (len(steps) - 1) % k else [])

    def coinciding(self) -> list[tuple[list[str], float]]:
        """Finished runs whose loss curves differ nowhere by more than 0.2 % of the axis' span:
        (labels, largest gap)."""
        done = {k: [r["loss"][s] for s in sorted(r["loss"])] for k, r in self._runs.items()
                if len(r["loss"]) == r["steps"]}
        values = [v for ys in done.values() for v in ys]
        if len(done) < 2 or not values:
            return []
        tol = 2e-3 * max(max(values) - min(values), 1e-12)
        groups: list[list] = []  # [labels, largest gap from the group's first run]
        for label, ys in done.items():
            for g in groups:
                first = done[g[0][0]]
                gap = max((abs(a - b) for a, b in zip(ys, first)), default=0.0)
                if len(ys) == len(first) and gap <= tol:
                    g[0].append(label)
                    g[1] = max(g[1], gap)
                    break
            else:
                groups.append([[label], 0.0])
        return [(labels, gap) for labels, gap in groups if len(labels) > 1]

    def _mark_coinciding(self) -> None:
        """Say on the figure which loss curves lie on top of each other, and dash them all visible."""
        groups = self.coinciding()
        lines = []
        for labels, gap in groups:
            scale = max(abs(v) for v in self._runs[labels[0]]["loss"].values())
            if gap <= 1e-5 * max(scale, 1e-12):
                lines.append(f"curves coincide: {', '.join(labels)} <br>are equal to float rounding "
                             f"(largest gap {gap:.1e})")
            else:
                lines.append(f"curves overlap: {', '.join(labels)}<br>differ by at most {gap:.1e}")
            for j, label in enumerate(labels):  # longer dashes underneath, shorter on top
                self.fig.data[self._runs[label]["traces"][0]].line.dash = DASHES[j % len(DASHES)]
        self.note.text = "<br>".join(lines)

    @property
    def note(self):
        """The figure's note on coinciding curves (empty until runs coincide)."""
        return next(a for a in self.fig.layout.annotations if a.name == "coincide")


DASHES = ["solid", "longdash", "dash", "dot", "dashdot", "longdashdot"]


def _values(data) -> list[float]:
    """The positive finite numbers of a trace's x or y (a list, a tuple or a NumPy array; else none)."""
    try:
        items = list(data) if data is not None and not isinstance(data, str) else []
    except TypeError:
        return []
    return [float(v) for v in items if isinstance(v, numbers.Real) and 0 < v < math.inf]


def log_axes(fig: go.Figure) -> go.Figure:
    """Every log axis of ``fig`` labelled at powers of ten only, its 2…9 as unlabelled minor ticks,
    where its data (or its set range) span a decade or more: plotly otherwise writes small "2" and
    "5" labels between the decades, crowding the axis. An axis spanning less keeps plotly's labels
    (they are then its only ones); ticks chosen by hand are kept. Returns ``fig``."""
    for name in [k for k in fig.layout.to_plotly_json() if k[1:5] == "axis" and k[0] in "xy"]:
        ax = fig.layout[name]
        if ax.type != "log" or ax.dtick is not None or ax.tickvals is not None:
            continue
        if ax.range is not None and all(isinstance(r, numbers.Real) for r in ax.range):
            lo, hi = sorted(ax.range)  # set by hand, in decades
        else:
            ref = name[0] + name[5:]  # "xaxis2" → "x2"
            values = [v for t in fig.data if (getattr(t, f"{name[0]}axis", None) or name[0]) == ref
                      for v in _values(getattr(t, name[0], None))]
            if not values:
                continue
            lo, hi = math.log10(min(values)), math.log10(max(values))
        if hi - lo >= 1:
            ax.update(dtick=max(1, math.ceil((hi - lo) / 8)), minor={"ticks": "outside", "ticklen": 3})
    return fig


def legend_outside(fig: go.Figure) -> go.Figure:
    """The legend at the right of the plot area, outside it (plotly widens the margin to fit): never
    over bars or their category labels below the axis. Returns ``fig``."""
    fig.update_layout(legend={"orientation": "v", "x": 1.02, "xanchor": "left", "y": 1, "yanchor": "top"})
    return fig


def wrap(text: str, width: int = 80) -> str:
    """Break a long title or note into lines (plotly never wraps, it clips at the figure's edge)."""
    return "<br>".join(textwrap.wrap(text, width))


# plotly's modebar (the toolbar that appears over the top-right corner when the mouse is on a figure)
# covers the top ~24 px of the figure, from the right edge to ~300 px left of it: at 700–950 px (a
# JupyterLab cell on a laptop) that is most of a long title's first line.
MODEBAR_PX = 28
TITLE_LINE_PX = 22  # a title line (17 px font); a <sup> line (a note) takes SUP_LINE_PX
SUP_LINE_PX = 17
TITLE_CHARS = 80  # a title line at most this long fits 700 px


def title_lines(text: str) -> list[str]:
    """The lines of a title as drawn, long plain lines wrapped at TITLE_CHARS."""
    return [line for part in (text or "").split("<br>")
            for line in ([part] if "<sup" in part else textwrap.wrap(part, TITLE_CHARS) or [""])]


def clear_of_modebar(fig: go.Figure) -> go.Figure:
    """Place ``fig``'s title below plotly's modebar band, with a top margin that holds the title's
    lines (and the subplot titles under it) and no more: the first line's baseline at a fixed
    distance from the top, so every line sits under the band whatever the figure's width.

    Without it plotly centres the title in the top margin (or, pushed by ``automargin``, against
    the figure's top edge), where the modebar covers a long title's right-hand end; ``automargin``
    also left traces drawn where the plot area was before the margin grew. Returns ``fig``."""
    text = fig.layout.title.text
    if not text:
        return fig
    lines = title_lines(text)
    sup = sum("<sup" in line for line in lines)
    h = TITLE_LINE_PX * (len(lines) - sup) + SUP_LINE_PX * sup
    subplot_titles = any(a.yref == "paper" and a.y == 1 and a.yanchor == "bottom"
                         for a in fig.layout.annotations)
    height = fig.layout.height or 450  # plotly's default
    top = MODEBAR_PX + h + (34 if subplot_titles else 14)
    # plotly anchors a multi-line title by its first line: that line's bottom sits MODEBAR_PX + one
    # line from the top, the others below it
    fig.update_layout(title={"text": "<br>".join(lines), "yref": "container", "yanchor": "bottom",
                             "y": 1 - (MODEBAR_PX + TITLE_LINE_PX) / height,
                             "automargin": False, "pad": {"t": 0, "b": 0}},
                      margin={"t": max(fig.layout.margin.t or 0, top)})
    return fig


def titled(build):
    """Decorator: the figure ``build`` returns, its title placed by :func:`clear_of_modebar`."""
    import functools

    @functools.wraps(build)
    def wrapper(*args, **kwargs):
        return clear_of_modebar(build(*args, **kwargs))

    return wrapper


def _with_note(title: str, note: str | None) -> dict:
    """The oversubscription note as a subtitle above the plot area, clear of the axis titles;
    lines are wrapped and the top margin grows to fit (``automargin``)."""
    lines = [line for part in (note or "").split("<br>") for line in textwrap.wrap(part, 110)]
    text = title + "".join(f"<br><sup style='color:#a33'>{line}</sup>" for line in lines)
    if not lines:
        return {"text": text}
    return {"text": text, "automargin": True, "yref": "paper", "y": 1, "yanchor": "bottom",
            "pad": {"b": 35 + 10 * len(lines)}}  # room for the subplot titles below the note


def level(fig, value: float, text: str, axis: str = "y", log: bool = False, row: int | None = None,
          col: int | None = None, **line) -> None:
    """A dotted line at ``value`` (``axis="y"``: horizontal) labelled ``text``, in subplot ``row``,
    ``col`` if given. ``log``: the axis is logarithmic (plotly places annotations at log10 there)."""
    style = {"dash": "dot", "color": "grey", **line}
    where = math.log10(value) if log else value
    x, y = "x", "y"
    if row is not None:  # that subplot's axes: "xaxis2" → "x2"
        sub = fig.get_subplot(row, col)
        x, y = (a.plotly_name.replace("axis", "") for a in (sub.xaxis, sub.yaxis))
    at = {"row": row, "col": col} if row is not None else {}
    if axis == "y":
        fig.add_hline(y=value, line=style, **at)
        fig.add_annotation(x=1, xref=f"{x} domain", y=where, yref=y, text=text, showarrow=False,
                           xanchor="right", yanchor="bottom")
    else:
        fig.add_vline(x=value, line=style, **at)
        fig.add_annotation(x=where, xref=x, y=1, yref=f"{y} domain", text=text, showarrow=False,
                           xanchor="right", yanchor="top")  # text to the left: the axis need not grow
