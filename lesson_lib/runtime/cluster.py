"""``Cluster``: warm worker processes with a process group ready, and the one ``run`` contract.

Workers come from a fork server or are spawned (:mod:`.start`), never forked from the kernel;
rendezvous is a ``file://`` store in a fresh folder (no fixed port); every wait is bounded (docs/runtime.md).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import queue
import shutil
import threading
import time
import warnings
import weakref
from typing import Any, Callable

import torch.multiprocessing as mp

from . import folders, kernel_exit, output, placement, start
from .errors import MAIN_GUARD_HELP, RunInterrupted, WorkerTimeout
from .failures import check_alive, raise_failure, raise_timeout
from .ledger import Ledger, mode
from .messages import Kind
from .pickling import pack_job
from .placement import choose_placement, cpu_count, oversubscribed, threads_per_rank, validate_world_size
from .silence import Silence
from .worker import refuse_inside_a_rank, worker_main

LOAD_S = 120.0  # how long a job's ranks may take to load it (unpickle, import its modules) at most

_LIVE: "weakref.WeakSet[Cluster]" = weakref.WeakSet()


@atexit.register
@kernel_exit.on_shutdown
def close_all() -> None:
    """Close every cluster this process started (at interpreter exit, and first at a kernel's shutdown)."""
    for cluster in list(_LIVE):
        cluster.close()


class Cluster:
    """``world_size`` warm worker processes with a process group ready.

    >>> with Cluster(world_size=2) as cluster:                        # doctest: +SKIP
    ...     ranks = cluster.run(some_module.fn, arg)   # fn(arg) on every rank, list by rank

    A failed job closes the workers (their process group may be broken); the next ``run`` starts fresh ones.
    """

    def __init__(self, world_size: int = 2, backend: str = "auto", timeout_s: float = 30.0,
                 threads: int | None = None, start: bool = True, quiet: bool = False):
        refuse_inside_a_rank()
        self.world_size = validate_world_size(world_size)
        if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s <= 3600):
            raise ValueError(f"timeout_s must be a number of seconds in (0, 3600], got {timeout_s!r}")
        self.placement = choose_placement(world_size, backend)
        self.backend = self.placement.backend
        self.timeout_s = float(timeout_s)
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be a positive int, got {threads!r}")
        self.threads = threads or threads_per_rank(world_size)
        self.oversubscribed = oversubscribed(world_size, self.threads, self.backend)
        self.quiet = quiet
        self._procs: list = []
        self._job_qs: list = []
        self._out_q = None
        self._report = None
        self._alive = None  # the write end of the pipe that tells the workers this process is alive
        self._tmp: str | None = None
        self._native: output.NativeStderr | None = None
        self._ledger: Ledger | None = None  # each rank's collective calls (ledger.py), read after a crash
        self._job_id = 0
        self._mark: str | None = None  # the main-guard mark of start.starting
        self.start_seconds = float("nan")
        self._use = threading.RLock()  # held for a whole job: the idle reaper (idle.py) never closes mid-job
        self.last_used, self.last_used_epoch = time.monotonic(), time.time()
        note = (f"{world_size} ranks on {cpu_count()} CPU cores{placement.share_note()}: ranks time-share "
                "the cores, so wall-clock times stretch; compare each rank's busy (CPU) time where a figure "
                "shows it")
        if not quiet:  # once per cell, never inside a figure or a verdict (output.notice)
            output.notice(f"lesson_lib: {world_size} rank(s) — {self.placement.reason}"
                          + (f"\n  warning: {note}" if self.oversubscribed else ""))
        elif self.oversubscribed:
            warnings.warn(note, RuntimeWarning, stacklevel=2)
        if start:
            self.start()

    # -- life cycle
    @property
    def running(self) -> bool:
        return bool(self._procs)

    def start(self) -> None:
        if self.running and all(p.exitcode is None for p in self._procs):
            return
        refuse_inside_a_rank()
        if self.running:  # a warm worker died between jobs: replace the whole world
            self.close()
        if getattr(mp.current_process(), "_inheriting", False):
            # A worker re-importing a script that starts workers at import time: leave a note for
            # the parent (which raises one clear error) and exit quietly.
            mark = os.environ.get(start.SPAWN_MARK)
            if mark:
                with open(mark, "w") as f:
                    f.write("main guard")
                raise SystemExit(1)
            raise RuntimeError(MAIN_GUARD_HELP)
        t0 = time.perf_counter()
        self._tmp = folders.new()
        self._native = output.NativeStderr(self._tmp, self.world_size)
        _LIVE.add(self)
        progress, store = output.StartProgress(self.world_size, self.quiet), f"{self._tmp}/rendezvous"
        try:  # an interrupt while workers start arrives as their start ends (start.py): stop them too
            self._collect_or_stop("start-up", 0, kinds=(Kind.READY,), on_ready=progress,
                                  first=lambda: self._spawn("file://" + store),
                                  deadline=time.monotonic() + 120 + self.timeout_s)
        finally:
            progress.done()
        self.start_seconds = time.perf_counter() - t0

    def _spawn(self, init_method: str) -> None:
        env = {"OMP_NUM_THREADS": str(self.threads)}
        if self.backend == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ and placement.has_iface("lo"):
            env["GLOO_SOCKET_IFNAME"] = "lo"  # one machine: keep Gloo on loopback
        with start.starting(self.backend, env, os.path.join(self._tmp, "main-guard")) as (ctx, mark):
            self._mark = mark
            # Only this process holds the write end: the workers read end-of-file when it dies.
            alive, self._alive = ctx.Pipe(duplex=False)
            self._out_q = ctx.Queue()
            self._report = ctx.Value("i", 0, lock=False)  # asks the ranks where they are: += 1
            self._job_qs = [ctx.Queue() for _ in range(self.world_size)]
            checks = mode() if self.backend == "gloo" else "off"  # Gloo aborts a rank on a mismatch
            self._ledger = None if checks == "off" else Ledger(self.world_size, ctx, check=checks == "on")
            for rank in range(self.world_size):
                p = ctx.Process(
                    target=worker_main, name=f"lesson_lib-rank{rank}", daemon=True,
                    args=(rank, self.world_size, self.backend, init_method, self.timeout_s,
                          self.threads, self._job_qs[rank], self._out_q, os.getpid(), alive,
                          self._report, env, self._ledger),
                )
                p.start()
                self._procs.append(p)
            alive.close()

    def close(self, grace_s: float = 2.0) -> None:
        """Stop the workers (politely for ``grace_s``, then by force); safe to call twice."""
        procs, self._procs = self._procs, []
        for q in self._job_qs:
            try:
                q.put(None)
            except Exception:
                pass
        deadline = time.monotonic() + grace_s
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(2.0)
        for q in [*self._job_qs, self._out_q]:
            if q is not None:
                q.cancel_join_thread()
                q.close()
        self._job_qs, self._out_q, self._report = [], None, None
        if self._alive is not None:
            self._alive.close()
            self._alive = None
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        _LIVE.discard(self)

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    # -- jobs
    def run(self, fn: Callable, *args: Any, on_event: Callable[[dict], None] | None = None,
            timeout_s: float | None = None, **kwargs: Any) -> list:
        """Run ``fn(*args, **kwargs)`` on every rank; return the values as a list by rank.

        ``fn`` may be defined anywhere, a notebook cell included. ``on_event`` receives each event a
        rank emits (``context().emit``). ``timeout_s`` bounds the whole job: overrunning it raises
        :class:`WorkerTimeout` saying where each rank waited. A failed rank raises :class:`WorkerError`.
        """
        if timeout_s is not None and not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise ValueError(f"timeout_s must be a positive number of seconds or None, got {timeout_s!r}")
        payload = pack_job(fn, args, kwargs)
        with self._use:
            try:
                return self._run(fn, payload, on_event, timeout_s)
            finally:
                self.last_used, self.last_used_epoch = time.monotonic(), time.time()

    def _run(self, fn, payload, on_event, timeout_s) -> list:
        name = getattr(fn, "__qualname__", "the function")
        self.start()
        self._job_id += 1
        # timeout_s bounds the function, not its loading: a function from a module the ranks import
        # first (a test file, a learner's .py) may take seconds to unpickle on a busy machine. The
        # deadline moves to timeout_s after the last rank began; loading alone may take LOAD_S.
        deadline = None if timeout_s is None else time.monotonic() + timeout_s + LOAD_S
        for q in self._job_qs:
            q.put((self._job_id, payload))
        done = self._collect_or_stop(f"the run of {name}", self._job_id, kinds=(Kind.DONE,),
                                     deadline=deadline, on_event=on_event, timeout_s=timeout_s,
                                     silence=Silence(self._report, self._job_id, f"the run of {name}"))
        broken = {rank: why for rank, (_, why) in enumerate(done) if why is not None}
        if broken:
            self.close()  # those workers are exiting; the next run starts fresh ones
            for why in dict.fromkeys(w for w in broken.values() if w):
                ranks = [r for r, w in broken.items() if w == why]
                output.notice(f"lesson_lib: {placement.ranks_text(ranks)}: {why}; the workers were replaced "
                              "for the next run")
        return [value for value, _ in done]

    def _collect_or_stop(self, what: str, *args, first: Callable | None = None, **kwargs) -> list:
        """``first()``, then :meth:`_collect`; on any failure or interrupt the workers are stopped first."""
        try:
            if first is not None:
                first()
            out = self._collect(*args, **kwargs)
            start.raise_deferred_interrupt()  # one that came while the workers started: now they are up
            return out
        except KeyboardInterrupt:
            n = self.world_size
            self.close()
            raise RunInterrupted(f"{what} was interrupted; its {n} worker(s) were stopped "
                                 "(the next run starts fresh ones)") from None
        except WorkerTimeout:
            self.close(grace_s=0)  # its ranks are stuck: no point waiting for a polite exit
            raise
        except BaseException:
            self.close()  # a failed job leaves no worker behind
            raise

    def _collect(self, job_id, kinds, deadline=None, on_event=None, on_ready=None, timeout_s=None,
                 silence=None) -> list:
        values: list = [None] * self.world_size
        pending, started, begun = set(range(self.world_size)), set(), set()
        next_check = 0.0
        guard_file = self._mark if self._tmp else None
        while pending:
            now = time.monotonic()
            if now >= next_check:  # also while events stream in: liveness and deadline first
                next_check = now + 0.05
                check_alive(self._procs, pending, self._out_q, self.backend, guard_file, self._native,
                            self._ledger)
                if deadline is not None and now > deadline:
                    raise_timeout(self._out_q, self._report, job_id, pending, timeout_s,
                                  loading=pending - begun)
                if on_ready is not None:
                    on_ready(self.world_size - len(pending), len(started))
                if silence is not None:
                    silence.tick(pending)
            try:
                msg = self._out_q.get(timeout=0.05)
            except queue.Empty:
                continue
            if silence is not None:
                silence.heard(msg)
            if msg.kind is Kind.STARTED:
                started.add(msg.rank)
            elif msg.kind is Kind.BEGUN:
                if msg.job == job_id:
                    begun.add(msg.rank)
                    if len(begun) == self.world_size and deadline is not None and timeout_s:
                        deadline = time.monotonic() + timeout_s
            elif msg.kind is Kind.EVENT:
                if on_event is not None:
                    on_event(msg.data)
            elif msg.kind is Kind.EVENTS:
                for event in msg.data if on_event is not None else ():
                    on_event(event)
            elif msg.kind is Kind.OUTPUT:
                output.show(msg.rank, *msg.data)
            elif msg.kind is Kind.ERROR:
                raise_failure(self._procs, self._out_q, msg.rank, msg.data, self._report, job_id, pending,
                              self._ledger)
            elif msg.kind in kinds and msg.job == job_id:
                values[msg.rank] = pickle.loads(msg.data) if msg.kind is Kind.DONE else None
                pending.discard(msg.rank)
        if self._native is not None:
            self._native.relay()  # what ranks wrote below Python during the job, marked by rank
        return values
