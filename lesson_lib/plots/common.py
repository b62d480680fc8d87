"""Colours, the CPU-fallback note, and the live training figure shared by every chapter."""

from __future__ import annotations

import textwrap
import time

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..runtime import cpu_count

COLORS = {"compute": "#4C78A8", "comm": "#F58518", "busy": "#54A24B", "idle": "#BAB0AC",
          "params": "#4C78A8", "grads": "#72B7B2", "optimizer": "#F58518",
          "activations": "#E45756", "buffers": "#B279A2"}


def oversubscription_note(results) -> str | None:
    worst = max((r for r in results if r.oversubscribed), key=lambda r: r.world_size, default=None)
    if worst is None:
        return None
    return (f"CPU fallback: {worst.world_size} ranks share {cpu_count()} cores, so wall-clock times are "
            "stretched by time-sharing. Busy time (CPU time of each rank) is shown beside them.")


def _annotate(fig, note: str | None) -> None:
    """Put the CPU-fallback note under the figure's title (call after setting the title)."""
    if note:
        fig.update_layout(title=_with_note(fig.layout.title.text or "", note))


# --------------------------------------------------------------------------- live


class LiveRuns:
    """Loss and slowest-rank step time, drawn while the workers train (chapter 0 onwards)."""

    def __init__(self, title: str = "", min_interval_s: float = 0.25):
        import ipywidgets as W

        base = make_subplots(rows=1, cols=2, subplot_titles=(
            "global training loss", "slowest rank's step (ms), from step 1"))
        base.update_layout(title=title, height=340, legend={"orientation": "h", "y": -0.2})
        base.update_xaxes(title_text="step")
        self.fig = go.FigureWidget(base)
        self.progress = W.IntProgress(value=0, min=0, max=1, description="waiting")
        self.widget = W.VBox([self.progress, self.fig])
        self.min_interval_s = min_interval_s
        self._runs: dict[str, dict] = {}

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)

    def track(self, label: str, steps: int, world_size: int, loss_rank: int = 0):
        """Add traces for one run and return the ``on_event`` callback that feeds them.

        ``world_size`` ranks report steps; ``loss_rank`` is the rank whose events carry the
        global loss (a parameter server's first worker, say, rather than the server).
        """
        i = len(self._runs)
        color = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#B279A2", "#72B7B2"][i % 6]
        self.fig.add_scatter(x=[], y=[], name=label, line={"color": color}, row=1, col=1)
        self.fig.add_scatter(x=[], y=[], name=label, showlegend=False, line={"color": color},
                             row=1, col=2)
        # One legend entry explains every dotted line: each run's busy time has its run's colour.
        self.fig.add_scatter(x=[], y=[], name="dotted: busy (CPU time) of the same run",
                             legendgroup="busy", showlegend=i == 0,
                             line={"color": color, "dash": "dot"}, row=1, col=2)
        run = {"loss": {}, "wall": {}, "busy": {}, "traces": (3 * i, 3 * i + 1, 3 * i + 2), "last": 0.0,
               "steps": steps, "world": world_size}
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
            done = len(run["loss"])
            now = time.monotonic()
            if now - run["last"] >= self.min_interval_s or done == steps:
                run["last"] = now
                self._redraw(run)
                self.progress.value = done

        return on_event

    def _redraw(self, run: dict) -> None:
        lt, wt, bt = run["traces"]
        full = sorted(s for s, w in run["wall"].items() if len(w) == run["world"] and s > 0)
        with self.fig.batch_update():
            self.fig.data[lt].x = sorted(run["loss"])
            self.fig.data[lt].y = [run["loss"][s] for s in sorted(run["loss"])]
            self.fig.data[wt].x = full
            self.fig.data[wt].y = [1e3 * max(run["wall"][s].values()) for s in full]
            self.fig.data[bt].x = full  # the busiest rank's CPU time: what the wall clock hides
            self.fig.data[bt].y = [1e3 * max(run["busy"][s].values()) for s in full]


def wrap(text: str, width: int = 80) -> str:
    """Break a long title or note into lines (plotly never wraps, it clips at the figure's edge)."""
    return "<br>".join(textwrap.wrap(text, width))


def _with_note(title: str, note: str | None) -> dict:
    """The oversubscription note as a subtitle, where it cannot collide with the axis titles."""
    lines = textwrap.wrap(note, 110) if note else []
    return {"text": title + "".join(f"<br><sup style='color:#a33'>{line}</sup>" for line in lines)}
