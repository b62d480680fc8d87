"""Turning what the workers sent (or did not send) into one clear exception for the notebook.

Each function reads the parent's queue of :class:`~.messages.Message` and the worker processes,
and raises: :class:`WorkerError` naming the rank at the root of a failure, or
:class:`WorkerTimeout` saying where each rank still running was waiting.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import time

from . import output
from .diagnosis import is_collective_timeout, is_peer_fallout, relabel_cells, where
from .errors import MAIN_GUARD_HELP, WorkerError, WorkerMismatch, WorkerTimeout
from .messages import Kind

RAISED = ".CollectiveMismatch: "  # how a rank's traceback names an errors.CollectiveMismatch


def _show_output(msg) -> None:
    if msg.kind is Kind.OUTPUT:  # what a rank printed before it failed still reaches the cell
        output.show(msg.rank, *msg.data)


def _how(code: int) -> str:
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"


def check_alive(procs: list, pending: set, out_q, backend: str, guard_file: str | None,
                native=None, ledger=None) -> None:
    """Raise if a worker that still owes an answer has exited, quoting its last words below Python
    (``native``: :class:`~.output.NativeStderr`), such as Gloo's reason for an abort, and each rank's
    last collective call (``ledger``: :class:`~.ledger.Ledger`)."""
    for rank, p in enumerate(procs):
        if rank in pending and p.exitcode is not None:
            if guard_file and os.path.exists(guard_file):
                raise RuntimeError(MAIN_GUARD_HELP)
            # It may have sent its traceback just before exiting: read it first.
            try:
                while True:
                    msg = out_q.get(timeout=0.3)
                    _show_output(msg)
                    if msg.kind is Kind.ERROR:
                        raise_failure(procs, out_q, msg.rank, msg.data, ledger=ledger)
            except queue.Empty:
                pass
            code = p.exitcode
            how = (f"was killed by signal {signal.Signals(-code).name}" if code < 0
                   else f"exited with code {code}")
            if code == -signal.SIGABRT and backend == "gloo":
                how += (" (Gloo aborts a rank whose receive does not match what was sent to it: "
                        "a tensor of another size or dtype, or a message from another rank)")
            said = native.take(rank).strip() if native is not None else ""
            if said:
                lines = said.splitlines()[-4:]
                how += "; its last words: " + " | ".join(line.strip() for line in lines)[-600:]
            raise WorkerError(rank, f"worker process {how} while running a job" + _postmortem(ledger))


def raise_failure(procs: list, out_q, rank: int, tb: str, report=None, job_id: int = 0,
                  pending: set = frozenset(), ledger=None) -> None:
    """Gather the errors that arrive right after the first one and blame the root cause:
    the rank whose traceback is not just "my peer went away". When it is a collective that timed
    out, say which ranks never arrived (``pending``: those that had not finished the job) and where
    they were instead (``report``: see :func:`ask_stacks`); when a rank died, what each rank called
    last (``ledger``)."""
    errors = {rank: tb}
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        try:
            msg = out_q.get(timeout=0.05)
        except queue.Empty:
            continue
        _show_output(msg)
        if msg.kind is Kind.ERROR:
            errors[msg.rank] = msg.data
    roots = [r for r, t in errors.items() if not is_peer_fallout(t)]
    if not roots:
        # Everyone reports a lost peer: the root cause is a worker that died without a word.
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            dead = [(r, p.exitcode) for r, p in enumerate(procs)
                    if p.exitcode is not None and r not in errors]
            if dead:
                r, code = dead[0]
                raise WorkerError(r, f"worker process was killed ({_how(code)}) while running a job"
                                  + _postmortem(ledger), others=tuple(errors))
            time.sleep(0.05)
        roots = [rank]
    root = roots[0]
    tb = relabel_cells(errors[root])
    last = exception_line(tb)
    others = tuple(r for r in errors if r != root)
    if RAISED in tb:  # its message has several lines: both calls, then what to do
        raise WorkerMismatch(root, tb.rsplit(RAISED, 1)[1].strip(), tb, others=others)
    if job_id and is_collective_timeout(tb):
        last += _absent(out_q, report, job_id, [r for r in range(len(procs)) if r not in errors], pending)
    raise WorkerError(root, last, tb, others=others)


def exception_line(tb: str) -> str:
    """The traceback's exception, type and whole message on one line. A message may span lines
    (torch's "Expected parameter `tensor` of type torch.Tensor\n  but got <class 'NoneType'>"):
    its last line alone would lose what failed."""
    lines = tb.strip().splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if re.match(r"[A-Za-z_][\w.]*(: |:?$)", lines[i]):  # the exception's first line, unindented
            return " ".join(part.strip() for part in lines[i:] if part.strip())
    return lines[-1].strip() if lines else "failed"


def _postmortem(ledger) -> str:
    """Each rank's last collective call, after a rank died (Gloo aborts on a mismatched receive)."""
    said = ledger.postmortem() if ledger is not None else ""
    return relabel_cells("\nwhat each rank called last:" + said) if said else ""


def _absent(out_q, report, job_id: int, others: list[int], pending: set) -> str:
    """Where the ranks that did not fail were while the root rank's collective waited for them: a
    barrier on rank 0 alone ended in Gloo's bare "Timed out waiting 30000ms for recv"."""
    busy = [r for r in others if r in pending]
    stacks = ask_stacks(out_q, report, job_id, set(busy)) if busy else {}
    lines = [f"rank {r} never arrived: it had returned from the function without making the matching "
             "call (is it called on some ranks only?)" for r in others if r not in pending]
    lines += [f"rank {r} never arrived: it was " + (where(stacks[r]) if r in stacks else "still running")
              for r in busy]
    return "".join(f"\n  {line}" for line in lines)


def ask_stacks(out_q, report, job_id: int, ranks: set, patience_s: float = 10.0,
               straggle_s: float = 2.0) -> dict[int, list]:
    """Ask the ranks of a running job where they are; the frames of those in ``ranks`` that answered,
    by rank. What else arrives meanwhile is dropped, but for what the ranks printed: call it on the
    way to an error.

    How long to wait: the ranks' answering threads wake every 0.1 s, but on a machine loaded far
    beyond its cores (a workshop server, CI) none may be scheduled for seconds. So wait up to
    ``patience_s`` for the first answer, then ``straggle_s`` more for the rest (a rank stuck in
    native code that holds the GIL never answers)."""
    stacks: dict[int, list] = {}
    if report is None:
        return stacks
    report.value += 1  # each worker's _report_stacks thread answers
    end = time.monotonic() + patience_s
    while time.monotonic() < end and not ranks <= stacks.keys():
        try:
            msg = out_q.get(timeout=0.05)
        except queue.Empty:
            continue
        _show_output(msg)
        if msg.kind is Kind.STACK and msg.job == job_id:
            if not stacks:
                end = min(end, time.monotonic() + straggle_s)
            stacks[msg.rank] = msg.data
    return stacks


def raise_timeout(out_q, report, job_id: int, pending: set, timeout_s: float | None,
                  loading: set = frozenset()) -> None:
    """Ask the ranks still running where they are, then raise :class:`WorkerTimeout`. ``loading``:
    the ranks that had not yet loaded the job's function (unpickled it, imported its modules)."""
    if loading:
        ranks = sorted(loading)
        raise WorkerTimeout(ranks[0], f"ranks {ranks} were still loading the function (unpickling it, "
                            "importing the modules it needs) when the time ran out: is a module it "
                            "imports slow or stuck at import?", others=())
    stacks = ask_stacks(out_q, report, job_id, pending) if job_id else {}
    limit = f"within timeout_s={timeout_s:g} s" if timeout_s else "before the deadline"
    waiting = sorted(pending)
    # a rank inside a library call (a collective) waits for a peer; one running its own lines computes
    blocked = [r for r in waiting if r in stacks and where(stacks[r]).startswith("waiting in ")]
    busy = [r for r in waiting if r in stacks and r not in blocked]
    if not stacks:
        why = ""
    elif not busy:
        why = (" — waiting for each other? (a send or recv with no partner, or a collective "
               "that not every rank called, waits forever)")
    elif not blocked:
        why = (" — busy running their own lines, not waiting for each other: a loop that never ends, "
               "or more work than the timeout allows?")
    else:
        why = (f" — ranks {blocked} waited in a library call for ranks {busy}, which were still "
               "running their own lines (a loop that never ends there?)")
    lines = [f"did not finish {limit}: ranks {waiting} were still running" + why]
    lines += [f"  rank {r}: {where(stacks[r])}" for r in waiting if r in stacks]
    raise WorkerTimeout(waiting[0], "\n".join(lines), others=())
