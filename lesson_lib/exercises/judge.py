"""The one way an exercise judges: the properties it teaches, each verified on what happened.

A :class:`Property` states in a sentence what must be true and tests it on what was observed (the
ranks' results, the :mod:`~lesson_lib.exercises.observe` log, the tensors handed in), from
:func:`on_ranks` or :func:`locally`. :func:`judge` runs the properties on each case in order; the
first failure gives the verdict, naming the case and what was observed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

from ..runtime import WorkerError, warm_cluster
from .verdict import Verdict


@dataclass(frozen=True)
class Property:
    says: str
    """What must hold, as the learner would read it."""
    test: Callable[[Any], str | None]
    """Given what was observed in one case: ``None`` if it holds, else what was seen instead."""


def judge(cases: Iterable[tuple[str, Callable[[], Any]]], properties: list[Property],
          done: str = "") -> Verdict:
    """Each case is ``(where, run)``: ``run()`` returns what was observed, or a :class:`Verdict`
    (the run itself failed: a deadlock, a rank's exception). Every property is checked on every case."""
    wheres = []
    for where, run in cases:
        observed = run()
        if isinstance(observed, Verdict):
            return observed
        for p in properties:
            problem = p.test(observed)
            if problem:
                return Verdict(False, f"{where}: {p.says} — but {problem}")
        wheres.append(where)
    held = "; ".join(p.says for p in properties)
    return Verdict(True, f"{held} ({', '.join(wheres)}){'. ' + done if done else ''}")


def on_ranks(where: str, world_size: int, job: Callable, *args: Any, timeout_s: float,
             then: Callable[[list], Any] | None = None,
             advice: Callable[[WorkerError], str] | None = None) -> tuple[str, Callable[[], Any]]:
    """A case for :func:`judge`: ``job(*args)`` on every rank of a warm cluster of ``world_size``,
    observed as the ranks' results (``then(results)`` if given). A rank that fails or a deadlock
    (the runtime's :class:`~lesson_lib.runtime.WorkerTimeout` says where each rank waits) is the
    verdict, naming the case, followed by ``advice(error)`` if given (what this exercise's learner
    most likely did: e.g. sends and receives that do not pair up)."""
    def run():
        try:
            outs = warm_cluster(world_size).run(job, *args, timeout_s=timeout_s)
        except WorkerError as e:
            more = advice(e) if advice else ""
            return Verdict(False, f"{where}: {type(e).__name__}: {e}" + (f"\n{more}" if more else ""))
        return outs if then is None else then(outs)
    return where, run


def locally(where: str, fn: Callable, *args: Any,
            then: Callable[[Any], Any] | None = None) -> tuple[str, Callable[[], Any]]:
    """A case for :func:`judge` that runs the learner's ``fn(*args)`` in this process (a formula, an
    optimizer step, a schedule): observed is what it returned (``then(returned)`` if given), or
    :class:`Verdict` naming the case when it raised."""
    def run():
        try:
            out = fn(*args)
        except Exception as e:  # a learner's function may raise: that is feedback, naming the case
            if "ellipsis" in str(e).lower():
                raise  # the template's ``...``: assess() says "not answered yet"
            return Verdict(False, f"{where}: your function raised {type(e).__name__}: {e}")
        return out if then is None else then(out)
    return where, run
