"""Live figures: plotly ``FigureWidget`` objects that the runs' events redraw while ranks train.

The class is made on first use, not at import. Touching ``plotly.graph_objects.FigureWidget``
imports plotly's renderers, nbformat and jsonschema: 2.3 s of one core (jsonschema's format checks
build a grammar), paid by every worker process that imports a chapter module to unpickle a job's
function, though no rank ever draws (the quick loop: ``benchmarks/test-times.md``)."""

from __future__ import annotations

import functools
import json

import plotly.graph_objects as go
import traitlets

# anywidget imports each widget's ``_esm`` from a Blob URL of its own, so every FigureWidget sent
# plotly.js (4.96 MB) over the kernel's websocket and the browser evaluated it again, in a module whose
# code starts cold: chapter 4 received 81 MB, 98 % of it these copies, and in chapter 7, 11 copies cost
# Chromium's main thread about 24 s of one core while the ranks trained beside it. Here a small module
# does the loading: the first live figure of a kernel carries plotly's own widget bundle (``_bundle``),
# the page imports it once, and every figure on the page calls its factory; a figure that finds no
# copy on its page within 1 s returns from initialize (anywidget allows 2 s), asks its kernel for one
# if none is on its way (a carrier closed before its page loaded it), keeps the updates that arrive
# meanwhile and replays them to plotly's figure once it starts. The figure code is plotly's, unchanged.
_SHARED_ESM = """\
const KEY = %(key)s;
const slot = () => globalThis[KEY] ??= (() => {
  const s = {started: false};
  s.module = new Promise((resolve) => { s.resolve = resolve; });
  return s;
})();
function load(s, text) {
  if (s.started || !text) return;
  s.started = true;
  s.resolve(import(URL.createObjectURL(new Blob([text], {type: "text/javascript"}))));
}
function ask(model, s) {  // no figure on this page carries the bundle: its kernel sends one
  model.on("msg:custom", (msg, buffers) => {
    if (msg && msg.type === "lesson_lib:plotly-bundle" && buffers && buffers.length) {
      load(s, new TextDecoder().decode(buffers[0]));
    }
  });
  model.send({type: "lesson_lib:plotly-bundle?"});
}
// anywidget fails a model whose initialize has not returned within 2 s ("Failed to initialize model")
// and then handles none of its messages; until a model's initialize returns, it holds that model's
// messages, and JupyterLab every later message of the kernel. So wait at most WAIT_MS for the copy.
const WAIT_MS = 1000;
export default () => {
  let inner, started;
  const ready = new Promise((resolve) => { started = resolve; });
  return {
    async initialize(ctx) {
      const s = slot();
      load(s, ctx.model.get("_bundle"));
      const module = await Promise.race([s.module, new Promise((r) => setTimeout(() => r(null), WAIT_MS))]);
      if (module) {
        inner = module.default();
        started();
        return inner.initialize(ctx);
      }
      // No copy yet (a busy page still importing it, or none on the page): return now, keep the
      // kernel's figure updates, ask for a copy if none is on its way, and start plotly's figure on it.
      const missed = [];
      const keep = (model) => {
        for (const [k, v] of Object.entries(model.changedAttributes() || {})) {
          if (k.startsWith("_py2js_") && v !== null) missed.push([k, v]);
        }
      };
      ctx.model.on("change", keep);
      if (!s.started) ask(ctx.model, s);
      s.module.then((m) => {
        inner = m.default();
        // plotly's initialize puts its listeners on synchronously: replay before anything can yield,
        // so that no update is applied twice or out of order
        const init = inner.initialize(ctx);
        ctx.model.off("change", keep);
        for (const [k, v] of missed) { ctx.model.set(k, v); ctx.model.set(k, null); }
        Promise.resolve(init).then(started);
      });
    },
    async render(ctx) {
      await ready;
      return inner.render(ctx);
    },
  };
};
"""
BUNDLE_REQUEST, BUNDLE_REPLY = "lesson_lib:plotly-bundle?", "lesson_lib:plotly-bundle"


@functools.cache
def plotly_bundle() -> str:
    """plotly's own widget module (the ``_esm`` every ``FigureWidget`` would send)."""
    from plotly.basewidget import BaseFigureWidget

    return str(BaseFigureWidget._esm)


@functools.cache
def shared_esm() -> str:
    """The ``_esm`` of :func:`_live_class`'s figures: loads :func:`plotly_bundle` once per page."""
    import plotly

    key = f"lesson_lib:plotly-widget:{plotly.__version__}:{len(plotly_bundle())}"
    return _SHARED_ESM % {"key": json.dumps(key)}


_CARRIER: list = []  # the live figure of this kernel that carries the bundle to the browser


def _carries_bundle(fig) -> bool:
    """Whether ``fig`` is to carry the bundle: the first live figure, or the first after the one that
    carried it was closed (its model gone from the browser too)."""
    if _CARRIER and getattr(_CARRIER[0], "comm", None) is not None:
        return False
    _CARRIER[:] = [fig]
    return True


def _answer(widget, content, buffers) -> None:
    if isinstance(content, dict) and content.get("type") == BUNDLE_REQUEST:
        widget.send({"type": BUNDLE_REPLY}, buffers=[plotly_bundle().encode()])


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
        _bundle = traitlets.Unicode("").tag(sync=True)

        def __init__(self, *args, **kwargs):
            self._open_deferred = True
            super().__init__(*args, **kwargs)
            if _carries_bundle(self):
                self._bundle = plotly_bundle()
            self.on_msg(_answer)
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
