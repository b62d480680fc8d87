"""Colours, the CPU-fallback note, and the live training figure shared by every chapter."""

from __future__ import annotations

import math
import time

from plotly.subplots import make_subplots

from ..runtime import cpu_count, share_note
from .layout import (  # noqa: F401  (re-exported: plots import them from here)
    DASHES,
    MODEBAR_PX,
    SUP_LINE_PX,
    TITLE_CHARS,
    TITLE_LINE_PX,
    _values,
    _with_note,
    clear_of_modebar,
    legend_outside,
    level,
    log_axes,
    room_for_labels,
    title_lines,
    titled,
    wrap,
)
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
