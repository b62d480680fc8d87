"""Auto-checked exercises with hints and solutions hidden by default (chapters 1 onwards).

``ex.submit(answer)`` checks an answer; before the learner answers it says so without failing, so
the notebook still runs under nbval. ``tests/`` check every reference solution passes.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

from ..runtime.output import held
from . import borrowed
from .answers import AnswerError
from .verdict import Verdict


@dataclass(kw_only=True)
class Exercise:
    """One exercise; every field is passed by name (prompt, hint and solution are all prose)."""

    key: str
    title: str
    prompt: str
    check: Callable[[Any], Verdict]
    hint: str
    solution: str
    reference: Callable[[], Any] | None = field(default=None, repr=False)
    """Returns a correct answer (used by the tests, never shown in the notebook)."""

    also: tuple = field(default=(), repr=False)
    """lesson_lib's own implementations of what is asked, beside the reference's (``scaling.quantize``
    for a scaled cast): an answer that calls one of them, or the reference's, is refused."""

    passed: bool = field(default=False, repr=False)
    _handed: list = field(default_factory=list, init=False, repr=False, compare=False)
    _make: Callable[[], Any] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.reference is not None:  # keep what reference() hands out: only that passes as itself
            make, handed = self.reference, self._handed
            self._make = make

            def reference():
                answer = make()
                handed.append(_unwrap(answer))
                return answer

            self.reference = reference

    def submit(self, answer: Any) -> Verdict:
        """Check ``answer``, print the verdict and return it (``self.passed`` keeps it). An answer still
        holding the template's ``...`` is "not answered yet", so Run All goes through open exercises."""
        lib = library_function(answer)
        if lib and not self._is_reference(answer):
            verdict = Verdict(False, f"that is the library's own {lib}, not yours: write the function "
                                     "in the cell and submit it (the exercise judges your lines)")
        else:
            verdict = self._judged(answer)
        if verdict is None:
            return self._not_yet()
        print(f"[{self.title}] {'✓ correct' if verdict.ok else '✗ not yet'} — {verdict.message}")
        self.passed = verdict.ok
        verdict.printed = True
        return verdict

    def _judged(self, answer: Any) -> Verdict | None:
        """The check's verdict on ``answer``, unless the answer called lesson_lib's own implementation
        of what is asked (noted while it ran, here or on the ranks: :mod:`.borrowed`)."""
        asked = self.asked() if callable(answer) and not self._is_reference(answer) else []
        took = borrowed.inherited(answer, asked)
        if took:
            return borrowed.borrowed_verdict(took)
        record = borrowed.Record() if asked else None
        try:
            with held():  # a cluster's banner said before the verdict, never among its lines
                verdict = assess(self.check, borrowed.watched(answer, asked, record) if asked else answer)
            seen = record.seen() if record else []
        finally:
            if record:
                record.close()
        return borrowed.borrowed_verdict(seen[0]) if seen and verdict is not None else verdict

    def asked(self) -> list[borrowed.Asked]:
        """The functions this exercise asks the learner to write, as lesson_lib implements them: what
        the reference hands over (when it is a function or an autograd Function) and :attr:`also`."""
        try:
            handed = self._make() if self._make is not None else None
        except Exception:  # a reference that needs a cluster, say: its :attr:`also` still counts
            handed = None
        fns = ([_unwrap(handed)] if callable(handed) else []) + list(self.also)
        return [a for fn in fns for a in borrowed.asked_of(fn)]

    def _is_reference(self, answer: Any) -> bool:
        """Whether ``answer`` came from this exercise's ``reference()`` (as the tests submit it). The
        same library function imported by a learner (chapter 10's notebook imports ``ft_step``, whose
        ``exchange`` is that exercise's reference) is the library's, not theirs."""
        fn = _unwrap(answer)
        return any(fn is handed for handed in self._handed)

    def _not_yet(self) -> Verdict:
        print(f"[{self.title}] not answered yet — replace the ... with your answer and run again.")
        self.passed = False
        return Verdict(False, "not answered yet", printed=True)

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


def assess(check: Callable[[Any], Verdict], answer: Any) -> Verdict | None:
    """``check(answer)`` as :meth:`Exercise.submit` judges it, printing nothing: ``None`` while the
    answer is still the template's ``...``; an answer no exercise can read (:class:`AnswerError`)
    or a learner's function that raises is a verdict, never a crash."""
    if unanswered(answer):
        return None
    try:
        return check(answer)
    except AnswerError as e:  # an answer in a form no exercise reads: say what was given
        return Verdict(False, str(e))
    except Exception as e:  # a learner's function may raise: that is feedback, not a crash
        if "ellipsis" in str(e).lower():
            return None
        return Verdict(False, f"your answer raised {type(e).__name__}: {e}")


def _unwrap(answer: Any) -> Any:
    while isinstance(answer, functools.partial):
        answer = answer.func
    return getattr(answer, "__func__", answer)  # a bound method's function


def library_function(answer: Any) -> str | None:
    """``module.qualname`` when ``answer`` is one of lesson_lib's own functions or classes (also
    through ``functools.partial`` or a bound method), else ``None``: a learner's cell defines its own."""
    fn = _unwrap(answer)
    if not (inspect.isfunction(fn) or inspect.isclass(fn) or inspect.isbuiltin(fn)):
        return None
    module = getattr(fn, "__module__", None) or ""
    if module == "lesson_lib" or module.startswith("lesson_lib."):
        return f"{module}.{getattr(fn, '__qualname__', fn.__name__)}"
    return None


def solution_text(fn: Callable) -> str:
    """The source of a reference answer, shown as the folded solution (one source: no pasted copy).

    Nested definitions are dedented and a docstring is left out.
    """
    import ast
    import textwrap

    text = textwrap.dedent(inspect.getsource(fn))
    node = ast.parse(text).body[0]
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant) \
            and isinstance(first.value.value, str):
        lines = text.splitlines()
        end = first.end_lineno + (first.end_lineno < len(lines) and not lines[first.end_lineno].strip())
        del lines[first.lineno - 1:end]  # the docstring, and a blank line after it
        text = "\n".join(lines)
    return text.rstrip()


def _stub():
    ...


def unanswered(answer: Any) -> bool:
    """True for the template's ``...``: alone, inside a list/tuple/dict, or as a function's whole body."""
    if answer is Ellipsis or answer is None:
        return True
    if isinstance(answer, (list, tuple)):
        return any(a is Ellipsis for a in answer)
    if isinstance(answer, dict):
        return any(a is Ellipsis for a in answer.values())
    code = getattr(answer, "__code__", None)
    return code is not None and code.co_code == _stub.__code__.co_code  # does nothing, returns None
