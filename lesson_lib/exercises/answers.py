"""One reading of a learner's answer for every exercise: :func:`number` and :func:`whole_number`.

Accepted: ``int``, ``float``, ``Fraction``, ``Decimal``, numpy scalars, one-element tensors, and
numeric strings (``"1.5e6"``, ``"1_000_000"``, ``"1,000,000"``, a fraction ``"3/11"``); not bools.
A whole number may be ``2.0``. Several values (:func:`values_of`, :func:`numbers_of`): any sequence,
``"2,2,2"``, or a dict or dataclass keyed by name (durations: :mod:`.durations`). Anything else
raises :class:`AnswerError` with a message saying what is expected.
:func:`compare` is the one tolerance test, :func:`mismatch` the one message for a wrong number.
"""

from __future__ import annotations

import dataclasses
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
        if text.endswith("%") and len(text) > 1:  # "27.27%": a percentage is a fraction (0.2727)
            return number(text[:-1], what) / 100
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
    try:
        value = float(value)
    except OverflowError:  # an int past float's range (a reviewer's 10**400)
        raise AnswerError(f"you gave a number of {len(str(abs(int(value))))} digits, beyond any float; "
                          f"the answer is {what}") from None
    if not math.isfinite(value):
        raise AnswerError(f"you gave {value}; the answer is {what}, a finite one")
    return value


def whole_number(answer: Any, what: str = "a whole number") -> int:
    """``answer`` as an int; ``2.0`` and ``"2"`` are 2, ``2.5`` is refused."""
    value = number(answer, what)
    if value != int(value):  # repr, not :g: 28.000001 shown as 28 told a reviewer 28 was not whole
        raise AnswerError(f"you gave {value!r}, not a whole number; the answer is {what}")
    return int(value)


_STAGE = re.compile(r"\s*(?:zero)?[\s\-_]*(?:stage)?[\s\-_]*(\d+)\s*", re.IGNORECASE)


def stage(answer: Any, what: str = "a ZeRO stage: 0, 1, 2 or 3") -> int:
    """A ZeRO stage as a whole number: 2, "2", "stage 2", "ZeRO-2" or "zero stage 2"."""
    if isinstance(answer, str) and (m := _STAGE.fullmatch(answer)):
        answer = m.group(1)
    return whole_number(answer, what)


def _key(name: Any) -> str:
    return re.sub(r"[\s\-]+", "_", str(name).strip().lower())


def values_of(answer: Any, count: int, what: str, names=()) -> list:
    """``count`` values in the order the exercise asks for them, from any sequence (tuple, list, a
    tensor or array), a text of comma-separated values (``"2,2,2"``), a dict or a dataclass keyed
    by ``names`` (one tuple of accepted keys per position, ``(("lr", "learning_rate"), ...)``, in any
    order). The values themselves are not read here: :func:`numbers_of` reads them as numbers."""
    value = answer
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        if names:
            keys = {_key(k): v for k, v in value.items()}
            picked = [next((keys[_key(n)] for n in options if _key(n) in keys), None) for options in names]
            if len(value) == count and all(p is not None for p in picked):
                return picked
            said = ", ".join(repr(k) for k in value)
            raise AnswerError(f"you gave a dict with keys {said}; the answer is {what}, keyed "
                              + ", ".join(repr(options[0]) for options in names) + " (or as a tuple)")
        if len(value) == count:  # keys of the learner's choosing, in the order written
            return list(value.values())
    if isinstance(value, str):
        parts = [p.strip() for p in value.strip().strip("()[]").split(",")]
        if count > 1 and len(parts) == count and all(parts):
            return parts
    elif hasattr(value, "tolist") and getattr(value, "ndim", 1) == 1:  # a tensor or an array
        value = value.tolist()
    if isinstance(value, str) or not hasattr(value, "__len__") or len(value) != count:
        raise AnswerError(f"you gave {_describe(answer)}; the answer is {what} ({count} values, "
                          f"e.g. a tuple)")
    return list(value)


def numbers_of(answer: Any, count: int, what: str, names=()) -> list[float]:
    """``count`` numbers in any form :func:`values_of` reads, each read by :func:`number`."""
    return [number(a, what) for a in values_of(answer, count, what, names)]


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


def fixed(value: float, digits: int) -> str:
    """``value`` to ``digits`` significant digits, thousands separated, without an exponent for any
    magnitude a learner types (2,238,570 bytes, never 2.23857e+06) and no trailing zeros."""
    if value == 0 or not math.isfinite(value) or not 1e-4 <= abs(value) < 1e16:
        return f"{value:.{digits}g}"
    decimals = digits - 1 - math.floor(math.log10(abs(value)))
    text = f"{round(value, decimals):,.{max(decimals, 0)}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def pair(value: float, expected: float) -> tuple[str, str]:
    """Both numbers printed with as many significant digits as it takes to tell them apart (at
    least 4, at most 17), written as :func:`fixed` writes them."""
    for digits in range(4, 18):
        a, b = fixed(value, digits), fixed(expected, digits)
        if a != b:
            return a, b
    return repr(value), repr(expected)


def shown(value: float) -> str:
    """``value`` as the learner typed it: the fewest significant digits (at least 6, at most 10) that
    give the same float back, thousands separated — 354,624.4 stays 354,624.4, never 354624. A computed
    float that needs more (559,642.5912137006) is shown to two decimals (559,642.59)."""
    for digits in range(6, 11):
        text = fixed(value, digits)
        if float(text.replace(",", "")) == value:
            return text
    if value == 0 or not math.isfinite(value):
        return repr(value)
    return fixed(value, max(6, math.floor(math.log10(abs(value))) + 3))


def mismatch(value: float, expected: float, unit: str = "", rel: float = 0.0, said: str = "you said") -> str:
    """"you said …; expected … (within …)", never two equal-looking numbers. For a function's
    result on a given input (``said="ring_bytes(4, 1e6) returned"``); a direct answer's expected
    value is not printed (that would give it away): use :func:`close_to`."""
    a, b = pair(value, expected)
    within = f" (within {rel:.0%})" if rel >= 0.01 else (f" (within {rel:.0e} relative)" if rel else "")
    return f"{said} {a}{unit}; expected {b}{unit}{within}"


_PREFIXES = ((1e3, "kB"), (1e6, "MB"), (1e9, "GB"), (2**10, "KiB"), (2**20, "MiB"), (2**30, "GiB"))


def unit_slip(value: float, expected: float, unit: str) -> str | None:
    """For an answer in bytes: the prefix it was written in, when that alone makes it wrong."""
    if "byte" not in unit:
        return None
    for factor, prefix in _PREFIXES:
        if compare(value * factor, expected, 1e-3):
            return f"that reads as {prefix} (× {factor:,.0f}); the question asks for{unit}"
    return None


BYTE_UNITS = {"b": 1, "byte": 1, "bytes": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
              "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_WITH_UNIT = re.compile(r"\s*(.*?\d\.?)\s*([a-zA-Z]+)\s*")


def byte_count(answer: Any, what: str = "a number of bytes") -> float:
    """A number of bytes: any form :func:`number` reads, or a text with its unit ("354,624 bytes",
    "354.6 kB", "1.5 MiB"; kB = 1,000 bytes, KiB = 1,024)."""
    if isinstance(answer, str):
        m = _WITH_UNIT.fullmatch(answer)
        if m and m.group(2).lower() in BYTE_UNITS:
            return number(m.group(1), what) * BYTE_UNITS[m.group(2).lower()]
    return number(answer, what)


def close_to(expected: float, rel: float = 0.01, unit: str = "", hint: str = "check your formula",
             what: str = "a number"):
    """A check that a number (in any form :func:`number` reads; with a unit of bytes when ``unit`` is
    bytes, :func:`byte_count`) is within ``rel`` of ``expected``."""
    def check(answer: Any) -> Verdict:
        value = byte_count(answer, what) if unit.strip() == "bytes" else number(answer, what)
        ok = compare(value, expected, rel)
        why = "" if ok else f"; {unit_slip(value, expected, unit) or hint}"
        return Verdict(ok, f"you said {shown(value)}{unit}{why}")

    return check
