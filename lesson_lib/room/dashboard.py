"""The instructor's dashboard: who joined, who is computing, who waits for whom, each hop's time and
bytes, and the room's verdicts, redrawn while a round runs; one button per round.

Big type, few colours: it is meant to be read from the back of a room on a projector. It draws
what the room recorded (``Room.rounds``); it computes nothing of its own.
"""

from __future__ import annotations

import html
import math
import time

import ipywidgets as widgets
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..plots.layout import clear_of_modebar
from ..plots.live import LiveFigure
from .instructor import Room, Round

COLOURS = {"ready": "#9e9e9e", "starting": "#9e9e9e", "healing": "#8e24aa", "computing": "#1e88e5",
           "sending weights": "#1e88e5", "waiting": "#fb8c00", "done": "#43a047", "failed": "#e53935",
           "left": "#000000", "gone": "#000000", "in a round": "#9e9e9e"}
CHOICES = {"the ring": ("ring", {}), "parameter server, sync": ("server", {"mode": "sync"}),
           "parameter server, async": ("server", {"mode": "async"}),
           "steps (stragglers, failures)": ("steps", {})}
REDRAW_S = 0.25  # at most four redraws a second while a round runs


class Dashboard:
    """``Dashboard(room)`` shows itself as a widget; it listens to every round the room runs."""

    def __init__(self, room: Room):
        self.room, self._drawn = room, 0.0
        self.fig = LiveFigure(make_subplots(
            rows=1, cols=2, column_widths=[0.45, 0.55], horizontal_spacing=0.12,
            subplot_titles=("the room, live", "the last round")))
        self.fig.add_scatter(x=[], y=[], mode="markers+text", textposition="bottom center",
                             name="learners", marker={"size": 34, "line": {"width": 2, "color": "#333"}},
                             textfont={"size": 16}, hoverinfo="text", row=1, col=1)
        self.fig.update_xaxes(visible=False, range=[-1.7, 1.7], row=1, col=1)
        self.fig.update_yaxes(visible=False, range=[-1.8, 1.5], row=1, col=1)
        # the cell's width, not a fixed one: a projector or a 950 px laptop cell shows it whole
        self.fig.update_layout(height=520, autosize=True, font={"size": 16}, showlegend=True,
                               title={"text": f"room {room.name!r}: nobody has joined yet"},
                               margin={"l": 40, "r": 40, "t": 90, "b": 60},
                               legend={"orientation": "h", "y": -0.15})
        self.choice = widgets.Dropdown(options=list(CHOICES), value="the ring", description="activity")
        self.button = widgets.Button(description="Start a round", button_style="primary",
                                     layout=widgets.Layout(width="220px", height="48px"))
        self.verdicts = widgets.HTML(self._verdicts_html())
        self.button.on_click(self._clicked)
        self.widget = widgets.VBox([self.verdicts, self.button, widgets.HBox([self.choice]), self.fig])
        room.listeners.append(self.update)
        self.update(room, room.rounds[-1] if room.rounds else None, force=True)

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)

    def _clicked(self, _button) -> None:
        activity, opts = CHOICES[self.choice.value]
        self.button.disabled = True
        try:
            self.room.run(activity, **opts)
        except Exception as error:  # a closed room or too few learners: said, never raised into the page
            self.verdicts.value = self._verdicts_html(f"{type(error).__name__}: {error}")
        finally:
            self.button.disabled = False

    # --- drawing ---------------------------------------------------------------------------------
    def update(self, room: Room, rnd: Round | None, force: bool = False) -> None:
        if not force and rnd is not None and rnd.running and time.monotonic() - self._drawn < REDRAW_S:
            return
        self._drawn = time.monotonic()
        who = room.learners()
        names = rnd.names if rnd is not None else list(who)
        states = {}
        for m in who:
            s = (rnd.statuses.get(m) if rnd is not None and m in rnd.names else None) or {"state": who[m]}
            states[m] = s
        if rnd is not None and "instructor" in rnd.names:
            states["instructor"] = rnd.statuses.get("instructor") or {"state": "starting"}
        order = [m for m in names if m in states] + [m for m in states if m not in names]
        xs, ys, labels, colours, hovers = [], [], [], [], []
        ring_members = [m for m in order if m != "instructor"]
        for m in order:
            if m == "instructor":
                x, y = 0.0, 0.0
            else:
                a = math.pi / 2 - 2 * math.pi * ring_members.index(m) / max(1, len(ring_members))
                x, y = math.cos(a), math.sin(a)
            s = states[m]
            waits = s.get("for")
            if waits == "the room":  # an all-reduce waits for whoever is still computing
                busy = [k for k, v in states.items() if v.get("state") == "computing"]
                waits = ", ".join(busy) or waits
            label = s["state"] + (f" for {waits}" if waits else "")
            xs.append(x)
            ys.append(y)
            colours.append(COLOURS.get(s["state"], "#9e9e9e"))
            labels.append(f"<b>{html.escape(m)}</b><br>{html.escape(label)}")
            hovers.append(f"{m}: {label}" + (f", step {s['step']}" if s.get("step") is not None else ""))
        title = [f"room {room.name!r}: {len(who)} joined"]
        if rnd is not None:
            title.append(f"round {rnd.n}, {rnd.activity}, " + ("running" if rnd.running else
                                                             ("right" if rnd.ok else "wrong or discarded")))
        # a line each once together they pass 60 characters: one line of the title's 22 px font in a
        # 1000 px cell (the figure now takes the cell's width, so narrower cells wrap sooner)
        title = ("; " if len("; ".join(title)) <= 60 else "<br>").join(title)
        with self.fig.batch_update():
            t = self.fig.data[0]
            t.x, t.y, t.text, t.hovertext, t.marker.color = xs, ys, labels, hovers, colours
            # under plotly's modebar (placed on a copy: inside batch_update the widget's layout still
            # reads as before the batch)
            placed = clear_of_modebar(go.Figure(layout=self.fig.layout).update_layout(
                title_text=title, margin_t=90)).layout
            self.fig.update_layout(title=placed.title, margin_t=placed.margin.t)
            arrows = []
            if rnd is not None and rnd.activity == "ring" and not rnd.running and rnd.summary:
                arrows = self._ring_arrows(rnd, dict(zip(order, zip(xs, ys))))
            # in one assignment: inside batch_update each add_annotation would start again from the
            # annotations before the batch, and only the last arrow would stay
            self.fig.layout.annotations = [a for a in self.fig.layout.annotations if a.text in
                                           ("the room, live", "the last round")] + arrows
            self._draw_round(rnd)
        self.verdicts.value = self._verdicts_html()

    def _ring_arrows(self, rnd: Round, where: dict) -> list[dict]:
        wrong = (rnd.summary.get("wrong") or {}).get("learner")
        arrows = []
        for m in rnd.members:
            mine = [h for h in rnd.summary["hops"] if h["learner"] == m]
            if not mine:
                continue
            (x0, y0), (x1, y1) = where[m], where[mine[0]["to_learner"]]
            tail = 0.2  # the arrow from a fifth of the way, its label there
            if len(rnd.members) == 2:  # two learners send to each other: each arrow to the right of
                length = math.hypot(x1 - x0, y1 - y0) or 1.0  # its way, or the two lie on one line,
                dx, dy = 0.15 * (y1 - y0) / length, -0.15 * (x1 - x0) / length
                x0, y0, x1, y1 = x0 + dx, y0 + dy, x1 + dx, y1 + dy
                tail = 0.35  # and its label clear of the sender's name
            ms = sum(h["seconds"] for h in mine) / len(mine) * 1e3
            arrows.append({"x": 0.8 * x1 + 0.2 * x0, "y": 0.8 * y1 + 0.2 * y0,
                           "ax": (1 - tail) * x0 + tail * x1, "ay": (1 - tail) * y0 + tail * y1,
                           "xref": "x", "yref": "y", "axref": "x", "ayref": "y",
                           "showarrow": True, "arrowhead": 3, "arrowwidth": 3, "text": f"{ms:.1f} ms",
                           "font": {"size": 14}, "arrowcolor": "#e53935" if m == wrong else "#555"})
        return arrows

    def _draw_round(self, rnd: Round | None) -> None:
        keep = self.fig.data[:1]
        bars = []
        axis_x, axis_y, heading = "", "", "the last round"
        if rnd is not None and rnd.activity == "ring" and rnd.summary:
            for h in rnd.summary["hops"]:
                bars.append((f"step {h['s']}", h["learner"], h["seconds"] * 1e3,
                             f"{h['learner']} → {h['to_learner']}: {h['bytes']} bytes"))
            axis_x, axis_y, heading = "sender", "hop time (ms)", "each hop's time"
        elif rnd is not None and rnd.activity == "steps" and rnd.summary:
            for row in rnd.summary["rows"]:
                for m, c in row["compute_s"].items():
                    bars.append((m, f"step {row['step']}", c * 1e3, f"{m} computed {c * 1e3:.1f} ms"))
            axis_x, axis_y, heading = "step", "compute time (ms)", "each member's compute, each step"
        elif rnd is not None and rnd.activity == "server" and rnd.summary:
            bars = [("server", f"{i}", s * 1e3, f"step {i}") for i, s in enumerate(rnd.summary["step_s"])]
            axis_x, axis_y, heading = "step", "server's step time (ms)", "the server's steps"
        traces = []
        for series in dict.fromkeys(b[0] for b in bars):
            pts = [b for b in bars if b[0] == series]
            traces.append(go.Bar(x=[p[1] for p in pts], y=[p[2] for p in pts], name=series,
                                 hovertext=[p[3] for p in pts], xaxis="x2", yaxis="y2"))
        if not traces:  # nothing yet: who joined, as one bar each
            who = self.room.learners()
            traces = [go.Bar(x=list(who) or ["nobody yet"], y=[1] * max(1, len(who)), name="joined",
                             xaxis="x2", yaxis="y2")]
            axis_x, axis_y, heading = "learner", "joined", "who joined"
        self.fig.data = keep
        for t in traces:
            self.fig.add_trace(t)
        self.fig.layout.xaxis2.title.text = axis_x
        self.fig.layout.xaxis2.type = "category"
        self.fig.layout.yaxis2.title.text = f"{axis_y}<br><sub>{heading}</sub>"

    def _verdicts_html(self, extra: str = "") -> str:
        lines = [f"<div style='font-size:20px;color:{'#2e7d32' if r.ok else '#c62828'}'>"
                 f"{html.escape(r.verdict)}</div>" for r in self.room.rounds[-4:] if r.verdict]
        for r in self.room.rounds[-1:]:
            lines += [f"<div style='font-size:18px'>{html.escape(e)}</div>" for e in r.events]
        if extra:
            lines.append(f"<div style='font-size:20px;color:#c62828'>{html.escape(extra)}</div>")
        none = "<div style='font-size:20px'>no round yet: press the button</div>"
        return "<div>" + ("".join(lines) or none) + "</div>"


def dashboard(room: Room) -> Dashboard:
    return Dashboard(room)
