"""Whether a learner's answer calls lesson_lib's own implementation of the thing an exercise asks for
(``def my_cast(x): return scaling.quantize(x)``), judged from what happened when it ran.

:func:`watched` hands the checker the answer wrapped so that, while the learner's function (or an
autograd Function's ``forward``/``backward``) runs, in this process or on a rank, a profile hook
notes every call of an asked function made from the learner's own code (in threads it starts too):
the nearest caller that is neither torch's nor Python's own. The checker's calls, and the helpers a
prompt tells learners to use (lesson_lib code calling the asked function inside), do not count.
What was noted is written to a file the parent reads back (:meth:`Record.seen`), so a rank's call
reaches the verdict too.
"""

from __future__ import annotations

import functools
import inspect
import os
import site
import sys
import sysconfig
import tempfile
import threading
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .verdict import Verdict

_LIB = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # lesson_lib/


def _third_party_dirs() -> tuple[str, ...]:
    """Where Python's and installed packages' code lives (torch, functools): not the learner's."""
    dirs = {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    try:
        dirs |= set(site.getsitepackages()) | {site.getusersitepackages()}
    except AttributeError:  # a virtualenv's old site module
        pass
    return tuple(os.path.abspath(d) + os.sep for d in dirs if d)


_THIRD = _third_party_dirs()


@dataclass(frozen=True)
class Asked:
    """One function an exercise asks for, as a rank can recognise its code: by name, file and line."""

    name: str
    filename: str
    line: int
    label: str  # "scaling.quantize", as the verdict names it


def asked_of(fn: Any) -> list[Asked]:
    """The code of ``fn`` (a function, or the functions a class defines itself: an autograd
    Function's ``forward`` and ``backward``), as :class:`Asked` entries."""
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.isclass(fn):
        return [a for v in vars(fn).values() if inspect.isfunction(getattr(v, "__func__", v))
                for a in asked_of(v)]
    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    module = (getattr(fn, "__module__", None) or "").rsplit(".", 1)[-1]
    qualname = getattr(fn, "__qualname__", code.co_name).split("<locals>.")[-1]
    return [Asked(code.co_name, os.path.abspath(code.co_filename), code.co_firstlineno,
                  f"{module}.{qualname}")]


_OBSERVE = os.path.join(_LIB, "exercises", "observe.py")  # its ``recorded`` wrappers pass calls through


def _from_learner(frame) -> bool:
    """Whether the nearest caller of ``frame`` that is not torch's or Python's (nor :mod:`.observe`'s
    recording wrapper around ``comm``'s functions) is the learner's."""
    frame = frame.f_back
    while frame is not None:
        path = frame.f_code.co_filename
        if path == _OBSERVE and frame.f_code.co_name == "recorded":
            frame = frame.f_back
            continue
        if path.startswith(_LIB):
            return False
        if not (path.startswith(_THIRD) or path.startswith("<frozen")):
            return True
        frame = frame.f_back
    return False


class Record:
    """Where the asked functions the learner called are noted, one label a line (a file, so that
    every rank writes to the same place)."""

    def __init__(self):
        fd, self.path = tempfile.mkstemp(prefix="lesson_lib_asked_", suffix=".txt")
        os.close(fd)

    def seen(self) -> list[str]:
        try:
            with open(self.path) as f:
                return list(dict.fromkeys(line.strip() for line in f if line.strip()))
        except OSError:
            return []

    def close(self) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass


class _Watch:
    """The learner's function, called with the profile hook on; everything else reads through to it
    (``__code__``, ``__name__``, its signature), so the checker sees the learner's function."""

    def __init__(self, fn: Callable, asked: tuple, path: str):
        functools.update_wrapper(self, fn)
        self._fn, self._asked, self._path = fn, asked, path

    def __getattr__(self, name):
        fn = self.__dict__.get("_fn")
        if fn is None:
            raise AttributeError(name)
        return getattr(fn, name)

    def __call__(self, *args, **kwargs):
        by_name = {}
        for a in self._asked:
            by_name.setdefault(a.name, []).append(a)
        before, noted = sys.getprofile(), set()

        def hook(frame, event, arg):
            if event == "call":
                code = frame.f_code
                for a in by_name.get(code.co_name, ()):
                    if code.co_firstlineno == a.line and os.path.abspath(code.co_filename) == a.filename \
                            and a.label not in noted and _from_learner(frame):
                        noted.add(a.label)
                        with open(self._path, "a") as f:
                            f.write(a.label + "\n")
            if callable(before):
                before(frame, event, arg)

        sys.setprofile(hook)
        threads = threading.getprofile()
        threading.setprofile(hook)  # and in the threads the answer starts (a pool's, its own)
        try:
            return self._fn(*args, **kwargs)
        finally:
            threading.setprofile(threads)
            sys.setprofile(before)


def unwatched(fn: Any) -> Any:
    """The learner's function itself, for a checker that times it: the profile hook costs microseconds
    a call (chapter 7's ping-pong watches its checked round trips, and times the others unwatched)."""
    return fn._fn if isinstance(fn, _Watch) else fn


def watched(answer: Any, asked: list[Asked], record: Record) -> Any:
    """``answer`` as the checker should receive it: a function wrapped (:class:`_Watch`), an autograd
    Function subclassed with its ``forward`` and ``backward`` wrapped; anything else as it is."""
    if not asked or not callable(answer):
        return answer
    asked = tuple(asked)
    if inspect.isclass(answer):
        if not issubclass(answer, torch.autograd.Function):
            return answer
        body = {m: staticmethod(_Watch(getattr(answer, m), asked, record.path))
                for m in ("forward", "backward") if callable(getattr(answer, m, None))}
        body.update(__module__=answer.__module__, __qualname__=answer.__qualname__, __doc__=answer.__doc__)
        return type(answer.__name__, (answer,), body)
    return _Watch(answer, asked, record.path)


def inherited(answer: Any, asked: list[Asked]) -> str | None:
    """The asked function a class answer takes as its own method (subclassing the library's, or
    ``forward = theirs.forward``): torch calls it, never the learner's code, so no hook sees it."""
    if not inspect.isclass(answer):
        return None
    mine = {(a.name, a.filename, a.line): a.label for a in asked}
    for m in ("forward", "backward", "setup_context", "__call__"):
        method = getattr(answer, m, None)
        for a in asked_of(method) if inspect.isfunction(method) else ():
            if (a.name, a.filename, a.line) in mine:
                return mine[(a.name, a.filename, a.line)]
    return None


def borrowed_verdict(label: str) -> Verdict:
    return Verdict(False, f"your answer calls lesson_lib's own {label}, the thing this exercise asks you "
                          "to write: write it yourself")
