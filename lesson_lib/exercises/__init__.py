"""Auto-checked exercises with hints and solutions hidden by default.

A chapter module defines its exercises as :class:`Exercise` objects; the notebook shows one
(``ex`` alone in a cell), the learner writes an answer, and ``ex.submit(answer)`` checks it.

Every checker works the same way:

* a number, in whatever form the learner gives it, is read by :func:`number` or
  :func:`whole_number` (:mod:`.answers`), compared by :func:`compare`, and a wrong one is
  reported by :func:`mismatch`, never as two equal-looking numbers;
* every function a learner writes is judged by :func:`judge` against the :class:`Property` list the
  exercise teaches (:mod:`.judge`), from what happened: on real ranks (:func:`on_ranks`) their
  results and :func:`observe`'s log of the collectives they ran (:mod:`.observe`); in this process
  (:func:`locally`: a formula, an optimizer step, a schedule) what it returned, on several cases.
"""

from .answers import AnswerError, choice, close_to, compare, mismatch, number, numbers_of, pair, whole_number
from .core import Exercise, assess, solution_text, unanswered
from .judge import Property, judge, locally, on_ranks
from .observe import Log, observe, summary, unobserved
from .verdict import Verdict

__all__ = [
    "AnswerError", "Exercise", "Log", "Property", "Verdict", "assess", "choice", "close_to", "compare",
    "judge", "locally", "mismatch", "number", "on_ranks", "numbers_of", "observe", "pair", "solution_text",
    "summary", "unanswered", "unobserved", "whole_number",
]
