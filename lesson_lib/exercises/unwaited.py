"""Handles a learner's code never waited for: ``dist.all_reduce(t, async_op=True)``, ``dist.isend``...
whose ``wait()`` was never called. The result may or may not have arrived when the code read it
(Gloo's small messages often have), so the numbers alone mislead; the :class:`~.observe.Log` says.

:func:`drain` is called by a job once the learner's code has returned: it waits for the work left
pending, so that a warm cluster's next job does not meet it (an unwaited Gloo send or receive stalls
the next collective), and leaves the log as the learner's code left it. :func:`never_waited` says it.
"""

from __future__ import annotations

import time
from datetime import timedelta

from .observe import Log

_HANDED = ("dist.isend", "dist.irecv", "dist.batch_isend_irecv")  # asynchronous by their nature


def drain(log: Log, timeout_s: float = 5.0) -> None:
    """Wait here for the work of every handle not waited for yet; one waited for through its future
    counts as waited (as :meth:`Log.mark` with ``settle``), the others stay ``done: None`` in the log."""
    now = time.perf_counter()
    for h in log.handles:
        h.settle(now)
    end = now + timeout_s
    for h in log.handles:
        if all(c["done"] is not None for c in h._calls):
            continue  # waited for already: a second wait on a Gloo send or receive waits for another
        try:
            h._inner.wait(timedelta(seconds=max(0.1, end - time.perf_counter())))
        except Exception:  # a receive with no partner: the learner's mistake, said by the checkers
            pass


def never_waited(calls: list[dict]) -> str | None:
    """What to tell a learner whose handle was never waited for, from :func:`drain`'s log; else None.
    Functional collectives wait for themselves when their result is used: not counted."""
    for c in calls:
        if c["async"] and c["done"] is None and not c["api"].startswith("funcol."):
            how = "with async_op=True" if c["api"].startswith(("dist.", "ProcessGroup.")) \
                and c["api"] not in _HANDED else f"by {c['api']}"
            then = "before the function returns" if c["op"] == "send" else "before reading the result"
            return (f"the {c['op'].replace('_', '-')} was started {how} but its work was never waited: "
                    f"call .wait() {then}")
    return None


__all__ = ["drain", "never_waited"]
