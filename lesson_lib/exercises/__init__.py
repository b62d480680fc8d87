"""Auto-checked exercises with hints and solutions hidden by default.

A chapter defines :class:`Exercise` objects; ``ex.submit(answer)`` checks an answer. Numbers are
read by :func:`number` / :func:`whole_number` and compared by :func:`compare`, reported by
:func:`mismatch`; functions are judged by :func:`judge` against the exercise's :class:`Property`
list, on real ranks (:func:`on_ranks`, with :func:`observe`'s log) or in this process (:func:`locally`).
"""

from .answers import (
    AnswerError,
    choice,
    close_to,
    compare,
    mismatch,
    number,
    numbers_of,
    pair,
    stage,
    values_of,
    whole_number,
)
from .core import Exercise, assess, solution_text, unanswered
from .durations import duration, duration_slip
from .judge import Property, judge, locally, on_ranks
from .observe import Log, observe, summary, unobserved
from .verdict import Verdict

__all__ = [
    "AnswerError", "Exercise", "Log", "Property", "Verdict", "assess", "choice", "close_to", "compare",
    "duration", "duration_slip", "judge", "locally", "mismatch", "number", "on_ranks", "numbers_of",
    "observe", "pair", "solution_text", "stage", "summary", "unanswered", "unobserved", "values_of",
    "whole_number",
]
