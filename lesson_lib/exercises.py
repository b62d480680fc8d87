"""Auto-checked exercises with hints and solutions hidden by default (chapters 1 onwards).

A chapter module defines its exercises as :class:`Exercise` objects; the notebook shows one
(``ex`` alone in a cell), the learner writes an answer, and ``ex.submit(answer)`` checks it.
Until the learner answers (``answer = ...``), ``submit`` says so and does not fail, so the
notebook still runs top to bottom under nbval; ``tests/`` check every reference solution passes
and a wrong answer fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Verdict:
    ok: bool
    message: str

    def __bool__(self) -> bool:
        return self.ok


@dataclass
class Exercise:
    key: str
    title: str
    prompt: str
    check: Callable[[Any], Verdict]
    hint: str
    solution: str
    reference: Callable[[], Any] | None = field(default=None, repr=False)
    """Returns a correct answer (used by the tests, never shown in the notebook)."""

    passed: bool = field(default=False, repr=False)

    def submit(self, answer: Any) -> None:
        """Check ``answer`` and print the verdict (``self.passed`` keeps it)."""
        if answer is Ellipsis or answer is None:
            print(f"[{self.title}] not answered yet — replace the ... with your answer and run again.")
            self.passed = False
            return
        try:
            verdict = self.check(answer)
        except Exception as e:  # a learner's function may raise: that is feedback, not a crash
            verdict = Verdict(False, f"your answer raised {type(e).__name__}: {e}")
        print(f"[{self.title}] {'✓ correct' if verdict.ok else '✗ not yet'} — {verdict.message}")
        self.passed = verdict.ok

    def widget(self):
        import ipywidgets as W

        def folded(title: str, body: str):
            acc = W.Accordion(children=[W.HTML(f"<pre style='white-space:pre-wrap'>{body}</pre>")])
            acc.set_title(0, title)
            acc.selected_index = None  # hidden by default
            return acc

        return W.VBox([W.HTML(f"<h4>Exercise: {self.title}</h4><p>{self.prompt}</p>"),
                       folded("Hint", self.hint), folded("Solution", self.solution)])

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget())


def close_to(expected: float, rtol: float = 0.01, unit: str = "") -> Callable[[Any], Verdict]:
    """A check that a number is within ``rtol`` of ``expected``."""

    def check(answer: Any) -> Verdict:
        value = float(answer)
        ok = abs(value - expected) <= rtol * max(abs(expected), 1e-12)
        return Verdict(ok, f"you said {value:g}{unit}" + ("" if ok else "; check your formula"))

    return check
