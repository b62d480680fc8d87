"""``show_source(fn)``: a library function's own lines in the notebook, highlighted (every chapter).

One source for every piece of code: a chapter shows ``comm.ring_all_reduce`` from the module the
workers run, never a pasted copy that could drift from it.
"""

from __future__ import annotations

import html
import inspect
import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Source:
    """The source of one object: its text, file (relative to the package's parent) and first line."""

    name: str
    path: str
    first_line: int
    text: str

    @property
    def last_line(self) -> int:
        return self.first_line + self.text.count("\n") - (1 if self.text.endswith("\n") else 0)

    def header(self) -> str:
        return f"{self.name} — {self.path}, lines {self.first_line}–{self.last_line}"

    def __str__(self) -> str:
        return f"# {self.header()}\n{self.text}"

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        try:
            from pygments import highlight
            from pygments.formatters import HtmlFormatter
            from pygments.lexers import PythonLexer

            fmt = HtmlFormatter(linenos="inline", linenostart=self.first_line, noclasses=True,
                                style="default")
            body = highlight(self.text, PythonLexer(), fmt)
        except ImportError:  # pygments comes with IPython; plain text otherwise
            body = f"<pre>{html.escape(self.text)}</pre>"
        return (f"<div style='font-size:90%'><b>{html.escape(self.name)}</b> "
                f"<code>{html.escape(self.path)}</code>, lines {self.first_line}–{self.last_line}"
                f"{body}</div>")


def source(obj: Any) -> Source:
    """The :class:`Source` of a function, class or module (raises TypeError for built-ins).

    A decorated function (a cache, ``functools.wraps``) shows the function it wraps."""
    obj = inspect.unwrap(obj) if callable(obj) and not inspect.isclass(obj) else obj
    try:
        lines, first = inspect.getsourcelines(obj)
        path = inspect.getsourcefile(obj) or "?"
    except (TypeError, OSError) as e:
        raise TypeError(f"no Python source to show for {obj!r}: {e}") from None
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rel = os.path.relpath(path, root) if os.path.abspath(path).startswith(root) else path
    name = getattr(obj, "__qualname__", getattr(obj, "__name__", repr(obj)))
    module = getattr(obj, "__module__", None)
    if module and not inspect.ismodule(obj):
        name = f"{module}.{name}"
    return Source(name, rel, max(first, 1), "".join(lines))


def show_source(*objs: Any) -> None:
    """Display the source of each object (highlighted in a notebook, plain text elsewhere)."""
    try:
        from IPython.display import display
    except ImportError:  # pragma: no cover - IPython is a dependency
        display = print
    for obj in objs:
        display(source(obj))
