"""A job that has said nothing for a while: one line saying which ranks are busy, and where.

Past :data:`SILENCE_S` without a message, the parent asks the running ranks for their stacks
(:func:`~.worker._report_stacks`) :data:`SAMPLES` times, a moment apart. If a rank's stack changed
between them the job is making progress (a long computation that emits nothing): no word, and the
watch starts again. If every sample is the same (a deadlock, a spinning loop), it prints, once per
job, where each rank is and how to stop it, while it goes on reading the job's messages.
"""

from __future__ import annotations

import time

from .diagnosis import where
from .messages import Kind

SILENCE_S = 20.0  # seconds without a word from any rank before the notice
ANSWER_S = 1.5  # how long the ranks have to say where they are
SAMPLES = 3  # stacks compared before speaking: any change means the job is moving
APART_S = 1.0  # between two samples (a quarter of SILENCE_S when that is shorter)


class Silence:
    """Watches one job's messages (:meth:`heard`) and speaks up once (:meth:`tick`)."""

    def __init__(self, report, job_id: int, what: str):
        self.report, self.job_id, self.what = report, job_id, what
        self.after_s = SILENCE_S
        self.last = time.monotonic()
        self.asked: float | None = None
        self.said = False
        self.stacks: dict[int, list] = {}
        self.samples: list[dict[int, tuple]] = []  # each rank's stack, per sample
        self.asked_at = 0.0

    def heard(self, msg) -> None:
        if msg.kind is Kind.STACK:
            if msg.job == self.job_id:
                self.stacks[msg.rank] = msg.data
        else:
            self.last = time.monotonic()
            self.samples.clear()

    def tick(self, pending: set) -> None:
        if self.said or self.report is None or not pending:
            return
        now = time.monotonic()
        if self.asked is None:
            apart = min(APART_S, self.after_s / 4)
            due = self.asked_at + apart if self.samples else self.last + self.after_s
            if now >= due:
                self.asked = self.asked_at = now
                self.stacks = {}
                self.report.value += 1  # each worker's _report_stacks thread answers
            return
        if not (pending <= self.stacks.keys() or now - self.asked > ANSWER_S):
            return
        self.asked = None
        self.samples.append({r: tuple(map(tuple, self.stacks[r])) for r in pending if r in self.stacks})
        first = self.samples[0]
        if any(s[r] != first[r] for s in self.samples[1:] for r in s.keys() & first.keys()):  # moved
            self.last, self.samples = now, []
        elif len(self.samples) >= SAMPLES:
            self.said = True
            print(notice(self.what, now - self.last, sorted(pending), self.stacks), flush=True)


def notice(what: str, quiet_s: float, busy: list[int], stacks: dict[int, list]) -> str:
    ranks = f"rank {busy[0]}" if len(busy) == 1 else f"ranks {', '.join(map(str, busy))}"
    where_ = "; ".join(f"rank {r}: {where(stacks[r])}" for r in busy if r in stacks)
    return (f"lesson_lib: {what} has sent nothing for {quiet_s:.0f} s; {ranks} still busy"
            + (f" ({where_})" if where_ else "")
            + ". It may still be working; to stop it, interrupt the kernel (the ■ button, or Ctrl-C), "
              "or bound the run with run(..., timeout_s=...).")
