"""Figures of chapter 2: the ring animation, bytes per rank, bandwidth, training with the ring
(the α-β model at cluster scale is :mod:`.alpha_beta`)."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .common import _with_note, log_axes, titled

ALG_COLORS = {"ring": "#4C78A8", "pipelined-ring": "#72B7B2", "library": "#54A24B", "naive": "#E45756",
              "halving-doubling": "#B279A2", "parameter server": "#E45756", "tree": "#F58518"}


@titled
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
    return _animated(fig, names, f"{title}<br><sup>press ▶; a label lists the ranks whose values a chunk "
                                 "holds</sup>", height=600, y_range=(-1.3, 1.4), prefix="step: ")


def _animated(fig: go.Figure, names: list[str], title: str, height: int, y_range, prefix: str) -> go.Figure:
    """The ring drawings' shared frame: a ▶ / ❚❚ pair and a slider over the frames ``names``."""
    step = {"frame": {"duration": 900, "redraw": True}, "transition": {"duration": 300}}
    fig.update_layout(
        title={"text": title}, height=height, plot_bgcolor="white",
        xaxis={"visible": False, "range": [-1.8, 1.8]},
        yaxis={"visible": False, "range": list(y_range), "scaleanchor": "x"},
        updatemenus=[{"type": "buttons", "x": 0, "y": 0, "xanchor": "left", "buttons": [
            {"label": "▶", "method": "animate", "args": [None, {**step, "fromcurrent": True}]},
            {"label": "❚❚", "method": "animate", "args": [[None], {"mode": "immediate"}]}]}],
        sliders=[{"x": 0.12, "len": 0.88, "y": 0, "currentvalue": {"prefix": prefix},
                  "steps": [{"label": nm, "method": "animate", "args": [[nm], {**step, "mode": "immediate"}]}
                            for nm in names]}])
    return fig


@titled
def pipelined_ring_animation(frames: list[dict], title: str = "Pipelined ring: each chunk in segments"):
    """Play ``schedules.pipelined_ring_slots(n, k)``: each rank holds N chunks (columns) of k segments
    (rows), labelled with the ranks whose values they hold; one frame per slot of the pipeline."""
    import math

    n, k = len(frames[0]["state"]), len(frames[0]["state"][0][0])
    pos = [(math.cos(math.pi / 2 - 2 * math.pi * r / n), math.sin(math.pi / 2 - 2 * math.pi * r / n))
           for r in range(n)]
    w, h = 1.2 / n, 0.3 / max(k, 2)  # a rank's grid is 1.2 wide and about 0.3 tall

    def xy(r, c, s):
        return pos[r][0] + (c - (n - 1) / 2) * w, pos[r][1] + ((k - 1) / 2 - s) * h

    cells = [(r, c, s) for r in range(n) for c in range(n) for s in range(k)]

    def segs(state):
        held = [len(state[r][c][s]) for r, c, s in cells]
        return go.Scatter(
            x=[xy(*x)[0] for x in cells], y=[xy(*x)[1] for x in cells], mode="markers+text",
            text=["".join(map(str, state[r][c][s])) for r, c, s in cells],
            marker={"symbol": "square", "size": 26, "color": held, "cmin": 0, "cmax": n,
                    "colorscale": "Blues", "line": {"width": 1, "color": "#333"}},
            textfont={"size": 8, "color": ["white" if 2 * m > n else "#222" for m in held]},
            hoverinfo="skip", showlegend=False)

    def flight(f):  # segments on the wire this slot, drawn part-way along their edge
        mv, t = f["moves"], 0.5
        return go.Scatter(x=[(1 - t) * pos[a][0] + t * pos[b][0] for a, b, _, _ in mv] or [None],
                          y=[(1 - t) * pos[a][1] + t * pos[b][1] for a, b, _, _ in mv] or [None],
                          mode="markers+text", text=[f"c{c}.{s}" for _, _, c, s in mv],
                          marker={"symbol": "diamond", "size": 26, "color": "#F58518"},
                          textfont={"color": "white", "size": 8}, showlegend=False, hoverinfo="skip")

    def adding(f):  # segments being added this slot: outlined, while the next one crosses
        at = [xy(*a) for a in f["adding"]]
        return go.Scatter(x=[p[0] for p in at] or [None], y=[p[1] for p in at] or [None],
                          mode="markers", marker={"symbol": "square-open", "size": 30, "color": "#F58518",
                                                  "line": {"width": 3}}, showlegend=False, hoverinfo="skip")

    ring_xy = pos + pos[:1]
    base = [go.Scatter(x=[p[0] for p in ring_xy], y=[p[1] for p in ring_xy], mode="lines",
                       line={"color": "#ccc", "width": 12}, hoverinfo="skip", showlegend=False),
            go.Scatter(x=[p[0] for p in pos], y=[p[1] + 0.1 + k * h / 2 for p in pos], mode="text",
                       text=[f"<b>rank {r}</b>" for r in range(n)], hoverinfo="skip", showlegend=False)]
    names, figs = [], []
    for f in frames:
        if f["slot"] < 0:
            label, caption = "start", (f"each rank's gradient: {n} chunks (columns) of {k} segments (rows); "
                                       "a diamond cX.Y on the wire is chunk X, segment Y")
        else:
            label = f"slot {f['slot'] + 1}: {f['phase']} {f['step'] + 1}/{n - 1}"
            wire = sorted({s for *_, s in f["moves"]})
            added = sorted({s for *_, s in f["adding"]})
            same = wire and added and added[0] < wire[0]  # else it landed in the previous step
            caption = "; ".join(
                ([f"segment {wire[0]} of a chunk on each link"] if wire else [])
                + ([f"segment {added[0]}{'' if same else ' of the previous step'} <b>added</b> "
                    + ("meanwhile" if wire else "(the last add: nothing left to hide it)")] if added else [])
                + (["all-gather segments land in place (a copy, nothing to add)"]
                   if f["phase"] == "all-gather" else []))
        names.append(label)
        figs.append(go.Frame(name=label, data=[segs(f["state"]), flight(f), adding(f)], traces=[2, 3, 4],
                             layout={"title": {"text": f"{title}<br><sup>{label}: {caption}</sup>"}}))
    first = frames[0]
    fig = go.Figure(data=[*base, segs(first["state"]), flight(first), adding(first)], frames=figs)
    return _animated(fig, names, f"{title}<br><sup>press ▶; orange diamonds: segments on the wire; orange "
                                 "outline: a segment being added while the next one crosses</sup>",
                     height=620, y_range=(-1.4, 1.5), prefix="")


@titled
def bytes_per_rank(rows: list[dict], title: str) -> go.Figure:
    """rows: {algorithm, rank, sent, recv[, kind]} — bytes through each rank's link, per algorithm.

    ``kind``: "counted" (the default: our own collectives count their bytes) or "modelled" (the
    library's collective reports none, so its bytes are the formula's); the y axis says which."""
    kind = "modelled" if any(r.get("kind") == "modelled" for r in rows) else "counted"
    fig = go.Figure()
    for alg in dict.fromkeys(r["algorithm"] for r in rows):
        rs = [r for r in rows if r["algorithm"] == alg]
        fig.add_bar(x=[f"rank {r['rank']}" for r in rs], y=[(r["sent"] + r["recv"]) / 1e6 for r in rs],
                    name=alg, marker_color=ALG_COLORS.get(alg.split(" (")[0]))
    fig.update_layout(title=title, yaxis_title=f"MB sent + received ({kind})", barmode="group", height=360)
    return fig


@titled
def allreduce_bandwidth(rows: list[dict], models: dict, note: str | None = None,
                        title: str = "All-reduce algorithm bandwidth (S / time), measured in one run"):
    """rows: ring_allreduce.bandwidth rows; models: {world_size: {algorithm: (sizes, predicted algbw GB/s)}},
    each drawn dashed."""
    ns = sorted({r["world_size"] for r in rows})
    fig = make_subplots(rows=1, cols=len(ns), subplot_titles=[f"{n} ranks" for n in ns], shared_yaxes=True)
    for i, n in enumerate(ns, start=1):
        for alg in dict.fromkeys(r["algorithm"] for r in rows):
            rs = [r for r in rows if r["world_size"] == n and r["algorithm"] == alg]
            fig.add_scatter(x=[r["size_bytes"] for r in rs], y=[r["algbw_GBps"] for r in rs], name=alg,
                            mode="lines+markers", line={"color": ALG_COLORS.get(alg)}, legendgroup=alg,
                            showlegend=i == 1, row=1, col=i)
        for alg, (xs, ys) in models.get(n, {}).items():
            fig.add_scatter(x=xs, y=ys, name=f"α-β fit of the {alg}", mode="lines", legendgroup=f"fit {alg}",
                            line={"color": "black" if alg == "ring" else ALG_COLORS.get(alg), "dash": "dash"},
                            showlegend=i == 1, row=1, col=i)
    fig.update_xaxes(type="log", title_text="message size S (bytes)")
    fig.update_yaxes(type="log", showticklabels=True)  # every panel log scale, each with its labels
    fig.update_yaxes(title_text="GB/s", col=1)
    fig.update_layout(title=_with_note(title, note), height=440)
    return log_axes(fig)  # decades labelled, 2…9 as minor ticks


@titled
def segments_plot(rows: list[dict], refs: dict, fit: tuple[float, float], title: str) -> go.Figure:
    """rows: {segments, segment_bytes, time_s}; refs: {name: seconds} drawn flat; fit: (base, slope)."""
    fig = go.Figure()
    ks = [r["segments"] for r in rows]
    fig.add_scatter(x=ks, y=[1e3 * r["time_s"] for r in rows], mode="lines+markers", name="pipelined ring",
                    text=[f"{r['segment_bytes'] / 1024:g} KiB segments" for r in rows],
                    line={"color": ALG_COLORS["pipelined-ring"]})
    base, slope = fit
    fig.add_scatter(x=ks, y=[1e3 * (base + slope * k) for k in ks], mode="lines", name="least-squares line",
                    line={"color": "black", "dash": "dash"})
    for name, t in refs.items():
        fig.add_scatter(x=[min(ks), max(ks)], y=[1e3 * t] * 2, mode="lines", name=name,
                        line={"color": ALG_COLORS.get(name), "dash": "dot"})
    fig.update_xaxes(type="log", title="segments per chunk (1 = the plain ring's single message)")
    fig.update_yaxes(title="ms per all-reduce (median, slowest rank)")
    fig.update_layout(title=title, height=400)
    return log_axes(fig)  # decades labelled, 2…9 as minor ticks


@titled
def ring_vs_parameter_server(rows: list[dict], note: str | None = None,
                             title: str = "Data parallel with the ring vs the parameter server"):
    """rows: {label, n, step_ms, bytes} — bytes through the busiest rank per step (counted)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("step time", "traffic of the busiest rank"))
    for label in dict.fromkeys(r["label"] for r in rows):
        rs = [r for r in rows if r["label"] == label]
        color = ALG_COLORS["ring" if "ring" in label else "parameter server"]
        fig.add_scatter(x=[r["n"] for r in rs], y=[r["step_ms"] for r in rs], name=label,
                        mode="lines+markers", line={"color": color}, legendgroup=label, row=1, col=1)
        fig.add_scatter(x=[r["n"] for r in rs], y=[r["bytes"] / 1e6 for r in rs], name=label,
                        showlegend=False, mode="lines+markers", line={"color": color}, legendgroup=label,
                        row=1, col=2)
    fig.update_xaxes(title_text="workers N", dtick=1)
    fig.update_yaxes(title_text="ms (median, slowest rank)", row=1, col=1)
    fig.update_yaxes(title_text="MB sent + received per step", row=1, col=2)
    fig.update_layout(title=_with_note(title, note), height=400)
    return fig
