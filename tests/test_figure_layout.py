"""Figures the chapters build read cleanly: log axes labelled at the decades only (no crowded "2" and
"5" labels between them), legends outside the plot area and clear of the bar labels, and an empty
live figure or explorer saying why it is empty. Built from small inputs, without starting workers."""

import math

import plotly.graph_objects as go
import pytest

from lesson_lib import plots
from lesson_lib.chapters import ch05
from lesson_lib.data import read_csv
from lesson_lib.plots.common import log_axes


def _axes(fig):
    return [(k, fig.layout[k]) for k in fig.layout.to_plotly_json() if k[0] in "xy" and k[1:5] == "axis"]


def _decades(fig, key) -> float:
    ref = key[0] + key[5:]
    values = [v for t in fig.data if (getattr(t, f"{key[0]}axis", None) or key[0]) == ref
              for v in (getattr(t, key[0], None) or ()) if isinstance(v, (int, float)) and v > 0]
    return math.log10(max(values) / min(values)) if values else 0.0


def _problems(name: str, fig: go.Figure) -> list[str]:
    out = []
    for key, ax in _axes(fig):
        if ax.type == "log" and ax.tickvals is None and _decades(fig, key) >= 1 and \
                not (isinstance(ax.dtick, (int, float)) and ax.dtick >= 1):
            out.append(f"{name}: {key} spans {_decades(fig, key):.1f} decades with plotly's minor labels "
                       f"(dtick {ax.dtick!r})")
    shown = [t for t in fig.data if t.showlegend is not False and t.name]
    if len(shown) > 1 and fig.layout.showlegend is not False:
        lg = fig.layout.legend
        h = lg.orientation == "h"  # plotly's defaults: a vertical legend at the right, a horizontal one below
        x = lg.x if lg.x is not None else 0 if h else 1.02
        y = lg.y if lg.y is not None else -0.1 if h else 1
        categories = any(isinstance(v, str) for t in fig.data for v in (getattr(t, "x", None) or ()))
        outside = x >= 1 or y >= 1 or lg.yref == "container" or (y < 0 and h and not categories)
        if not outside:
            out.append(f"{name}: the legend at x={x}, y={y} overlaps the plot area or its bar labels")
    return out


def _chapter_figures():
    """Figures as the chapters build them, from small inputs of the same shape."""
    p = plots
    labels = ["t = 2, forward", "dp 2 × pp 1 × tp 2 + SP: tensor-parallel all-reduce",
              "unsharded (one process)"]
    yield "ch0 model growth", p.training.model_growth(read_csv("model_sizes.csv"))
    yield "ch8 bytes", p.parallelism.bytes_vs_formula(
        [{"label": s, "counted": 1e4 * (i + 1), "formula": 1e4 * (i + 1)} for i, s in enumerate(labels)], "t")
    yield "ch8 memory", p.parallelism.memory_per_rank(
        [{"label": s, "params": 1e6, "block_activations": 2e6, "measured_peak": 3.5e6} for s in labels], "t")
    yield "ch8 experts", p.parallelism.expert_load([[3, 5, 1, 7], [4, 4, 2, 6]], 6, "t")
    yield "ch10 goodput", p.resilience.goodput_curve(
        [{"tau_s": 60 * t, "goodput": 1 - 1 / (t + 2)} for t in (0.5, 1, 3, 10, 30, 100, 300)],
        {"optimal": (600.0, 0.9), "hourly": (3600.0, 0.85)}, "t")
    yield "ch10 replica steps", p.resilience.replica_steps(
        {"a": [{"step": i, "t": 0.1 * i + 0.1, "s": 0.1 * (1 + 50 * (i == 3))} for i in range(8)],
         "b": [{"step": i, "t": 0.1 * i + 0.1, "s": 0.12} for i in range(8)]}, "t",
        marks=(("a", 3, "step 3 discarded"), ("b", 5, "healed")))


@pytest.mark.parametrize("name, fig", list(_chapter_figures()), ids=lambda v: v if isinstance(v, str) else "")
def test_log_axes_label_the_decades_and_legends_sit_outside_the_plot(name, fig):
    assert not _problems(name, fig)


def test_chapter_8s_bar_labels_are_broken_into_lines_not_turned_sideways():
    fig = dict(_chapter_figures())["ch8 bytes"]
    assert all(len(line) <= 16 for label in fig.data[0].x for line in label.split("<br>"))
    assert fig.layout.xaxis.tickangle == 0 and fig.layout.xaxis.automargin is True
    assert fig.layout.legend.x > 1 and fig.layout.legend.xanchor == "left"


def test_a_log_axis_spanning_less_than_a_decade_or_ticked_by_hand_keeps_its_labels():
    fig = go.Figure([go.Scatter(x=[2, 3, 7], y=[1, 10, 1e5]), go.Scatter(x=[1, 2], y=[1, 2], xaxis="x2")])
    fig.update_layout(xaxis={"type": "log"}, yaxis={"type": "log"},
                      xaxis2={"type": "log", "tickvals": [1, 2], "overlaying": "x"})
    log_axes(fig)
    assert fig.layout.xaxis.dtick is None  # 2–7: plotly's own labels are its only ones
    assert fig.layout.yaxis.dtick == 1 and fig.layout.yaxis.minor.ticks == "outside"  # five decades
    assert fig.layout.xaxis2.dtick is None  # ticks chosen by hand
    wide = log_axes(go.Figure(go.Scatter(x=[1, 2], y=[1e-3, 1e12])).update_yaxes(type="log"))
    assert wide.layout.yaxis.dtick == 2  # fifteen decades: every second one labelled
    ranged = log_axes(go.Figure(go.Scatter(x=[1], y=[5])).update_yaxes(type="log", range=[0, 3]))
    assert ranged.layout.yaxis.dtick == 1  # a range set by hand: its three decades


def test_a_live_figure_says_it_waits_for_the_first_step_until_one_is_drawn():
    live = plots.common.LiveRuns("t")
    assert "waiting for the first step" in live.waiting.text
    cb = live.track("a", 2, 1)
    for s in range(2):
        cb({"kind": "step", "step": s, "rank": 0, "wall_s": 0.01, "busy_s": 0.008, "loss": 1.0})
    assert live.waiting.text == ""


def test_an_explorer_says_what_to_press_before_its_first_run():
    out = ch05.explorer().children[-1]
    [first] = out.outputs
    assert first["data"]["text/plain"].startswith("Press Train")


def test_chapter_10s_replica_steps_mark_the_discard_and_the_heal_on_one_clock():
    from lesson_lib import plots as p

    # replica b was killed, restarted 2 s later (monotonic t 2.5 on): it must start 2.5 s in, not at 0
    a = [{"step": i, "t": 0.5 + 0.5 * i, "s": 0.5} for i in range(8)]
    b = [{"step": i, "t": 2.5 + 0.5 * (i - 4), "s": 0.5} for i in range(4, 8)]
    fig = p.resilience.replica_steps({"a": a, "b": b}, "t", marks=(("a", 3, "step 3 discarded"),
                                                                    ("b", 4, "healed from replica 0"),
                                                                    ("b", 99, "no such step")))
    assert list(fig.data[1].x) == [2.5, 3.0, 3.5, 4.0]  # t0 = 0.5 - 0.5 = 0: a's first step began at 0
    notes = {n.text: n.x for n in fig.layout.annotations}
    assert notes == {"step 3 discarded": 2.0, "healed from replica 0": 2.5}


def test_chapter_2s_alpha_beta_at_scale_keeps_its_titles_apart():
    # issue 59 item 9: the legend beside the two plots squeezed them until their titles overlapped,
    # and the one-line title ran past the figure's edge
    from lesson_lib import plots as p

    rows = [{"link": link, "algorithm": alg, "size_bytes": s, "world_size": n, "time_s": 1e-3 * n,
             "latency_share": 0.1} for link in ("laptop", "IB") for alg in ("ring", "halving-doubling")
            for s in (25e6, 1e9) for n in (2, 4, 8)]
    title = "The α-β model at cluster scale: InfiniBand HDR (one 200 Gb/s port per GPU) (α = 5 µs " \
            "assumed, 1/β = 25 GB/s) beside this laptop's fit"
    fig = p.alpha_beta.at_scale(rows, "IB", title)
    assert not _problems("ch2 at scale", fig)
    assert all(len(line) <= 80 for line in fig.layout.title.text.split("<br>"))
    assert fig.layout.legend.orientation == "h" and fig.layout.legend.y < 0  # below, not beside


def test_chapter_6s_crossings_are_named_in_the_legend_not_in_text_that_overlaps():
    # issue 59 item 9: the stars' text labels, a few N apart, overlapped each other
    from lesson_lib import plots as p

    ns = [2, 4, 8]
    fig = p.compression.bytes_vs_ranks(
        {"none": {2: 4e6}, "top-k 1%": {2: 8e4}}, {"top-k 1%": (ns, [8e4, 2.4e5, 5.6e5])},
        {"fp32 ring": (ns, [4e6] * 3), "bf16 ring": (ns, [2e6] * 3)},
        [("top-k 1%", 8, 5.6e5, "fp32"), ("top-k 1%", 4, 2.4e5, "bf16")])
    stars = [t for t in fig.data if t.marker.symbol in ("star", "star-open")]
    assert [t.name for t in stars] == ["top-k 1% stops saving at N = 8 (fp32 ring)",
                                       "top-k 1% stops saving at N = 4 (bf16 ring)"]
    assert all(t.mode == "markers" and t.showlegend is not False for t in stars)
    assert not _problems("ch6 bytes", fig)


def _chapter_1_3_4_figures():
    """Figures of chapters 1, 3 and 4 as they build them, with the CPU-fallback note where they add it."""
    from types import SimpleNamespace

    from lesson_lib.plots.common import oversubscription_note

    p = plots
    note = oversubscription_note([SimpleNamespace(oversubscribed=True, world_size=4)])
    c = {"time": [0, 1, 2], "updates": [1, 2, 3], "loss": [2, 1.5, 1.2]}
    segs = [{"worker": w, "step": 1, "phase": ph, "start": i, "end": i + 0.5}
            for w in range(2) for i, ph in enumerate(p.training.PHASE_COLORS)]
    ev = [{"rank": r, "kind": k, "microbatch": 0, "start": 0.01 * (r + 3 * j),
           "end": 0.01 * (r + 3 * j) + 0.008, "step": 1, "busy": 0.007}
          for r in range(2) for j, k in enumerate(("forward", "backward"))]
    rows = [{"label": f"stage {s}", "measured": {"params": 1e6}, "formula": {"total": 1e6}} for s in range(4)]
    yield "ch1 live", go.Figure(p.common.LiveRuns("Parameter server, 3 workers: sync vs async").fig)
    yield "ch1 loss", p.training.loss_curves({"sync": c, "async": c})
    yield "ch1 timeline", p.training.timeline(segs, "async: what each worker did, step by step", note)
    yield "ch1 traffic", p.training.traffic_vs_formula(
        [{"servers": k, "counted": 1e6 / k, "formula": 1e6 / k, "step_ms": 5.0} for k in (1, 2)], "servers",
        "server shards (K)", "Sharded servers: the traffic each server carries falls as 1/K, and the step "
        "time with it", note)
    yield "ch3 live", go.Figure(p.pipeline.LiveGantt(2, "1f1b: 2 stages, 4 micro-batches, live").fig)
    yield "ch3 gantt", p.pipeline.pipeline_gantt({"measured: wall clock, step 1": ev, "replayed": ev}, 2,
                                                 "1f1b: 2 stages, 1 micro-batch — one step as measured", note)
    yield "ch4 live", go.Figure(p.common.LiveRuns("ZeRO stages 0–3 on 4 ranks (fp32)").fig)
    yield "ch4 memory", p.memory.memory_vs_formula(
        rows, "Memory per rank, 4 ranks, fp32: the inventory of what rank 0 holds (bars) vs Rajbhandari "
        "et al. (2020) (marks)")


@pytest.mark.parametrize("name, fig", list(_chapter_1_3_4_figures()),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_chapters_1_3_and_4_titles_sit_below_plotlys_modebar(name, fig):
    # issue 59 item 9: titles with the CPU-fallback note were pushed (automargin) against the figure's
    # top edge, where the modebar covered their right-hand end at 700–950 px
    from lesson_lib.plots.common import MODEBAR_PX, SUP_LINE_PX, TITLE_LINE_PX

    t, height = fig.layout.title, fig.layout.height or 450
    lines = t.text.split("<br>")
    assert all(len(line) <= 80 for line in lines if "<sup" not in line), name
    # anchored by its first line, in pixels from the top: that line's top below the modebar's band
    assert t.yref == "container" and t.yanchor == "bottom" and t.automargin is False, name
    first_line_top = (1 - t.y) * height - TITLE_LINE_PX
    assert first_line_top >= MODEBAR_PX - 1e-6, name
    # and the top margin holds every line above the plot area
    sup = sum("<sup" in line for line in lines)
    assert fig.layout.margin.t >= MODEBAR_PX + TITLE_LINE_PX * (len(lines) - sup) + SUP_LINE_PX * sup, name


def test_chapter_7s_talk_chart_keeps_its_labels_apart_and_every_number():
    # issue 59 item 9: the title ran past the figure's edge and under the legend, the sideways
    # multi-line milestone names overlapped, and the memory bars' numbers sat on each other and on
    # the device-memory line's label
    from lesson_lib.costmodel import claims
    from lesson_lib.plots.common import MODEBAR_PX

    by = claims.chart(175e9, 300e9, 1024)
    fig = plots.impact.talk_chart(by, "1.75e+11 parameters, 3e+11 tokens on 1,024 × NVIDIA A100 SXM "
                                  "(80 GB): modelled time and memory per device, milestone by milestone",
                                  ["an assumption"])
    t, height = fig.layout.title, fig.layout.height
    assert all(len(line) <= 80 for line in t.text.split("<br>"))
    assert t.yref == "container" and (1 - t.y) * height >= MODEBAR_PX
    title_bottom = fig.layout.margin.t - plots.impact.LEGEND_PX - 30  # the subplot titles' room under it
    assert fig.layout.legend.yref == "container" and fig.layout.legend.yanchor == "top"
    assert (1 - fig.layout.legend.y) * height >= title_bottom  # the legend starts below the title
    # one-line tick labels on both subplots
    assert all("<br>" not in s for s in fig.layout.xaxis.ticktext)
    rows = by[0.0]
    # every number kept: days per overlap, memory per device and per server
    days = [tr for tr in fig.data if tr.xaxis == "x" and tr.showlegend is False]
    assert [list(tr.text) for tr in days] == [[f"{r['days']:.3g} d" for r in by[ov]] for ov in by]
    memory = [tr for tr in fig.data if tr.xaxis == "x2" and tr.type == "bar" and tr.text]
    assert list(memory[0].text) == [f"{r['memory']['total'] / 1e9:.3g}" for r in rows]
    # numbers turned sideways everywhere: side by side they no longer overlap
    assert all(tr.textangle == -90 for tr in days + memory)
    # the device's memory named in the legend, not in text on the bars
    assert not [a for a in fig.layout.annotations if "device memory" in (a.text or "")]
    assert any(tr.name == "device memory 80 GB (binary: 85.9e9 bytes)" for tr in fig.data)  # 80 GiB
    assert all(len(line) <= 125 for line in fig.layout.annotations[-1].text.split("<br>"))
