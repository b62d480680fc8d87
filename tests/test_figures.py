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


def test_live_figure_says_nothing_of_curves_that_differ():
    live = plots.common.LiveRuns("t")
    _feed(live, "a", 20, 1, lambda s: 2.0 * math.exp(-s / 8))
    _feed(live, "b", 20, 1, lambda s: 2.0 * math.exp(-s / 3))
    assert live.coinciding() == [] and not live.note.text
