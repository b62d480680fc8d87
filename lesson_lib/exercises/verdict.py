"""A checker's verdict: right or not, and the message the learner reads."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Verdict:
    ok: bool
    message: str
    printed: bool = field(default=False, repr=False, compare=False)
    """Set by :meth:`Exercise.submit`, which has printed it: a notebook cell then shows nothing more."""

    def __bool__(self) -> bool:
        return self.ok

    def _ipython_display_(self):
        """A cell ending in ``ex.submit(answer)`` shows the printed line once, not that and this repr."""
        if not self.printed:
            from IPython.display import display

            display({"text/plain": repr(self)}, raw=True)
