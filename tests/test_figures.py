"""Figures say only what they show: layout and notes, checked without starting workers."""

import math

from lesson_lib import plots


def _feed(live, label, steps, world, loss):
    cb = live.track(label, steps, world)
    for s in range(steps):
        for r in range(world):
            cb({"kind": "step", "step": s, "rank": r, "wall_s": 0.01, "busy_s": 0.008, "loss": loss(s)})


def test_live_figure_takes_the_notebook_width_and_keeps_its_legend_off_the_axis_titles():
    layout = plots.common.LiveRuns("t").fig.layout
    assert layout.autosize is True and layout.width is None
    # The legend sits at the foot of the figure in a bottom margin of its own, under "step".
    assert layout.legend.orientation == "h" and layout.legend.yref == "container"
    assert layout.legend.yanchor == "bottom" and layout.legend.y < 0.05
    assert layout.margin.b >= 100
    assert layout.xaxis.title.text == "step" and layout.xaxis2.title.text == "step"


def test_live_figure_says_when_loss_curves_coincide_and_dashes_them_all_visible():
    live = plots.common.LiveRuns("t")
    for n in (1, 2, 4):
        _feed(live, f"{n} rank(s)", 20, n, lambda s, n=n: 2.3 * math.exp(-s / 8) + 1e-7 * n)
    _feed(live, "apart", 20, 1, lambda s: 3.0 * math.exp(-s / 4))
    [(labels, gap)] = live.coinciding()
    assert labels == ["1 rank(s)", "2 rank(s)", "4 rank(s)"] and gap < 1e-6
    assert "curves coincide: 1 rank(s), 2 rank(s), 4 rank(s)" in live.note.text
    assert "float rounding" in live.note.text and "apart" not in live.note.text
    dashes = [live.fig.data[live._runs[lb]["traces"][0]].line.dash for lb in labels]
    assert len(set(dashes)) == 3
    # The subplot titles are untouched.
    assert [a.text for a in live.fig.layout.annotations if a.name != "coincide"][0] == "global training loss"


def test_live_figure_gives_each_of_chapter_5s_eight_runs_its_own_colour():
    live = plots.common.LiveRuns("t")
    for i in range(8):
        live.track(f"run {i}", 10, 2)
    colors = [live.fig.data[run["traces"][0]].line.color for run in live._runs.values()]
    assert len(set(colors)) == 8, colors
    for run in live._runs.values():  # the run's step time and busy time share its colour
        assert len({live.fig.data[t].line.color for t in run["traces"]}) == 1


def test_live_figure_says_nothing_of_curves_that_differ():
    live = plots.common.LiveRuns("t")
    _feed(live, "a", 20, 1, lambda s: 2.0 * math.exp(-s / 8))
    _feed(live, "b", 20, 1, lambda s: 2.0 * math.exp(-s / 3))
    assert live.coinciding() == [] and not live.note.text


def _oversubscribed(n=4):
    from types import SimpleNamespace

    return [SimpleNamespace(oversubscribed=True, world_size=n)]


def test_cpu_fallback_note_mentions_busy_time_only_where_the_figure_shows_it():
    assert "Busy time" in plots.common.oversubscription_note(_oversubscribed())
    bare = plots.common.oversubscription_note(_oversubscribed(), busy_shown=False)
    assert bare.startswith("CPU fallback: 4 ranks share") and "usy" not in bare and "beside" not in bare
    assert plots.common.oversubscription_note([]) is None


def test_cpu_fallback_note_sits_above_the_subplot_titles_and_is_wrapped_once():
    note = plots.common.oversubscription_note(_oversubscribed(), busy_shown=False)
    rows = [{"world_size": n, "algorithm": "ring", "size_bytes": s, "algbw_GBps": 0.1}
            for n in (2, 4) for s in (1e3, 1e6)]
    title = plots.collectives.allreduce_bandwidth(rows, {}, note).layout.title
    assert note in title.text and "Busy" not in title.text
    # Placed under plotly's modebar (no automargin), the top margin holding the title, the note and
    # the subplot titles under them.
    fig = plots.collectives.allreduce_bandwidth(rows, {}, note)
    assert title.yref == "container" and title.yanchor == "bottom" and title.automargin is False
    assert fig.layout.margin.t >= plots.common.MODEBAR_PX + plots.common.TITLE_LINE_PX + \
        plots.common.SUP_LINE_PX * title.text.count("<sup") + 30
    # A note already broken into lines is not broken again into one-word lines ("(CPU time / of / ...").
    long = plots.common.oversubscription_note(_oversubscribed())
    text = plots.common._with_note("t", plots.common.wrap(long, 60))["text"]
    lines = [seg.split("</sup>")[0] for seg in text.split("<sup style='color:#a33'>")[1:]]
    assert len(lines) == len(plots.common.wrap(long, 60).split("<br>"))
    assert all(len(line.split()) > 3 for line in lines)


def test_bytes_per_rank_says_modelled_for_the_library_collective():
    row = {"algorithm": "library (modelled)", "kind": "modelled", "rank": 0, "sent": 1e6, "recv": 1e6}
    assert plots.collectives.bytes_per_rank([row], "t").layout.yaxis.title.text == \
        "MB sent + received (modelled)"
    row = {"algorithm": "ring (counted)", "rank": 0, "sent": 1e6, "recv": 1e6}
    assert plots.collectives.bytes_per_rank([row], "t").layout.yaxis.title.text == \
        "MB sent + received (counted)"


def test_fsdp2_side_by_side_draws_a_bar_per_rank_and_the_inventory_in_mb():
    rows = [{"label": "ours", "measured": [2e6, 3e6], "states": [1e6, 1e6]},
            {"label": "FSDP2", "measured": [4e6, 5e6], "states": [1e6, 1e6]}]
    fig = plots.memory.side_by_side(rows, "chapter 4, section 8")
    assert [t.name for t in fig.data] == ["measured peak, rank 0", "measured peak, rank 1",
                                          "inventory: model states (rank 0)"]
    assert [list(t.y) for t in fig.data] == [[2, 4], [3, 5], [1, 1]]


def test_live_figure_sends_a_bounded_curve_while_a_run_trains_and_every_step_at_its_end():
    live = plots.common.LiveRuns("t", min_interval_s=1e9)  # redrawn here by hand, then at the end
    cb = live.track("long", 3000, 2)
    loss, wall, busy = (live.fig.data[i] for i in live._runs["long"]["traces"])
    for s in range(3000):
        for r in range(2):
            cb({"kind": "step", "step": s, "rank": r, "wall_s": 0.01, "busy_s": 0.008, "loss": 1 / (s + 1)})
        if s == 1999:  # mid-run: every k-th step and the latest, no more than LIVE_POINTS + 1
            live._redraw(live._runs["long"])
            for trace in (loss, wall, busy):
                assert len(trace.x) <= live.LIVE_POINTS + 1 and trace.x[-1] == 1999
            assert list(loss.y) == [1 / (x + 1) for x in loss.x]  # each point is its step's
    assert list(loss.x) == list(range(3000)) and list(wall.x) == list(range(1, 3000))  # step 0 left out


def _counting(live):
    calls = []
    draw = live._redraw
    live._redraw = lambda run: (calls.append(len(run["loss"])), draw(run))
    return calls


def test_live_figure_redraws_in_full_once_when_the_last_ranks_final_events_come_late():
    # Events come in batches per rank: rank 0 can finish its steps (and the loss) before rank 1's last
    # batch is in. Each of those late events used to redraw every step of the run (the kernel's time,
    # on the ranks' cores, at the end of each of chapter 5's 6,144-step runs).
    live = plots.common.LiveRuns("t", min_interval_s=1e9)
    cb = live.track("late", 3000, 2)
    calls = _counting(live)
    for r in (0, 1):
        for s in range(3000):
            cb({"kind": "step", "step": s, "rank": r, "wall_s": 0.01, "busy_s": 0.008, "loss": 1 / (s + 1)})
    assert calls == [3000]  # one redraw, when rank 1's last step came
    loss, wall, busy = (live.fig.data[i] for i in live._runs["late"]["traces"])
    assert list(loss.x) == list(range(3000)) and list(wall.x) == list(range(1, 3000)) == list(busy.x)
    assert live.progress.value == 3000
    live.finish("late")  # run_warm's call after the run: nothing left to draw
    assert calls == [3000]


def test_live_figure_draws_a_run_that_stopped_early_in_full_when_it_finishes():
    live = plots.common.LiveRuns("t", min_interval_s=1e9)
    cb = live.track("diverged", 3000, 2)
    calls = _counting(live)
    for s in range(1200):  # the loss went to inf at step 1199: every rank stopped there
        for r in range(2):
            cb({"kind": "step", "step": s, "rank": r, "wall_s": 0.01, "busy_s": 0.008, "loss": float(s)})
    assert calls == []
    live.finish("diverged")
    loss, wall, _ = (live.fig.data[i] for i in live._runs["diverged"]["traces"])
    assert calls == [1200] and list(loss.x) == list(range(1200)) and list(wall.x) == list(range(1, 1200))
    assert live.progress.value == 1200


def test_run_warm_draws_its_run_in_full_after_the_last_event(monkeypatch):
    from lesson_lib import experiments
    from lesson_lib.milestones import large_batch as lb

    def fake_run(name, cfg, cluster=None, on_event=None):  # two ranks, stopped after 10 steps
        for s in range(10):
            for r in range(2):
                on_event({"kind": "step", "step": s, "rank": r, "wall_s": 0.01, "busy_s": 0.01, "loss": 1.0})
        return "result"

    monkeypatch.setattr(experiments, "run", fake_run)
    monkeypatch.setattr(experiments, "warm_cluster", lambda *a, **k: None)
    live = plots.common.LiveRuns("t", min_interval_s=1e9)
    cfg = lb.at_batch("sgd", 64, "laptop")
    assert experiments.run_warm(cfg, live, "sgd") == "result"
    assert cfg.steps > 10 and list(live.fig.data[0].x) == list(range(10))


def test_a_labelled_level_on_a_log_axis_puts_its_label_where_its_line_is():
    # catches: add_hline's label on a log axis placed at 10^value (chapter 7's "device memory 80 GB"
    # label sat at 10^80, off the chart; chapter 5's batch labels stretched an axis to 10^70)
    import math

    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2)
    fig.add_bar(x=["a"], y=[10], row=1, col=1)
    fig.add_bar(x=["a"], y=[30], row=1, col=2)
    fig.update_yaxes(type="log")
    plots.common.level(fig, 80.0, "device memory 80 GB", log=True, row=1, col=2)
    (line,), (label,) = fig.layout.shapes, fig.layout.annotations
    assert (line.y0, line.yref) == (80.0, "y2")  # shapes: the data value
    assert label.y == math.log10(80.0) and label.yref == "y2" and label.xref == "x2 domain"


def test_a_table_figure_is_tall_and_wide_enough_for_every_row_on_one_line():
    # caught: chapter 2's α-β table cut off in the browser (28 px per row, cells wrapping to two lines)
    from lesson_lib import plots

    rows = [{"ranks": n, "algorithm": "Gloo's dist.all_reduce", "α (µs per step)": "123"} for n in range(9)]
    fig = plots.memory.fits_table(rows, ["ranks", "algorithm", "α (µs per step)"], "t")
    table = fig.data[0]
    assert fig.layout.height >= fig.layout.margin.t + table.header.height + table.cells.height * len(rows)
    widths = list(table.columnwidth)
    assert widths[1] / sum(widths) >= len("Gloo's dist.all_reduce") / (len("Gloo's dist.all_reduce") + 30)


def test_one_live_figure_per_kernel_carries_plotlys_widget_module_and_the_page_imports_it_once():
    # anywidget imports each widget's _esm from a Blob URL of its own: had every figure carried plotly.js
    # (5 MB), chapter 4 alone would send 81 MB. The browser test checks the single copy on a real page.
    import re

    from plotly.basewidget import BaseFigureWidget

    from lesson_lib.plots import live

    live._CARRIER.clear()
    first, second = live.LiveFigure({}), live.LiveFigure({"data": [{"type": "bar", "y": [1]}]})
    assert first._bundle == str(BaseFigureWidget._esm)  # plotly's code, unchanged
    assert second._bundle == "" and first.fresh()._bundle == ""
    assert first._esm == second._esm and len(first._esm) < 5000
    # the bundle is imported in one place only, behind the page-wide key; each figure calls its factory
    assert first._esm.count("import(") == 1 and "globalThis[KEY] ??=" in first._esm
    # initialize waits at most 1 s for the copy (anywidget fails a model after 2 s) and otherwise
    # starts plotly's figure when the copy arrives, replaying the updates kept meanwhile
    assert "const WAIT_MS = 1000;" in first._esm and "Promise.race([s.module," in first._esm
    assert 'k.startsWith("_py2js_")' in first._esm and "ctx.model.set(k, v)" in first._esm
    assert re.search(r"^const KEY = \"lesson_lib:plotly-widget:", first._esm, re.M)
    # a figure whose page holds no copy asks its kernel, which answers with the bundle's bytes
    sent = []
    second.send = lambda content, buffers=None: sent.append((content, buffers))
    live._answer(second, {"type": "something else"}, [])
    assert sent == []
    live._answer(second, {"type": live.BUNDLE_REQUEST}, [])
    assert sent == [({"type": live.BUNDLE_REPLY}, [str(BaseFigureWidget._esm).encode()])]
    # once the carrier is closed, the next live figure carries the bundle again
    first.close()
    assert live.LiveFigure({})._bundle == str(BaseFigureWidget._esm)
