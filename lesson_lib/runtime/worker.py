"""A worker process: join the process group, then run jobs until told to stop.

Workers ignore SIGINT (the parent decides), exit when their parent disappears, and answer with
:class:`~.messages.Message`. A thread of each worker reports where its main thread is when the
parent asks (a job that overran its deadline).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from . import checked, folders, hygiene, output
from .diagnosis import format_exception, user_frames
from .messages import Kind, Message
from .pickling import unpack_job
from .placement import oversubscribed


@dataclass
class WorkerContext:
    """What a worker function may ask for: ``lesson_lib.runtime.context()`` inside a rank."""

    rank: int
    world_size: int
    backend: str
    device: torch.device
    timeout_s: float
    threads: int
    oversubscribed: bool
    events: Any = None  # a queue (Cluster) or None (torchrun: events are dropped)
    restart_requested: bool = False
    _batched: list = field(default_factory=list)  # events of emit(..., batched=True) not sent yet
    _sent_at: float = 0.0

    def request_restart(self) -> None:
        """Ask for fresh workers after this job (e.g. a fault demo left the process group unusable);
        the job still returns normally."""
        self.restart_requested = True

    def emit(self, kind: str, batched: bool = False, **data: Any) -> None:
        """Send a small event (floats, ints, strings) to the notebook while the job runs.

        ``batched``: it may wait up to :data:`BATCH_S` and travel with others, in order (one message
        per step's record would cost a sizeable share of a short step's CPU). Unbatched events, the
        job's end or an exception send everything waiting.
        """
        if self.events is None:
            return
        event = {"kind": kind, "rank": self.rank, **data}
        if batched:
            self._batched.append(event)
            if time.monotonic() - self._sent_at >= BATCH_S:
                self.flush_events()
            return
        self.flush_events()
        self.events.put(Message(Kind.EVENT, self.rank, None, event))

    def flush_events(self) -> None:
        """Send the events that wait (see :meth:`emit`)."""
        self._sent_at = time.monotonic()
        if self._batched and self.events is not None:
            batch, self._batched = self._batched, []
            self.events.put(Message(Kind.EVENTS, self.rank, None, batch))


BATCH_S = 0.1


_CTX: WorkerContext | None = None


def context() -> WorkerContext:
    """The calling rank's context; only valid inside a function run by a cluster."""
    if _CTX is None:
        raise RuntimeError(
            "lesson_lib.runtime.context() is only available inside a function run by "
            "Cluster.run (or under torchrun); the notebook kernel is not a rank"
        )
    return _CTX


def refuse_inside_a_rank() -> None:
    """Raise a clear error in a :class:`~.cluster.Cluster`'s (daemonic) worker, which cannot have children."""
    if _CTX is not None and _CTX.events is not None:  # under torchrun (no events) a process may
        raise RuntimeError(
            f"a Cluster cannot be started from inside a rank: this code runs on rank {_CTX.rank}, a "
            "worker process, which cannot start worker processes of its own. Call Cluster.run (or an "
            "experiment's run) from the notebook or the script, with the function every rank runs; "
            "inside that function, use the ranks it runs on (lesson_lib.runtime.context()).")


def set_context(ctx: WorkerContext | None) -> None:
    """This process's rank context (a worker's, or a torchrun process's)."""
    global _CTX
    _CTX = ctx


def _watch_parent(alive: Any, parent_pid: int, folder: str) -> None:
    """Exit when the kernel dies. ``alive``: the read end of a pipe only the kernel can write, which
    reads EOF the moment it dies, even as an unreaped zombie; the pid check covers a forked child
    holding the write end."""
    while not alive.poll(0.5) and folders.alive(parent_pid):
        pass
    shutil.rmtree(folder, ignore_errors=True)  # never outlive the kernel, nor leave its folders behind:
    folders.remove_all_of(parent_pid)  # this cluster's, its others' and its fork server's mark's
    os._exit(3)  # and with the workers gone, the fork server, which they keep alive, exits too


def _report_stacks(rank: int, report: Any, out_q: Any, state: dict) -> None:
    """On request, send where the main thread is (a job that overran, timed out or stayed silent).

    ``report``: a shared counter the parent increments, read without a lock so it can never block
    the parent. The main thread may be blocked in a collective (Gloo releases the GIL), so its stack
    is read with ``sys._current_frames``.
    """
    main, seen = threading.main_thread().ident, report.value
    while True:
        time.sleep(0.1)
        if report.value == seen:
            continue
        seen = report.value
        job, frame = state.get("job"), sys._current_frames().get(main)
        if job is not None and frame is not None:
            frames = [(f.filename, f.lineno, f.name, f.line) for f in
                      user_frames(traceback.extract_stack(frame))]
            out_q.put(Message(Kind.STACK, rank, job, frames))


def _join(rank, world_size, backend, init_method, timeout_s, threads, out_q) -> None:
    device = torch.device("cpu")
    kwargs = {}
    if backend == "nccl":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        kwargs["device_id"] = device
    dist.init_process_group(
        backend, init_method=init_method, rank=rank, world_size=world_size,
        timeout=timedelta(seconds=timeout_s), **kwargs,
    )
    _default_timeouts(timedelta(seconds=timeout_s))
    set_context(WorkerContext(rank, world_size, backend, device, timeout_s, threads,
                              oversubscribed(world_size, threads, backend), out_q))


def _default_timeouts(timeout: timedelta) -> None:
    """Groups made later (``new_group``, DeviceMesh's, ``monitored_barrier``) wait as long as the
    cluster's own group, not torch's default 30 min: ``new_group`` called on some ranks only would
    otherwise hang there for half an hour. torch reads these module globals when a call passes no
    ``timeout``; a torch without them keeps its default."""
    for name in ("default_pg_timeout", "default_pg_nccl_timeout"):
        if isinstance(getattr(c10d, name, None), timedelta):
            setattr(c10d, name, timeout)


def worker_main(rank, world_size, backend, init_method, timeout_s, threads, job_q, out_q, parent_pid,
                alive, report=None, env=None, ledger=None):
    """The target of every worker process (started by :class:`~.cluster.Cluster`). ``alive``: see
    :func:`_watch_parent`. ``env``: the variables this cluster's ranks need (a fork server's children
    inherit the server's, not the kernel's of the moment). ``ledger``: where this rank posts its
    collective calls (:mod:`.checked`), or None."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:  # out of the kernel's process group, which Jupyter kills as one (SIGKILL, at shutdown):
        os.setpgid(0, 0)  # we outlive it by the moment it takes to clean up after it
    except (AttributeError, OSError):
        pass
    os.environ.update(env or {})
    folder = os.path.dirname(init_method.removeprefix("file://"))
    threading.Thread(target=_watch_parent, args=(alive, parent_pid, folder), daemon=True).start()
    state: dict = {"job": None}
    output.capture(rank, out_q, state)
    output.redirect_native(folder, rank)
    out_q.put(Message(Kind.STARTED, rank, 0))  # up, torch imported: the start-up line counts it
    if report is not None:
        threading.Thread(target=_report_stacks, args=(rank, report, out_q, state), daemon=True).start()
    torch.set_num_threads(threads)
    try:
        _join(rank, world_size, backend, init_method, timeout_s, threads, out_q)
        if ledger is not None:
            checked.install(ledger, rank)
        base = hygiene.baseline()
        output.flush()
        out_q.put(Message(Kind.READY, rank, 0))
    except BaseException as e:
        output.flush()
        out_q.put(Message(Kind.ERROR, rank, 0, format_exception(e)))
        return
    while True:
        msg = job_q.get()
        if msg is None:
            break
        job_id, payload = msg
        try:
            state["job"] = job_id  # a rank still loading the job answers where it is, too
            fn, args, kwargs = unpack_job(payload)
            out_q.put(Message(Kind.BEGUN, rank, job_id))  # timeout_s counts from here
            hygiene.fresh_random(base)  # no job's random numbers depend on the jobs before it
            checked.begin(job_id)
            value = fn(*args, **kwargs)
            checked.end()  # raises if a peer waits on a call this rank never made
        except BaseException as e:
            _CTX.flush_events()
            output.flush()
            state["job"] = None
            out_q.put(Message(Kind.ERROR, rank, job_id, format_exception(e)))
            break  # the process group may be half-way through a collective: leave it
        _CTX.flush_events()
        output.flush()
        state["job"] = None
        # Requested restarts (a fault demo) are silent; a worker the job broke says why.
        reason = "" if _CTX.restart_requested else hygiene.broken(base)
        try:
            done = cloudpickle.dumps((value, reason))
        except Exception as e:
            out_q.put(Message(Kind.ERROR, rank, job_id, f"{type(e).__name__}: the value rank {rank} "
                              f"returned ({type(value).__name__}) cannot be sent back to the notebook: "
                              f"{e}. Return tensors, numbers, strings, lists or dicts of them."))
            continue
        out_q.put(Message(Kind.DONE, rank, job_id, done))
        if reason is not None:
            out_q.close()
            out_q.join_thread()
            os._exit(0)  # skip destroy_process_group: it could wait on an abandoned operation
        hygiene.restore(base)
    try:
        dist.destroy_process_group()
    except Exception:
        pass
