"""The rendered course (``make site``): every chapter executed with :mod:`nbclient` and exported with
:mod:`nbconvert`'s JupyterLab template, as a static, offline site.

Plotly figures become ``Plotly.newPlot`` calls (one local ``plotly.min.js``); widgets become their
last state (a control becomes a line saying it is interactive), and a live ``FigureWidget`` its
final figure, asked of the kernel after the last cell (its stored state misses in-place updates).

Usage: ``python -m lesson_lib.site [--out build/site] [--chapters 00 07]``.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
PLOTLY = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"
STATE = "application/vnd.jupyter.widget-state+json"
CONTROL_NOTE = ("<p class='site-control'><em>{}</em> — open the notebook in JupyterLab to use this "
                "control.</p>")


def chapters(only: list[str] | None = None) -> list[Path]:
    """The chapter notebooks, in order; ``only`` keeps those whose name starts with one of its
    prefixes (``["00", "07"]``). An unknown prefix is an error naming it."""
    found = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if not only:
        return found
    unknown = [p for p in only if not any(f.name.startswith(p) for f in found)]
    if unknown:
        raise ValueError(f"chapters: no notebook starts with {', '.join(unknown)} "
                         f"(there are {', '.join(f.name[:2] for f in found)})")
    return [f for f in found if any(f.name.startswith(p) for p in only)]


def plot_html(figure: dict, n: int) -> str:
    """A plotly figure as a div, its JSON, and the call that draws it (plotly.min.js is on the page)."""
    div = f"site-figure-{n}"
    spec = json.dumps({"data": figure.get("data", []), "layout": figure.get("layout", {}),
                       "frames": figure.get("frames", [])})  # frames: an animation still plays
    spec = spec.replace("</", "<\\/")  # JSON reads "<\/" as "</"; a "</script>" in a label cannot end the tag
    return (f"<div id='{div}' class='site-plotly'></div>"
            f"<script type='application/json' id='{div}-json'>{spec}</script>"
            f"<script>(function () {{ var f = JSON.parse(document.getElementById('{div}-json').textContent); "
            f"Plotly.newPlot('{div}', {{data: f.data, layout: f.layout, frames: f.frames, "
            f"config: {{responsive: true}}}}); }})();</script>")


# Run in the kernel after the notebook's last cell: every live FigureWidget's figure, by model id.
DUMP_FIGURES = """
import plotly.io as _pio
from ipywidgets.widgets import widget as _w
from plotly.basewidget import BaseFigureWidget as _F
print("site-figures:" + "{" + ",".join(f'"{k}": {_pio.to_json(v)}' for k, v in _w._instances.items()
                                        if isinstance(v, _F)) + "}")
"""


class _Renderer:
    """Turns one notebook's plotly and widget outputs into static HTML; counts what it drew."""

    def __init__(self, widget_state: dict, live: dict):
        self.state, self.live = widget_state, live
        self.figures = 0
        self.controls = 0

    def figure(self, fig: dict) -> str:
        self.figures += 1
        return plot_html(fig, self.figures)

    def output(self, out: dict) -> str | None:
        data = out.get("data", {})
        if PLOTLY in data:
            return self.figure(data[PLOTLY])
        if WIDGET in data:
            return self.widget(data[WIDGET]["model_id"])
        return None

    def widget(self, model_id: str) -> str:
        if model_id in self.live:
            return self.figure(self.live[model_id])
        model = self.state.get(model_id)
        if model is None:  # no state stored: say so rather than print the widget's repr
            self.controls += 1
            return CONTROL_NOTE.format("a widget")
        name, s = model.get("model_name", ""), model.get("state", {})
        if s.get("_anywidget_id", "").endswith("FigureWidget"):
            return self.figure({"data": s.get("_widget_data", []), "layout": s.get("_widget_layout", {})})
        if name in ("VBoxModel", "HBoxModel", "BoxModel", "GridBoxModel", "AccordionModel", "TabModel"):
            parts = [self.widget(_ref(c)) for c in s.get("children", [])]
            tag = "flex" if name == "HBoxModel" else "block"
            return f"<div style='display:{tag}'>{''.join(parts)}</div>"
        if name == "OutputModel":
            return "".join(self.rich(o) for o in s.get("outputs", []))
        if name in ("HTMLModel", "HTMLMathModel"):
            return s.get("value", "")
        if name in ("LabelModel",):
            return f"<p>{html.escape(str(s.get('value', '')))}</p>"
        if name in ("IntProgressModel", "FloatProgressModel", "LayoutModel") or name.endswith("StyleModel"):
            return ""  # a progress bar's last state says nothing on a finished page
        self.controls += 1
        label = s.get("description") or name.removesuffix("Model")
        return CONTROL_NOTE.format(html.escape(str(label)))

    def rich(self, out: dict) -> str:
        """An output inside an Output widget: drawn, or its richest static form."""
        drawn = self.output(out)
        if drawn is not None:
            return drawn
        data = out.get("data", {})
        if "text/html" in data:
            return "".join(data["text/html"])
        text = out.get("text") or data.get("text/plain", "")
        return f"<pre>{html.escape(''.join(text))}</pre>" if text else ""


def _ref(child) -> str:
    return child.removeprefix("IPY_MODEL_") if isinstance(child, str) else child["model_id"]


def staticize(nb, live: dict | None = None) -> dict:
    """Replace every plotly and widget output of an executed notebook by static HTML, in place;
    ``live`` holds the final figure of each FigureWidget, by model id (:data:`DUMP_FIGURES`)."""
    state = nb.metadata.get("widgets", {}).get(STATE, {}).get("state", {})
    r = _Renderer(state, live or {})
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            drawn = r.output(out)
            if drawn is not None:
                out["data"], out["metadata"] = {"text/html": drawn}, {}
    nb.metadata.pop("widgets", None)
    return {"figures": r.figures, "controls": r.controls}


def execute(path: Path, timeout_s: int = 900):
    """The executed notebook, and the final figure of every live FigureWidget (asked of the kernel
    by one extra cell, removed again)."""
    import nbclient
    import nbformat

    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(DUMP_FIGURES))
    nbclient.NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    dump = nb.cells.pop()
    text = "".join(o.get("text", "") for o in dump.outputs if o.get("name") == "stdout")
    live = json.loads(text.split("site-figures:", 1)[1]) if "site-figures:" in text else {}
    return nb, live


def page(nb, title: str) -> str:
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="lab")
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": title}})
    # Drop the template's CDN scripts (require.js, MathJax): the site works offline without them.
    body = re.sub(r"<script[^>]*\ssrc=\"https?://[^\"]*\"[^>]*>\s*</script>", "", body)
    head = "<script src='plotly.min.js'></script><style>.site-plotly{width:100%;min-height:420px}</style>"
    return body.replace("</head>", head + "</head>", 1)


def home(readme: Path, pages: dict[str, str]) -> str:
    """The table of contents, its chapter links pointing at the pages."""
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    def link(m: re.Match) -> str:  # a chapter not built (make site CHAPTERS=...) keeps its title only
        return f"[{m[1]}]({pages[m[2]]})" if m[2] in pages else m[1]

    text = re.sub(r"\[([^\]]+)\]\((\d\d_[a-z_]+\.ipynb)\)", link, readme.read_text())
    body = markdown2html_mistune(text)
    return ("<!doctype html><html><head><meta charset='utf-8'><title>How distributed training evolved"
            "</title><style>body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;"
            "padding:0 1rem;line-height:1.5}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
            f"padding:.3rem .5rem;vertical-align:top}}</style></head><body>{body}</body></html>")


def build(out: Path, only: list[str] | None = None, timeout_s: int = 900) -> dict:
    """Execute and render the chapters into ``out`` (replaced); returns what each page holds."""
    todo = chapters(only)  # a bad prefix fails before anything is removed
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    import plotly

    shutil.copy(Path(plotly.__file__).parent / "package_data" / "plotly.min.js", out / "plotly.min.js")
    report, pages = {}, {}
    for path in todo:
        t0 = time.perf_counter()
        nb, live = execute(path, timeout_s)
        counts = staticize(nb, live)
        name = path.with_suffix(".html").name
        (out / name).write_text(page(nb, path.stem))
        pages[path.name] = name
        report[path.name] = {**counts, "seconds": time.perf_counter() - t0,
                             "bytes": (out / name).stat().st_size}
    (out / "index.html").write_text(home(NOTEBOOKS / "README.md", pages))
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lesson_lib.site", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "site", help="the site's folder (replaced)")
    ap.add_argument("--chapters", nargs="*", help="only these chapters, by number (e.g. 00 07)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds one cell may take")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        report = build(args.out, args.chapters, args.timeout)
    except ValueError as e:
        print(f"site: {e}", file=sys.stderr)
        return 2
    for name, r in report.items():
        print(f"{name}: {r['figures']} figures, {r['controls']} controls noted, {r['bytes'] / 1e6:.1f} MB, "
              f"{r['seconds']:.0f} s")
    size = sum(p.stat().st_size for p in args.out.iterdir())
    print(f"site: {args.out}/index.html — {len(report)} chapters, {size / 1e6:.1f} MB, "
          f"{time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
