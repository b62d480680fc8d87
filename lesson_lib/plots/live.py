"""Live figures: plotly ``FigureWidget`` objects that the runs' events redraw while ranks train.

The class is made on first use, not at import. Touching ``plotly.graph_objects.FigureWidget``
imports plotly's renderers, nbformat and jsonschema: 2.3 s of one core (jsonschema's format checks
build a grammar), paid by every worker process that imports a chapter module to unpickle a job's
function, though no rank ever draws (the quick loop: ``benchmarks/test-times.md``)."""

from __future__ import annotations

import functools
import json

import plotly.graph_objects as go

# anywidget imports each widget's ``_esm`` from a Blob URL of its own, so every FigureWidget on a page
# evaluates plotly.js (5 MB) again, in a module whose code starts cold: in chapter 7, 11 copies cost
# Chromium's main thread about 24 s of one core while the ranks trained beside it. This module, made
# from plotly's own widget bundle, imports that bundle once per page and hands every figure the same
# copy: the figure code is plotly's, unchanged; only the loading is shared.
_SHARED_ESM = """\
const KEY = %(key)s;
const BUNDLE = %(bundle)s;
export default async () => {
  globalThis[KEY] ??= import(URL.createObjectURL(new Blob([BUNDLE], {type: "text/javascript"})));
  return (await globalThis[KEY]).default();
};
"""


@functools.cache
def shared_esm() -> str:
    """The ``_esm`` of :func:`_live_class`'s figures: plotly's widget bundle, loaded once per page."""
    import plotly
    from plotly.basewidget import BaseFigureWidget

    bundle = str(BaseFigureWidget._esm)
    key = f"lesson_lib:plotly-widget:{plotly.__version__}:{len(bundle)}"
    return _SHARED_ESM % {"key": json.dumps(key), "bundle": json.dumps(bundle)}


@functools.cache
def _live_class() -> type:
    class LiveFigure(go.FigureWidget):
        """A ``FigureWidget`` whose first message to the browser carries its whole figure.

        plotly opens a widget's channel with an empty figure and sends the figure in the messages
        that follow; the first live figure of a session, whose module the browser is still loading,
        could draw from the empty state (bare axes, no title, no traces). Here the channel opens only
        once the figure is complete. :meth:`fresh` makes a new one from the current figure, which a
        live plot swaps in when its runs have ended, so the final drawing never depends on a message
        that arrived too early."""

        _esm = shared_esm()

        def __init__(self, *args, **kwargs):
            self._open_deferred = True
            super().__init__(*args, **kwargs)
            self._open_deferred = False
            self.open()

        def open(self):
            if not getattr(self, "_open_deferred", False):
                super().open()

        def fresh(self) -> "LiveFigure":
            return LiveFigure(go.Figure(self))

    return LiveFigure


def LiveFigure(*args, **kwargs):  # a class to its callers, made on first use
    """A new live figure (see :func:`_live_class`'s class): ``go.FigureWidget``'s arguments."""
    return _live_class()(*args, **kwargs)


def swap_in(container, old):
    """Put a ``fresh()`` copy of the live figure ``old`` in its place among ``container``'s children."""
    new = old.fresh()
    container.children = tuple(new if c is old else c for c in container.children)
    # not old.close(): a run that ends fast swaps again while the browser may still be initialising
    # the figure it replaces, and closing that model then fails in the browser ("Failed to initialize
    # model"); a figure out of the container is only a few kilobytes of state
    return new
