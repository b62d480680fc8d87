"""Every figure of the course is drawn here, from data a milestone returned (or streams).

A milestone returns data; a plot draws data. Live figures are plotly ``FigureWidget`` objects fed
by worker events; under nbval (no browser) the same code runs and simply renders nothing live.
Where ranks outnumber cores, figures say so and show per-rank busy time beside wall time.
"""

from __future__ import annotations

import time

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .runtime import cpu_count

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
    if note:
        fig.add_annotation(text=note, xref="paper", yref="paper", x=0, y=-0.22, showarrow=False,
                           xanchor="left", font={"size": 11, "color": "#a33"})
        fig.update_layout(margin={"b": 90})


# --------------------------------------------------------------------------- live


class LiveRuns:
    """Loss and slowest-rank step time, drawn while the workers train (chapter 0 onwards)."""

    def __init__(self, title: str = "", min_interval_s: float = 0.25):
        import ipywidgets as W

        base = make_subplots(rows=1, cols=2, subplot_titles=(
            "global training loss", "step time of the slowest rank (ms; warm-up step 0 not shown)"))
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
        self.fig.add_scatter(x=[], y=[], name=f"{label}: busy (CPU time)", showlegend=i == 0,
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


# --------------------------------------------------------------------------- static


def model_growth(rows: list[dict]) -> go.Figure:
    """Parameters of landmark models by year, log scale (chapter 0)."""
    fig = go.Figure(go.Scatter(
        x=[int(r["year"]) for r in rows], y=[float(r["parameters"]) for r in rows],
        text=[r["model"] for r in rows], mode="markers+text", textposition="top center",
        hovertext=[r["source"] for r in rows], marker={"size": 10}))
    fig.update_yaxes(type="log", title="parameters")
    fig.update_xaxes(title="year", dtick=1)
    fig.update_layout(title="Model size 2012–2021 (sources in data/model_sizes.csv)", height=420)
    return fig


def time_split(results: dict, title: str = "Where a step's time goes") -> go.Figure:
    """Per run and rank: median compute and communication time per step, with busy time beside."""
    fig = go.Figure()
    xs, compute, comm, busy = [], [], [], []
    for label, r in results.items():
        for rank, (c, m, b) in enumerate(zip(r.median_step("compute_s"), r.median_step("comm_s"),
                                             r.median_step("busy_s"))):
            xs.append(f"{label} · r{rank}")
            compute.append(1e3 * c)
            comm.append(1e3 * m)
            busy.append(1e3 * b)
    fig.add_bar(x=xs, y=compute, name="compute (wall)", marker_color=COLORS["compute"], offsetgroup=0)
    fig.add_bar(x=xs, y=comm, name="communication (wall)", marker_color=COLORS["comm"],
                offsetgroup=0, base=compute)
    fig.add_bar(x=xs, y=busy, name="busy (CPU time)", marker_color=COLORS["busy"], offsetgroup=1)
    fig.update_layout(title=title, yaxis_title="ms per step (median)", height=400, barmode="group")
    _annotate(fig, oversubscription_note(results.values()))
    return fig


def memory_by_category(result, title: str = "Measured memory per rank") -> go.Figure:
    fig = go.Figure()
    ranks = [f"rank {r['rank']}" for r in result.per_rank]
    for cat in ("params", "grads", "optimizer", "activations", "buffers"):
        fig.add_bar(x=ranks, y=[r["memory"][cat] / 1e6 for r in result.per_rank], name=cat,
                    marker_color=COLORS[cat])
    fig.update_layout(barmode="stack", title=title, yaxis_title="MB", height=360)
    return fig


def busy_idle(result, title: str = "Busy and idle time per rank") -> go.Figure:
    """Per rank: total busy (CPU) time and idle time (wall − busy) over the run (idle resources)."""
    ranks = [f"rank {r['rank']}" for r in result.per_rank]
    busy = [r["busy_s"] for r in result.per_rank]
    idle = [max(0.0, r["wall_s"] - r["busy_s"]) for r in result.per_rank]
    fig = go.Figure([go.Bar(x=ranks, y=busy, name="busy", marker_color=COLORS["busy"]),
                     go.Bar(x=ranks, y=idle, name="idle / waiting", marker_color=COLORS["idle"])])
    fig.update_layout(barmode="stack", title=title, yaxis_title="seconds (all steps but the first)",
                      height=360)
    _annotate(fig, oversubscription_note([result]))
    return fig


def step_times(results: dict, title: str = "Step time: a synchronous step waits for the slowest rank"):
    fig = go.Figure()
    for label, r in results.items():
        ts = r.step_times()
        fig.add_scatter(x=list(range(len(ts))), y=[1e3 * t for t in ts], name=label, mode="lines+markers")
    fig.update_layout(title=title, xaxis_title="step", yaxis_title="ms", height=360)
    _annotate(fig, oversubscription_note(results.values()))
    return fig


def comm_vs_size(rows: list[dict], title: str = "Communication grows with the model") -> go.Figure:
    """rows: {params, counted_bytes, formula_bytes, comm_ms, compute_ms, busy_ms} per model size."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("bytes sent per rank per step",
                                                        "time per step (median, ms)"))
    x = [r["params"] for r in rows]
    fig.add_scatter(x=x, y=[r["counted_bytes"] for r in rows], name="counted", mode="markers",
                    marker={"size": 11}, row=1, col=1)
    fig.add_scatter(x=x, y=[r["formula_bytes"] for r in rows], name="2(N−1)/N · S", mode="lines",
                    row=1, col=1)
    for key, name in (("compute_ms", "compute"), ("comm_ms", "communication"), ("busy_ms", "busy")):
        fig.add_scatter(x=x, y=[r[key] for r in rows], name=name, mode="lines+markers",
                        line={"color": COLORS[key[:-3] if key != "comm_ms" else "comm"]}, row=1, col=2)
    fig.update_xaxes(type="log", title="parameters")
    fig.update_yaxes(type="log")
    fig.update_layout(title=title, height=380)
    return fig


def comm_share(rows: list[dict], title: str = "Share of the step spent communicating") -> go.Figure:
    """rows: {label, share} — e.g. one per world size."""
    fig = go.Figure(go.Bar(x=[r["label"] for r in rows], y=[100 * r["share"] for r in rows],
                           marker_color=COLORS["comm"]))
    fig.update_layout(title=title, yaxis_title="% of wall time in communication", height=340)
    return fig


# --------------------------------------------------------------------------- chapter 1


PHASE_COLORS = {"compute": COLORS["compute"], "push": COLORS["comm"], "pull (waiting)": COLORS["idle"]}


def loss_curves(curves: dict, title: str = "Loss against wall time and against updates") -> go.Figure:
    """curves: label → {"time": [...], "updates": [...], "loss": [...]} (chapter 1)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("loss vs wall time (s)", "loss vs server updates"))
    for i, (label, c) in enumerate(curves.items()):
        color = ["#4C78A8", "#F58518", "#54A24B", "#E45756"][i % 4]
        fig.add_scatter(x=c["time"], y=c["loss"], name=label, line={"color": color}, row=1, col=1)
        fig.add_scatter(x=c["updates"], y=c["loss"], name=label, showlegend=False,
                        line={"color": color}, row=1, col=2)
    fig.update_yaxes(title_text="global training loss", row=1, col=1)
    fig.update_layout(title=title, height=360)
    return fig


def timeline(segments: list[dict], title: str, note: str | None = None) -> go.Figure:
    """Per-worker Gantt chart of measured phases: {worker, step, phase, start, end} (chapter 1)."""
    segments = [s for s in segments if s["step"] > 0] or segments  # step 0 is warm-up
    t0 = min(s["start"] for s in segments)
    fig = go.Figure()
    for phase, color in PHASE_COLORS.items():
        seg = [s for s in segments if s["phase"] == phase]
        fig.add_bar(y=[f"worker {s['worker']}" for s in seg], x=[1e3 * (s["end"] - s["start"]) for s in seg],
                    base=[1e3 * (s["start"] - t0) for s in seg], orientation="h", name=phase,
                    marker_color=color, hovertext=[f"step {s['step']}" for s in seg])
    fig.update_layout(title=title, barmode="overlay", xaxis_title="ms since step 1 began (warm-up step 0 "
                      "not shown)", height=220 + 40 * len({s["worker"] for s in segments}),
                      legend={"orientation": "h", "y": 1.12, "x": 0})
    _annotate(fig, note)
    return fig


def staleness_histogram(hist: dict, title: str = "Staleness of the gradients the server applied"):
    xs = sorted(int(k) for k in hist)
    fig = go.Figure(go.Bar(x=xs, y=[hist[str(x)] for x in xs], marker_color=COLORS["comm"]))
    fig.update_layout(title=title, xaxis_title="updates applied since the worker pulled its parameters",
                      yaxis_title="gradients", height=320)
    return fig


def traffic_vs_formula(rows: list[dict], x: str, xlabel: str, title: str, note: str | None = None):
    """rows: {x, counted, formula, step_ms[, busy_ms]} — counted bytes against the formula, and
    step time (with busy time beside it when given)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("bytes per step", "step time (ms, median)"))
    xs = [str(r[x]) for r in rows]
    fig.add_bar(x=xs, y=[r["counted"] for r in rows], name="counted", marker_color=COLORS["comm"],
                row=1, col=1)
    fig.add_scatter(x=xs, y=[r["formula"] for r in rows], name="formula", mode="lines+markers",
                    line={"color": "black", "dash": "dot"}, row=1, col=1)
    fig.add_scatter(x=xs, y=[r["step_ms"] for r in rows], name="step time", mode="lines+markers",
                    row=1, col=2)
    if all("busy_ms" in r for r in rows):
        fig.add_scatter(x=xs, y=[r["busy_ms"] for r in rows], name="busy (CPU time)",
                        mode="lines+markers", line={"color": COLORS["busy"]}, row=1, col=2)
    fig.update_xaxes(title_text=xlabel, type="category")
    fig.update_layout(title=title, height=360)
    _annotate(fig, note)
    return fig


# --------------------------------------------------------------------------- chapter 4


def memory_vs_formula(rows: list[dict], title: str) -> go.Figure:
    """rows: {label, measured: {cat: bytes}, formula: {cat: bytes}} — stacked measured bars per
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
    fig.update_layout(barmode="stack", title=title, yaxis_title="MB on rank 0", height=400)
    return fig


def stage_traffic(rows: list[dict], title: str = "Bytes each rank sends per step, and step time",
                  note: str | None = None):
    """rows: {label, counted, formula, step_ms, busy_ms}."""
    return traffic_vs_formula(rows, "label", "ZeRO stage", title, note)


def fits_table(rows: list[dict], columns: list[str], title: str) -> go.Figure:
    """A plain table figure: rows of dicts, the given columns."""
    fig = go.Figure(go.Table(header={"values": columns, "align": "left"},
                             cells={"values": [[r[c] for r in rows] for c in columns], "align": "left"}))
    fig.update_layout(title=title, height=80 + 28 * len(rows), margin={"t": 40, "b": 10})
    return fig


# --------------------------------------------------------------------------- chapter 2

ALG_COLORS = {"ring": "#4C78A8", "library": "#54A24B", "naive": "#E45756", "halving-doubling": "#B279A2",
              "parameter server": "#E45756"}


def ring_animation(frames: list[dict], title: str = "Ring all-reduce: chunks travel round the ring"):
    """Play ``schedules.ring_states(n)``: each rank holds N chunks (squares labelled with the ranks
    whose values they hold); each step every rank sends one chunk to its right neighbour."""
    import math

    n = len(frames[0]["state"])
    pos = [(math.cos(math.pi / 2 - 2 * math.pi * r / n), math.sin(math.pi / 2 - 2 * math.pi * r / n))
           for r in range(n)]
    w = 1.2 / n  # chunk spacing: a rank's row of chunks is 1.2 wide, the ring's radius 1

    def cx(r, c):
        return pos[r][0] + (c - (n - 1) / 2) * w

    cells = [(r, c) for r in range(n) for c in range(n)]

    def chunks(state):
        return go.Scatter(
            x=[cx(r, c) for r, c in cells], y=[pos[r][1] for r, _ in cells],
            mode="markers+text", text=["".join(map(str, state[r][c])) for r, c in cells],
            marker={"symbol": "square", "size": 32, "color": [len(state[r][c]) for r, c in cells],
                    "cmin": 0, "cmax": n, "colorscale": "Blues", "line": {"width": 1, "color": "#333"}},
            textfont={"size": 9, "color": ["white" if 2 * len(state[r][c]) > n else "#222"
                                           for r, c in cells]},
            hoverinfo="skip", showlegend=False)

    def flight(f, t):  # chunks half-way along their edge (t = 0.5); none drawn when t is None
        mv = f["moves"] if t is not None else []
        xs = [(1 - t) * pos[s][0] + t * pos[d][0] for s, d, c in mv] or [None]
        ys = [(1 - t) * pos[s][1] + t * pos[d][1] for s, d, c in mv] or [None]
        return go.Scatter(x=xs, y=ys, mode="markers+text", text=[f"c{c}" for _, _, c in mv],
                          marker={"symbol": "diamond", "size": 22, "color": "#F58518"},
                          textfont={"color": "white", "size": 9}, showlegend=False, hoverinfo="skip")

    ring_xy = pos + pos[:1]
    base = [go.Scatter(x=[p[0] for p in ring_xy], y=[p[1] for p in ring_xy], mode="lines",
                       line={"color": "#ccc", "width": 12}, hoverinfo="skip", showlegend=False),
            go.Scatter(x=[p[0] for p in pos], y=[p[1] + 0.22 for p in pos], mode="text",
                       text=[f"<b>rank {r}</b>" for r in range(n)], hoverinfo="skip", showlegend=False)]
    names, figs = [], []
    prev = frames[0]
    for f in frames:
        label = "start" if f["step"] < 0 else f"{f['phase']} {f['step'] + 1}/{n - 1}"
        caption = ("each rank holds its own gradient, cut into chunks c0…c%d" % (n - 1) if f["step"] < 0 else
                   ("each rank sends one chunk right; the receiver <b>adds</b> it to its copy"
                    if f["phase"] == "reduce-scatter" else
                    "each rank passes a fully summed chunk right; the receiver <b>copies</b> it"))
        for t, state in ((0.5, prev["state"]), (1.0, f["state"])) if f["step"] >= 0 else ((1.0, f["state"]),):
            names.append(f"{label}{' (sending)' if t < 1 else ''}")
            figs.append(go.Frame(name=names[-1], data=[chunks(state), flight(f, t if t < 1 else None)],
                                 traces=[2, 3], layout={"title": {"text": f"{title}<br><sup>{label}: "
                                                                          f"{caption}</sup>"}}))
        prev = f
    fig = go.Figure(data=[*base, chunks(frames[0]["state"]), flight(frames[0], None)], frames=figs)
    step = {"frame": {"duration": 900, "redraw": True}, "transition": {"duration": 300}}
    fig.update_layout(
        title={"text": f"{title}<br><sup>press ▶; a label lists the ranks whose values a chunk holds</sup>"},
        height=600, plot_bgcolor="white", xaxis={"visible": False, "range": [-1.8, 1.8]},
        yaxis={"visible": False, "range": [-1.3, 1.4], "scaleanchor": "x"},
        updatemenus=[{"type": "buttons", "x": 0, "y": 0, "xanchor": "left", "buttons": [
            {"label": "▶", "method": "animate", "args": [None, {**step, "fromcurrent": True}]},
            {"label": "❚❚", "method": "animate", "args": [[None], {"mode": "immediate"}]}]}],
        sliders=[{"x": 0.12, "len": 0.88, "y": 0, "currentvalue": {"prefix": "step: "},
                  "steps": [{"label": nm, "method": "animate", "args": [[nm], {**step, "mode": "immediate"}]}
                            for nm in names]}])
    return fig


def bytes_per_rank(rows: list[dict], title: str) -> go.Figure:
    """rows: {algorithm, rank, sent, recv} — bytes through each rank's link, per algorithm."""
    fig = go.Figure()
    for alg in dict.fromkeys(r["algorithm"] for r in rows):
        rs = [r for r in rows if r["algorithm"] == alg]
        fig.add_bar(x=[f"rank {r['rank']}" for r in rs], y=[(r["sent"] + r["recv"]) / 1e6 for r in rs],
                    name=alg, marker_color=ALG_COLORS.get(alg))
    fig.update_layout(title=title, yaxis_title="MB sent + received (counted)", barmode="group", height=360)
    return fig


def allreduce_bandwidth(rows: list[dict], models: dict, note: str | None = None,
                        title: str = "All-reduce algorithm bandwidth (S / time), measured in one run"):
    """rows: bench.allreduce rows; models: {world_size: (sizes, predicted algbw GB/s)} drawn dashed."""
    ns = sorted({r["world_size"] for r in rows})
    fig = make_subplots(rows=1, cols=len(ns), subplot_titles=[f"{n} ranks" for n in ns], shared_yaxes=True)
    for i, n in enumerate(ns, start=1):
        for alg in dict.fromkeys(r["algorithm"] for r in rows):
            rs = [r for r in rows if r["world_size"] == n and r["algorithm"] == alg]
            fig.add_scatter(x=[r["size_bytes"] for r in rs], y=[r["algbw_GBps"] for r in rs], name=alg,
                            mode="lines+markers", line={"color": ALG_COLORS.get(alg)}, legendgroup=alg,
                            showlegend=i == 1, row=1, col=i)
        if n in models:
            xs, ys = models[n]
            fig.add_scatter(x=xs, y=ys, name="α-β model of the ring (fit)", mode="lines", legendgroup="model",
                            line={"color": "black", "dash": "dash"}, showlegend=i == 1, row=1, col=i)
    fig.update_xaxes(type="log", title_text="message size S (bytes)")
    fig.update_yaxes(type="log", title_text="GB/s", col=1)
    fig.update_layout(title=_with_note(title, note), height=440)
    return fig


def model_scaling(rows: list[dict], title: str) -> go.Figure:
    """rows: {world_size, algorithm, time_s} predicted by the α-β model."""
    fig = go.Figure()
    for alg in dict.fromkeys(r["algorithm"] for r in rows):
        rs = [r for r in rows if r["algorithm"] == alg]
        fig.add_scatter(x=[r["world_size"] for r in rs], y=[1e3 * r["time_s"] for r in rs], name=alg,
                        mode="lines+markers", line={"color": ALG_COLORS.get(alg)})
    fig.update_xaxes(type="log", title="ranks N")
    fig.update_yaxes(type="log", title="predicted time (ms)")
    fig.update_layout(title=title, height=380)
    return fig


def ring_vs_parameter_server(rows: list[dict], note: str | None = None,
                             title: str = "Data parallel with the ring vs the parameter server"):
    """rows: {label, n, step_ms, bytes} — bytes through the busiest rank per step (counted)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("step time (ms, median of the slowest rank)",
                                                        "MB sent + received per step by the busiest rank"))
    for label in dict.fromkeys(r["label"] for r in rows):
        rs = [r for r in rows if r["label"] == label]
        color = ALG_COLORS["ring" if "ring" in label else "parameter server"]
        fig.add_scatter(x=[r["n"] for r in rs], y=[r["step_ms"] for r in rs], name=label,
                        mode="lines+markers", line={"color": color}, legendgroup=label, row=1, col=1)
        fig.add_scatter(x=[r["n"] for r in rs], y=[r["bytes"] / 1e6 for r in rs], name=label,
                        showlegend=False, mode="lines+markers", line={"color": color}, legendgroup=label,
                        row=1, col=2)
    fig.update_xaxes(title_text="workers N", dtick=1)
    fig.update_layout(title=_with_note(title, note), height=400)
    return fig


def _with_note(title: str, note: str | None) -> dict:
    """The oversubscription note as a subtitle, where it cannot collide with the axis titles."""
    sub = f"<br><sup style='color:#a33'>{note}</sup>" if note else ""
    return {"text": title + sub}


# --------------------------------------------------------------------------- chapter 3

PIPE_COLORS = {"forward": "#4C78A8", "backward": "#54A24B", "send": "#F58518", "recv": "#BAB0AC"}
# Bars per stage row: compute in the middle, sends in a thin band above, receives below.
_PIPE_BAND = {"forward": (0.56, -0.28), "backward": (0.56, -0.28), "send": (0.16, -0.48),
              "recv": (0.16, 0.32)}


def _pipe_t0(events: list[dict]) -> float:
    """Where a timeline starts: its first forward (a stage may have been waiting since before)."""
    return min((e["start"] for e in events if e["kind"] == "forward"), default=0.0)


def _pipe_bars(events: list[dict], t0: float, kinds=tuple(PIPE_COLORS), legend: bool = True) -> list:
    """One horizontal bar trace per event kind: x = duration, base = start (ms since ``t0``);
    waits that began before ``t0`` are drawn from ``t0``."""
    traces = []
    for kind in kinds:
        ev = [{**e, "start": max(e["start"], t0)} for e in events if e["kind"] == kind and e["end"] > t0]
        width, offset = _PIPE_BAND[kind]
        compute = kind in ("forward", "backward")
        traces.append(go.Bar(
            y=[e["rank"] for e in ev], x=[1e3 * (e["end"] - e["start"]) for e in ev],
            base=[1e3 * (e["start"] - t0) for e in ev], orientation="h", name=kind, width=width,
            offset=offset, marker_color=PIPE_COLORS[kind], showlegend=legend, legendgroup=kind,
            text=[str(e["microbatch"]) for e in ev] if compute else None, textposition="inside",
            insidetextanchor="middle", textfont={"color": "white", "size": 10},
            hovertext=[f"stage {e['rank']} · {kind} of micro-batch {e['microbatch']} · step {e['step']}<br>"
                       f"{1e3 * (e['end'] - e['start']):.2f} ms wall, {1e3 * e['busy']:.2f} ms busy"
                       for e in ev], hoverinfo="text"))
    return traces


def _pipe_axes(fig, stages: int, **where) -> None:
    fig.update_yaxes(tickvals=list(range(stages)), ticktext=[f"stage {k}" for k in range(stages)],
                     range=[stages - 0.4, -0.6], **where)


class LiveGantt:
    """Chapter 3: a pipeline's measured timeline, drawn while the stages train.

    Each stage reports its forward / backward / send / recv events at the end of every step;
    ``track()`` returns the ``on_event`` callback that appends them as bars.
    """

    def __init__(self, stages: int, title: str = "", min_interval_s: float = 0.25):
        fig = go.Figure(_pipe_bars([], 0.0))
        fig.update_layout(title=title, barmode="overlay", height=140 + 55 * stages,
                          xaxis_title="ms since the first forward (wall clock)")
        _pipe_axes(fig, stages)
        self.fig = go.FigureWidget(fig)
        self.min_interval_s = min_interval_s
        self.events: list[dict] = []
        self._last = 0.0

    def _ipython_display_(self):
        from IPython.display import display

        display(self.fig)

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
            for trace, new in zip(self.fig.data, _pipe_bars(self.events, t0)):
                trace.y, trace.x, trace.base = new.y, new.x, new.base
                trace.text, trace.hovertext = new.text, new.hovertext


def pipeline_gantt(panels: dict, stages: int, title: str, note: str | None = None) -> go.Figure:
    """Timelines of one step stacked: ``panels`` maps a label (say what the times are: measured
    wall clock, or replayed from busy time) to its events ``{rank, kind, microbatch, start, end}``."""
    fig = make_subplots(rows=len(panels), cols=1, subplot_titles=list(panels), vertical_spacing=0.16)
    for row, events in enumerate(panels.values(), start=1):
        for tr in _pipe_bars(events, _pipe_t0(events), legend=row == 1):
            fig.add_trace(tr, row=row, col=1)
        _pipe_axes(fig, stages, row=row, col=1)
        fig.update_xaxes(title_text="ms since the step's first forward", row=row, col=1)
    fig.update_layout(title=title, barmode="overlay", height=110 + (60 + 45 * stages) * len(panels))
    _annotate(fig, note)
    return fig


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
    return fig


def activation_peaks(rows: list[dict], title: str) -> go.Figure:
    """rows: {schedule, microbatches, stage, peak, per_microbatch} — measured peak activation
    memory per stage against M, one line per schedule and stage (chapter 3)."""
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
    fig.update_yaxes(title="peak activation memory (MB, measured)")
    fig.update_layout(title=title, height=420)
    return fig


def stage_params(rows: list[dict], unsplit_bytes: int, title: str) -> go.Figure:
    """rows: {stage, layers, param_bytes} — measured parameter memory per stage vs the whole model."""
    names = [f"stage {r['stage']}<br>layers {r['layers'][0]}–{r['layers'][1] - 1}" for r in rows]
    fig = go.Figure(go.Bar(x=names, y=[r["param_bytes"] / 1e6 for r in rows], marker_color=COLORS["params"],
                           name="parameters held by the stage (measured)"))
    fig.add_hline(y=unsplit_bytes / 1e6, line_dash="dot", annotation_text="the unsplit model on one device",
                  annotation_position="top left")
    fig.update_layout(title=title, yaxis_title="MB", height=360, yaxis_rangemode="tozero")
    return fig
