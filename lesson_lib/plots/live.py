"""Live figures: plotly ``FigureWidget`` objects that the runs' events redraw while ranks train.

The class is made on first use, not at import. Touching ``plotly.graph_objects.FigureWidget``
imports plotly's renderers, nbformat and jsonschema: 2.3 s of one core (jsonschema's format checks
build a grammar), paid by every worker process that imports a chapter module to unpickle a job's
function, though no rank ever draws (the quick loop: ``benchmarks/test-times.md``)."""

from __future__ import annotations

import functools

import plotly.graph_objects as go


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
