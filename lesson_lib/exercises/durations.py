"""Durations in every form a learner writes them (:func:`duration`), and the hint for a number given
in another unit than the one asked (:func:`duration_slip`).

Accepted: a number (taken in the asked unit), a ``datetime.timedelta``, a text with its unit
(``"5135 s"``, ``"34 days"``, ``"4.86 weeks"``, ``"250 ms"``), several parts (``"1h25m35s"``,
``"1 h 25 min 35 s"``, ``"1 day, 2 hours"``), a clock ``"1:25:35"`` (h:mm:ss), or a dict or dataclass
with one field named for its unit (``{"days": 34}``).
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from typing import Any

from .answers import AnswerError, _key, compare, number, shown

UNITS = {"ms": 1e-3, "msec": 1e-3, "millisecond": 1e-3, "milliseconds": 1e-3,
         "s": 1.0, "sec": 1.0, "second": 1.0, "seconds": 1.0, "secs": 1.0, "min": 60.0, "mins": 60.0,
         "m": 60.0, "minute": 60.0, "minutes": 60.0, "h": 3600.0, "hr": 3600.0, "hrs": 3600.0,
         "hour": 3600.0, "hours": 3600.0, "d": 86400.0, "day": 86400.0, "days": 86400.0,
         "w": 604800.0, "wk": 604800.0, "wks": 604800.0, "week": 604800.0, "weeks": 604800.0}
NAMES = {1e-3: "milliseconds", 1.0: "seconds", 60.0: "minutes", 3600.0: "hours", 86400.0: "days",
         604800.0: "weeks"}
_PART = re.compile(r"([-+]?\d[\d_.,/]*(?:[eE][-+]?\d+)?)\s*([a-zA-Z]+)")
_CLOCK = re.compile(r"\s*(\d+):([0-5]\d):([0-5]\d(?:\.\d*)?)\s*")


def _parts(text: str, what: str) -> float | None:
    """Seconds in ``"1h25m"``, ``"1 h 25 min 35 s"``, ``"1 day, 2 hours"``; None if not of that form."""
    pieces = list(_PART.finditer(text))
    rest = _PART.sub("", text).replace(",", " ").replace(" and ", " ").strip()
    if not pieces or rest or any(m.group(2).lower() not in UNITS for m in pieces):
        return None
    return sum(number(m.group(1), what) * UNITS[m.group(2).lower()] for m in pieces)


def duration(answer: Any, unit: str, what: str) -> float:
    """A duration in ``unit`` (a key of :data:`UNITS`), from any form the module docstring lists."""
    per = UNITS[unit]
    value = answer
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, dict) and len(value) == 1:
        (key, inner), = value.items()
        if _key(key) in UNITS:
            return number(inner, what) * UNITS[_key(key)] / per
        return duration(inner, unit, what)
    if isinstance(value, datetime.timedelta):
        return value.total_seconds() / per
    if isinstance(value, str):
        if m := _CLOCK.fullmatch(value):
            return (int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))) / per
        if re.fullmatch(r"\s*\d+:\d+(\.\d*)?\s*", value):
            raise AnswerError(f"you gave {value!r}: hours and minutes, or minutes and seconds? The answer is "
                              f"{what}; write it with units (\"1 h 25 min\") or as h:mm:ss")
        seconds = _parts(value, what)
        if seconds is not None:
            return seconds / per
    return number(value, what)


def duration_slip(value: float, expected: float, unit: str, rel: float = 0.02) -> str | None:
    """For a bare number that is right in another unit than ``unit``: which unit it reads as."""
    for per, name in NAMES.items():
        if per != UNITS[unit] and compare(value * per / UNITS[unit], expected, rel):
            asked = NAMES[UNITS[unit]]
            return (f"{shown(value)} {name} would be right, but a bare number is read in {asked}: "
                    f"convert it, or write its unit (\"{shown(value)} {name}\")")
    return None
