"""What a run raises in the notebook: a failed rank, a run past its deadline, an interrupt."""

from __future__ import annotations


class WorkerError(RuntimeError):
    """A worker failed; ``rank`` names it and ``remote_traceback`` carries its traceback."""

    unit = "rank"  # what the failed process is to the learner

    def __init__(self, rank: int, message: str, remote_traceback: str = "", others: tuple = ()):
        self.rank = rank
        self.remote_traceback = remote_traceback
        self.other_failed_ranks = tuple(others)
        unit = self.unit
        text = f"{unit} {rank}: {message}"
        if others:
            who = f"{unit} {others[0]}" if len(others) == 1 else f"{unit}s {', '.join(map(str, others))}"
            text += f" ({who} failed after it)"
        if remote_traceback:
            text += f"\n\n--- traceback from {unit} {rank} ---\n{remote_traceback}"
        super().__init__(text)

    def _render_traceback_(self) -> list[str]:
        # IPython shows this instead of a traceback through the runtime's polling loop: the
        # learner needs the rank and *its* traceback (which ends in their own cell), not ours.
        return [f"{type(self).__name__}: {self}"]


class ReplicaError(WorkerError):
    """A replica group's process raised (chapter 10's replicas, :mod:`.replicas`); ``rank``: the replica."""

    unit = "replica"


class WorkerTimeout(WorkerError):
    """A job outlived ``Cluster.run(..., timeout_s=...)``; the message says where each rank waited."""


class CollectiveMismatch(RuntimeError):
    """Raised on a rank whose collective call cannot pair up with a peer's (another op, size, dtype,
    root or split), before the call is made: Gloo would abort a rank instead (:mod:`.checked`). Or
    raised as a rank returns from its job while a peer waits on a call it never made."""


class WorkerMismatch(WorkerError):
    """What the notebook gets for a :class:`CollectiveMismatch`; ``waits``: a rank would have waited
    for a call never made (a deadlock named early), else two calls did not pair up."""

    def __init__(self, rank: int, message: str, remote_traceback: str = "", others: tuple = ()):
        super().__init__(rank, message, remote_traceback, others)
        self.waits = message.startswith(UNMATCHED)


UNMATCHED = "unmatched call on "  # how a CollectiveMismatch's message begins for a call a peer never makes


class RunInterrupted(KeyboardInterrupt):
    """The kernel was interrupted during a run; the workers were stopped (one line, no traceback)."""

    def _render_traceback_(self) -> list[str]:
        return [f"KeyboardInterrupt: {self}"]


MAIN_GUARD_HELP = (
    "the workers could not start: this script starts a Cluster (or a lesson_lib run) at import "
    "time. Every worker re-imports your script as it starts (spawned or forked by the fork server), so the "
    "code that starts them must sit under a guard:\n\n"
    "    if __name__ == \"__main__\":\n        main()   # everything that starts workers\n"
)
