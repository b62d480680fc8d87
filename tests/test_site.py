"""The rendered course (lesson_lib.site, `make site`): figures and widgets become static HTML the
page can draw offline, the table of contents links the pages built, and one chapter builds for real."""

import json
import re

import nbformat
import pytest

from lesson_lib import site

FIG = {"data": [{"type": "scatter", "x": [1, 2], "y": [3, 4], "name": "</script> in a name"}],
       "layout": {"title": {"text": "t"}}}


def _notebook_with_every_kind_of_output():
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("...")
    view = lambda mid: {site.WIDGET: {"version_major": 2, "version_minor": 0, "model_id": mid}}
    cell.outputs = [
        nbformat.v4.new_output("display_data", data={site.PLOTLY: FIG, "text/plain": "Figure()"}),
        nbformat.v4.new_output("display_data", data={**view("box"), "text/plain": "VBox(...)"}),
        nbformat.v4.new_output("display_data", data={**view("gone"), "text/plain": "Button(...)"}),
        nbformat.v4.new_output("stream", name="stdout", text="printed\n"),
    ]
    nb.cells = [cell]
    state = {
        "box": {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_bar", "IPY_MODEL_live",
                                                                  "IPY_MODEL_out", "IPY_MODEL_slider"]}},
        "bar": {"model_name": "IntProgressModel", "state": {"value": 3}},
        "live": {"model_name": "AnyModel", "state": {
            "_anywidget_id": "plotly.graph_objs._figurewidget.FigureWidget", "_widget_data": FIG["data"],
            "_widget_layout": {}}},
        "out": {"model_name": "OutputModel", "state": {"outputs": [
            {"output_type": "display_data", "data": {site.PLOTLY: FIG}, "metadata": {}},
            {"output_type": "stream", "name": "stdout", "text": "a <table> printed"}]}},
        "slider": {"model_name": "IntSliderModel", "state": {"description": "ranks"}},
    }
    nb.metadata["widgets"] = {site.STATE: {"state": state, "version_major": 2, "version_minor": 0}}
    return nb


def test_figures_and_widgets_become_what_they_last_showed():
    nb = _notebook_with_every_kind_of_output()
    counts = site.staticize(nb)
    assert counts == {"figures": 3, "controls": 2}  # the figure, the live figure, the one in Output
    outs = nb.cells[0].outputs
    html = [o["data"]["text/html"] for o in outs[:3]]
    assert html[0].count("Plotly.newPlot('site-figure-1'") == 1 and "<\\/script> in a name" in html[0]
    assert "</script> in a name" not in html[0]  # a string cannot end the script early
    assert _figures(html[0]) == {"site-figure-1": {**FIG, "frames": []}}
    assert "site-figure-2" in html[1] and "site-figure-3" in html[1]  # FigureWidget, then the Output's
    assert "a &lt;table&gt; printed" in html[1] and "<em>ranks</em>" in html[1]  # escaped text; the slider
    assert "value" not in html[1]  # a progress bar leaves nothing
    assert "<em>a widget</em>" in html[2]  # no state stored for it: a note, not its repr
    assert outs[3]["text"] == "printed\n" and "widgets" not in nb.metadata
    nbformat.validate(nb)  # the page is exported from a valid notebook


def test_unknown_chapters_are_refused_by_name():
    numbers = [p.name[:2] for p in site.chapters()]  # every chapter, in order, none missing
    assert numbers == [f"{i:02d}" for i in range(len(numbers))] and len(numbers) >= 10, numbers
    assert [p.name[:2] for p in site.chapters(["07", "00"])] == ["00", "07"]
    with pytest.raises(ValueError, match="chapters: no notebook starts with 9, 42"):
        site.chapters(["9", "42", "00"])


def test_the_home_page_links_only_the_pages_built():
    home = site.home(site.NOTEBOOKS / "README.md", {"07_impact.ipynb": "07_impact.html"})
    assert '<a href="07_impact.html">Putting it all together</a>' in home
    assert "00_why_distributed.ipynb" not in home and "Why distributed?" in home  # not built: title only
    assert "<table>" in home


def _figures(page: str) -> dict:
    found = re.findall(r"<script[^>]*\sid=[\"'](site-figure-\d+)-json[\"'][^>]*>(.*?)</script>", page)
    return {k: json.loads(v) for k, v in found}


@pytest.mark.slow
def test_a_chapter_builds_into_a_page_that_holds_its_figures(tmp_path):
    report = site.build(tmp_path / "site", ["07"])
    page = (tmp_path / "site" / "07_impact.html").read_text()
    assert report["07_impact.ipynb"]["figures"] >= 4
    drawn = _figures(page)
    assert len(drawn) == report["07_impact.ipynb"]["figures"] == page.count("Plotly.newPlot(")
    assert all(f["data"] for f in drawn.values())  # every figure has traces
    assert site.PLOTLY not in page and site.WIDGET not in page  # nothing left for a kernel to draw
    assert not re.search(r"<script[^>]*src=\"https?://", page)  # offline: no CDN script
    assert "<script src='plotly.min.js'>" in page
    assert (tmp_path / "site" / "plotly.min.js").stat().st_size > 1e6
    assert "Traceback" not in page
    assert '<a href="07_impact.html">' in (tmp_path / "site" / "index.html").read_text()


def test_a_live_figure_is_drawn_as_the_kernel_last_held_it():
    nb = _notebook_with_every_kind_of_output()
    final = {"data": [{"type": "bar", "y": [7]}], "layout": {}}
    site.staticize(nb, live={"live": final})  # the kernel's figure, not the stale stored state
    assert _figures(nb.cells[0].outputs[1]["data"]["text/html"])["site-figure-2"] == {**final, "frames": []}
