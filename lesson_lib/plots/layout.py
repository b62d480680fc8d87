"""Layout helpers every figure shares: log axes labelled at the decades, legends outside, titles
wrapped and clear of plotly's modebar, the CPU-fallback note, a labelled level line. Split from
:mod:`.common` (colours and the live training figure), which re-exports them."""

from __future__ import annotations

import math
import numbers
import textwrap

import plotly.graph_objects as go

DASHES = ["solid", "longdash", "dash", "dot", "dashdot", "longdashdot"]


def _values(data) -> list[float]:
    """The positive finite numbers of a trace's x or y (a list, a tuple or a NumPy array; else none)."""
    try:
        items = list(data) if data is not None and not isinstance(data, str) else []
    except TypeError:
        return []
    return [float(v) for v in items if isinstance(v, numbers.Real) and 0 < v < math.inf]


def log_axes(fig: go.Figure) -> go.Figure:
    """Every log axis of ``fig`` labelled at powers of ten only, its 2…9 as unlabelled minor ticks,
    where its data (or its set range) span a decade or more: plotly otherwise writes small "2" and
    "5" labels between the decades, crowding the axis. An axis spanning less keeps plotly's labels
    (they are then its only ones); ticks chosen by hand are kept. Returns ``fig``."""
    for name in [k for k in fig.layout.to_plotly_json() if k[1:5] == "axis" and k[0] in "xy"]:
        ax = fig.layout[name]
        if ax.type != "log" or ax.dtick is not None or ax.tickvals is not None:
            continue
        if ax.range is not None and all(isinstance(r, numbers.Real) for r in ax.range):
            lo, hi = sorted(ax.range)  # set by hand, in decades
        else:
            ref = name[0] + name[5:]  # "xaxis2" → "x2"
            values = [v for t in fig.data if (getattr(t, f"{name[0]}axis", None) or name[0]) == ref
                      for v in _values(getattr(t, name[0], None))]
            if not values:
                continue
            lo, hi = math.log10(min(values)), math.log10(max(values))
        if hi - lo >= 1:
            ax.update(dtick=max(1, math.ceil((hi - lo) / 8)), minor={"ticks": "outside", "ticklen": 3})
    return fig


def legend_outside(fig: go.Figure) -> go.Figure:
    """The legend at the right of the plot area, outside it (plotly widens the margin to fit): never
    over bars or their category labels below the axis. Returns ``fig``."""
    fig.update_layout(legend={"orientation": "v", "x": 1.02, "xanchor": "left", "y": 1, "yanchor": "top"})
    return fig


def wrap(text: str, width: int = 80) -> str:
    """Break a long title or note into lines (plotly never wraps, it clips at the figure's edge)."""
    return "<br>".join(textwrap.wrap(text, width))


# plotly's modebar (the toolbar that appears over the top-right corner when the mouse is on a figure)
# covers the top ~24 px of the figure, from the right edge to ~300 px left of it: at 700–950 px (a
# JupyterLab cell on a laptop) that is most of a long title's first line.
MODEBAR_PX = 28
TITLE_LINE_PX = 22  # a title line (17 px font); a <sup> line (a note) takes SUP_LINE_PX
SUP_LINE_PX = 17
TITLE_CHARS = 80  # a title line at most this long fits 700 px


def title_lines(text: str) -> list[str]:
    """The lines of a title as drawn, long plain lines wrapped at TITLE_CHARS."""
    return [line for part in (text or "").split("<br>")
            for line in ([part] if "<sup" in part else textwrap.wrap(part, TITLE_CHARS) or [""])]


def clear_of_modebar(fig: go.Figure) -> go.Figure:
    """Place ``fig``'s title below plotly's modebar band, with a top margin that holds the title's
    lines (and the subplot titles under it) and no more: the first line's baseline at a fixed
    distance from the top, so every line sits under the band whatever the figure's width. A title
    font larger than plotly's default (the room's dashboard) takes proportionally more room.

    Without it plotly centres the title in the top margin (or, pushed by ``automargin``, against
    the figure's top edge), where the modebar covers a long title's right-hand end; ``automargin``
    also left traces drawn where the plot area was before the margin grew. Returns ``fig``."""
    text = fig.layout.title.text
    if not text:
        return fig
    lines = title_lines(text)
    sup = sum("<sup" in line for line in lines)
    # plotly's title font: 1.4 × the figure's (12 px by default), 17 px: what the constants assume
    scale = (fig.layout.title.font.size or round(1.4 * (fig.layout.font.size or 12))) / 17
    line = TITLE_LINE_PX * max(1.0, scale)
    h = line * (len(lines) - sup) + SUP_LINE_PX * max(1.0, scale) * sup
    subplot_titles = any(a.yref == "paper" and a.y == 1 and a.yanchor == "bottom"
                         for a in fig.layout.annotations)
    height = fig.layout.height or 450  # plotly's default
    top = MODEBAR_PX + h + (34 if subplot_titles else 14)
    # plotly anchors a multi-line title by its first line: that line's bottom sits MODEBAR_PX + one
    # line from the top, the others below it
    fig.update_layout(title={"text": "<br>".join(lines), "yref": "container", "yanchor": "bottom",
                             "y": 1 - (MODEBAR_PX + line) / height,
                             "automargin": False, "pad": {"t": 0, "b": 0}},
                      margin={"t": math.ceil(max(fig.layout.margin.t or 0, top))})
    return fig


def titled(build):
    """Decorator: the figure ``build`` returns, its title placed by :func:`clear_of_modebar`
    (``wrapper.clear_of_modebar`` says so: tests find every figure function that lacks it)."""
    import functools

    @functools.wraps(build)
    def wrapper(*args, **kwargs):
        return clear_of_modebar(build(*args, **kwargs))

    wrapper.clear_of_modebar = True
    return wrapper


def _with_note(title: str, note: str | None) -> dict:
    """The title with the oversubscription note under it, a red ``<sup>`` line per 110 characters
    of the note; :func:`clear_of_modebar` (``@titled``) places it and sizes the top margin."""
    lines = [line for part in (note or "").split("<br>") for line in textwrap.wrap(part, 110)]
    return {"text": title + "".join(f"<br><sup style='color:#a33'>{line}</sup>" for line in lines)}


def level(fig, value: float, text: str, axis: str = "y", log: bool = False, row: int | None = None,
          col: int | None = None, **line) -> None:
    """A dotted line at ``value`` (``axis="y"``: horizontal) labelled ``text``, in subplot ``row``,
    ``col`` if given. ``log``: the axis is logarithmic (plotly places annotations at log10 there)."""
    style = {"dash": "dot", "color": "grey", **line}
    where = math.log10(value) if log else value
    x, y = "x", "y"
    if row is not None:  # that subplot's axes: "xaxis2" → "x2"
        sub = fig.get_subplot(row, col)
        x, y = (a.plotly_name.replace("axis", "") for a in (sub.xaxis, sub.yaxis))
    at = {"row": row, "col": col} if row is not None else {}
    if axis == "y":
        fig.add_hline(y=value, line=style, **at)
        fig.add_annotation(x=1, xref=f"{x} domain", y=where, yref=y, text=text, showarrow=False,
                           xanchor="right", yanchor="bottom")
    else:
        fig.add_vline(x=value, line=style, **at)
        fig.add_annotation(x=where, xref=x, y=1, yref=f"{y} domain", text=text, showarrow=False,
                           xanchor="right", yanchor="top")  # text to the left: the axis need not grow


def room_for_labels(values, below: float = 0.12, above: float = 0.2) -> list[float]:
    """A linear axis's range over ``values`` with room for the point labels drawn above (and below)
    the extreme points: plotly pads its autorange for the markers, not their text, which it clips."""
    lo, hi = min(values), max(values)
    span = (hi - lo) or abs(hi) or 1.0
    return [lo - below * span, hi + above * span]
