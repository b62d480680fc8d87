"""One reading of a learner's answer for every exercise: :func:`number` and :func:`whole_number`.

Accepted: ``int``, ``float``, ``Fraction``, ``Decimal``, numpy scalars, one-element tensors, and
numeric strings (``"1.5e6"``, ``"1_000_000"``, ``"1,000,000"``, a fraction ``"3/11"``); not bools.
A whole number may be ``2.0``. Anything else raises :class:`AnswerError` with a message saying
what is expected.
:func:`compare` is the one tolerance test, :func:`mismatch` the one message for a wrong number.
"""

from __future__ import annotations

import decimal
import math
import numbers
import re
from typing import Any

from .verdict import Verdict

_THOUSANDS = re.compile(r"[-+]?\d{1,3}(,\d{3})+(\.\d*)?([eE][-+]?\d+)?")
_FRACTION = re.compile(r"([-+]?\d+(?:\.\d*)?)\s*/\s*(\d+(?:\.\d*)?)")


class AnswerError(ValueError):
    """An answer in a form no exercise reads; the message is the verdict shown to the learner."""


def _describe(answer: Any) -> str:
    if isinstance(answer, str):
        return f"the text {answer!r}"
    shape = getattr(answer, "shape", None)
    if shape is not None:
        return f"a {type(answer).__name__} of shape {tuple(shape)}"
    return f"a {type(answer).__name__}"


def number(answer: Any, what: str = "a number") -> float:
    """``answer`` as a finite float, from any of the forms the module docstring lists."""
    value = answer
    if isinstance(value, bool):
        raise AnswerError(f"you gave {value}, a truth value; the answer is {what}")
    if isinstance(value, str):
        text = value.strip().replace("_", "")
        if "," in text:  # thousands separators only: "1,5" is refused, never read as 15
            if not _THOUSANDS.fullmatch(text):
                raise AnswerError(f"you gave {_describe(answer)}; the answer is {what}, written with a point "
                                  "for decimals (commas only between thousands, as in 1,000,000)")
            text = text.replace(",", "")
        fraction = _FRACTION.fullmatch(text)
        if fraction and float(fraction.group(2)) == 0:
            raise AnswerError(f"you gave {_describe(answer)}, a division by zero; the answer is {what}")
        try:
            value = float(fraction.group(1)) / float(fraction.group(2)) if fraction else float(text)
        except ValueError:
            raise AnswerError(f"you gave {_describe(answer)}, which does not read as a number; "
                              f"the answer is {what}") from None
    elif isinstance(value, decimal.Decimal):
        value = float(value)
    elif not isinstance(value, numbers.Real):
        numel = getattr(value, "numel", None) or getattr(value, "size", None)
        numel = numel() if callable(numel) else numel
        if numel == 1 and hasattr(value, "item"):  # torch tensors and numpy arrays of one element
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise AnswerError(f"you gave {_describe(answer)}; the answer is {what} (one value)")
    value = float(value)
    if not math.isfinite(value):
        raise AnswerError(f"you gave {value}; the answer is {what}, a finite one")
    return value


def whole_number(answer: Any, what: str = "a whole number") -> int:
    """``answer`` as an int; ``2.0`` and ``"2"`` are 2, ``2.5`` is refused."""
    value = number(answer, what)
    if value != int(value):
        raise AnswerError(f"you gave {value:g}; the answer is {what}")
    return int(value)


def numbers_of(answer: Any, count: int, what: str) -> list[float]:
    """A tuple or list of ``count`` numbers, each read by :func:`number`."""
    if isinstance(answer, str) or not hasattr(answer, "__len__") or len(answer) != count:
        raise AnswerError(f"you gave {_describe(answer)}; the answer is {what} ({count} values, "
                          f"e.g. a tuple)")
    return [number(a, what) for a in answer]


def choice(answer: Any, options, what: str = "one letter") -> str:
    """One of ``options`` (letters or words), read from ``"b"``, ``"B"``, ``"(b)"``, ``"b)"``, ``"b."``."""
    key = str(answer).strip().strip("().:").strip().lower() if isinstance(answer, str) else None
    if key not in options:
        raise AnswerError(f"you gave {_describe(answer)}; answer with {what} of {', '.join(options)}")
    return key


def compare(value: float, expected: float, rel: float = 0.0, abs_: float = 0.0) -> bool:
    """Within ``rel`` of ``expected`` (relative) or ``abs_`` (absolute), whichever is looser; a
    tolerance of a millionth always, so that float rounding and floor division are never "wrong"."""
    tol = max(rel * abs(expected), abs_, 1e-6 * abs(expected), 1e-12)
    return abs(value - expected) <= tol


def pair(value: float, expected: float) -> tuple[str, str]:
    """Both numbers printed with as many significant digits as it takes to tell them apart (at
    least 4, at most 17)."""
    for digits in range(4, 18):
        a, b = f"{value:.{digits}g}", f"{expected:.{digits}g}"
        if a != b:
            return a, b
    return repr(value), repr(expected)


def shown(value: float) -> str:
    """``value`` as the learner typed it: the fewest significant digits (at least 6) that give the
    same float back, with thousands separators — 354,624.4 stays 354,624.4, never 354624."""
    for digits in range(6, 18):
        text = f"{value:,.{digits}g}"
        if float(text.replace(",", "")) == value:
            return text
    return repr(value)


def mismatch(value: float, expected: float, unit: str = "", rel: float = 0.0, said: str = "you said") -> str:
    """"you said …; expected … (within …)", never two equal-looking numbers. For a function's
    result on a given input (``said="ring_bytes(4, 1e6) returned"``); a direct answer's expected
    value is not printed (that would give it away): use :func:`close_to`."""
    a, b = pair(value, expected)
    within = f" (within {rel:.0%})" if rel >= 0.01 else (f" (within {rel:.0e} relative)" if rel else "")
    return f"{said} {a}{unit}; expected {b}{unit}{within}"


def close_to(expected: float, rel: float = 0.01, unit: str = "", hint: str = "check your formula",
             what: str = "a number"):
    """A check that a number (in any form :func:`number` reads) is within ``rel`` of ``expected``."""
    def check(answer: Any) -> Verdict:
        value = number(answer, what)
        ok = compare(value, expected, rel)
        return Verdict(ok, f"you said {shown(value)}{unit}" + ("" if ok else f"; {hint}"))

    return check
