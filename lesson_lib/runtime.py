"""One runtime for every chapter: worker processes, rendezvous, backend choice, timeouts, teardown.

Milestones never touch ports, ``init_process_group`` or processes themselves; they write a
function that runs on every rank and hand it to :class:`Cluster.run` (or, under ``torchrun``,
to :class:`TorchrunCluster.run`, which has the same contract).

Design notes (see MACHINE-NOTES.md for the measurements behind them):

* spawn start method: fork is fast but a forked child that runs a matmul after the parent used
  intra-op threads can hang. A spawned worker cannot import a function defined in a notebook
  cell, so such functions (and lambdas, closures) travel *by value*, pickled by cloudpickle, with
  their cell's source lines so that a traceback from a worker shows the learner's own code.
  Importable functions still travel by reference (module and name).
* rendezvous through a ``file://`` store in a fresh temporary folder: no port is ever fixed, so
  any number of clusters in any number of kernels can start at once.
* workers start once and stay warm; ``run`` ships the pickled function and arguments to them.
* a job that outlives ``run(..., timeout_s=...)`` is reported with what each waiting rank was
  blocked in (a thread in every worker reads the main thread's stack), then the workers stop.
* every wait is bounded: the process group gets ``timeout_s``; the parent polls results with a
  short timeout and checks worker liveness in between, so a dead worker is reported at once.
* workers ignore SIGINT (the parent decides) and exit when their parent disappears.
"""

from __future__ import annotations

import atexit
import collections
import importlib
import io
import linecache
import os
import pickle
import queue
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
import types
import warnings
import weakref
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

import cloudpickle
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MAX_WORLD_SIZE = 64
BACKENDS = ("auto", "gloo", "nccl")


class WorkerError(RuntimeError):
    """A worker failed; ``rank`` names it and ``remote_traceback`` carries its traceback."""

    def __init__(self, rank: int, message: str, remote_traceback: str = "", others: tuple = ()):
        self.rank = rank
        self.remote_traceback = remote_traceback
        self.other_failed_ranks = tuple(others)
        text = f"rank {rank}: {message}"
        if others:
            text += f" (ranks {', '.join(map(str, others))} failed after it)"
        if remote_traceback:
            text += f"\n\n--- traceback from rank {rank} ---\n{remote_traceback}"
        super().__init__(text)

    def _render_traceback_(self) -> list[str]:
        # IPython shows this instead of a traceback through the runtime's polling loop: the
        # learner needs the rank and *its* traceback (which ends in their own cell), not ours.
        return [f"{type(self).__name__}: {self}"]


class WorkerTimeout(WorkerError):
    """A job outlived ``Cluster.run(..., timeout_s=...)``; the message says where each rank waited."""


class RunInterrupted(KeyboardInterrupt):
    """The kernel was interrupted during a run; the workers were stopped (one line, no traceback)."""

    def _render_traceback_(self) -> list[str]:
        return [f"KeyboardInterrupt: {self}"]


MAIN_GUARD_HELP = (
    "the workers could not start: this script starts a Cluster (or a lesson_lib run) at import "
    "time. Workers are started with 'spawn', which re-imports your script in every worker, so the "
    "code that starts them must sit under a guard:\n\n"
    "    if __name__ == \"__main__\":\n        main()   # everything that starts workers\n"
)


# --------------------------------------------------------------------------- backend choice


@dataclass(frozen=True)
class Placement:
    """Where a world of ``world_size`` ranks runs: backend, device type and the reason, in words."""

    backend: str
    device_type: str
    reason: str


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def _gpu_count() -> int:
    # torch.cuda.device_count() asks NVML where it can and does not create a CUDA context, so the
    # notebook kernel stays CUDA-free. The CPU wheel answers 0 without touching anything.
    if not torch.cuda.is_available():
        return 0
    return torch.cuda.device_count()


def validate_world_size(world_size: Any) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be an int, got {world_size!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if world_size > MAX_WORLD_SIZE:
        raise ValueError(
            f"world_size={world_size} is more than this course runs on one machine "
            f"(at most {MAX_WORLD_SIZE}); use torchrun across machines for more"
        )
    return world_size


def choose_placement(world_size: int, backend: str = "auto") -> Placement:
    """NCCL with one GPU per rank when enough GPUs exist, else Gloo on CPU.

    With ``auto`` and fewer GPUs than ranks we fall back to Gloo on CPU for the whole world
    rather than sharing GPUs between ranks: NCCL does not allow two ranks on one device, and a
    mixed world would make the timings meaningless.
    """
    validate_world_size(world_size)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    gpus = _gpu_count()
    if backend == "nccl":
        if not dist.is_nccl_available() or gpus < world_size:
            raise ValueError(
                f"backend='nccl' needs one GPU per rank: world_size={world_size} but "
                f"{gpus} GPU(s) visible{'' if dist.is_nccl_available() else ' and NCCL is not built in'}"
                "; use backend='auto' or 'gloo'"
            )
        return Placement("nccl", "cuda", f"NCCL, one GPU per rank ({gpus} GPUs visible)")
    if backend == "gloo":
        return Placement("gloo", "cpu", "Gloo on CPU (asked for)")
    if gpus >= world_size and dist.is_nccl_available():
        return Placement("nccl", "cuda", f"NCCL, one GPU per rank ({gpus} GPUs visible)")
    if gpus:
        return Placement("gloo", "cpu", f"Gloo on CPU: {world_size} ranks but only {gpus} GPU(s)")
    return Placement("gloo", "cpu", "Gloo on CPU: no GPU visible")


def threads_per_rank(world_size: int) -> int:
    """Intra-op threads per worker: the cores left after one for the notebook, shared out.

    Ranks that together ask for more threads than there are cores slow each other down badly
    (spinning thread pools), and the kernel, the browser and the plots need a core too.
    """
    return max(1, (cpu_count() - 1) // world_size)


# --------------------------------------------------------------------------- worker side


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

    def request_restart(self) -> None:
        """Ask for fresh workers after this job (e.g. a fault demo left the process group unusable).

        The job still returns normally; the cluster then replaces its workers before the next job.
        """
        self.restart_requested = True

    def emit(self, kind: str, **data: Any) -> None:
        """Send a small event (floats, ints, strings) to the notebook while the job runs."""
        if self.events is not None:
            self.events.put(("event", self.rank, None, {"kind": kind, "rank": self.rank, **data}))


_CTX: WorkerContext | None = None


def context() -> WorkerContext:
    """The calling rank's context; only valid inside a function run by a cluster."""
    if _CTX is None:
        raise RuntimeError(
            "lesson_lib.runtime.context() is only available inside a function run by "
            "Cluster.run (or under torchrun); the notebook kernel is not a rank"
        )
    return _CTX


def _watch_parent(parent_pid: int) -> None:
    while True:
        if os.getppid() != parent_pid:
            os._exit(3)  # the kernel is gone: never outlive it
        time.sleep(0.5)


_RUNTIME_FILE = os.path.abspath(__file__)


def _user_frames(stack) -> list:
    """Frames outside this module: the learner's code and the library's, not the job loop."""
    return [f for f in stack if os.path.abspath(f.filename) != _RUNTIME_FILE]


def _format_exception(exc: BaseException) -> str:
    te = traceback.TracebackException.from_exception(exc)
    todo, seen = [te], set()
    while todo:
        t = todo.pop()
        if t is None or id(t) in seen:
            continue
        seen.add(id(t))
        t.stack = traceback.StackSummary.from_list(_user_frames(t.stack))
        todo += [t.__cause__, t.__context__]
    return "".join(te.format())


def _report_stacks(rank: int, report: Any, out_q: Any, state: dict) -> None:
    """On request, send where the main thread is (the parent asks when a job overruns).

    The main thread may be blocked inside a collective (Gloo releases the GIL while it waits), so
    this thread can read its stack with ``sys._current_frames``.
    """
    main = threading.main_thread().ident
    while True:
        report.wait()
        job, frame = state.get("job"), sys._current_frames().get(main)
        if job is not None and frame is not None:
            frames = [(f.filename, f.lineno, f.name, f.line) for f in
                      _user_frames(traceback.extract_stack(frame))]
            out_q.put(("stack", rank, job, frames))
        while report.is_set():
            time.sleep(0.05)


def _worker_main(rank, world_size, backend, init_method, timeout_s, threads, job_q, out_q, parent_pid,
                 report=None):
    global _CTX
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    state: dict = {"job": None}
    if report is not None:
        threading.Thread(target=_report_stacks, args=(rank, report, out_q, state), daemon=True).start()
    torch.set_num_threads(threads)
    try:
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
        _CTX = WorkerContext(rank, world_size, backend, device, timeout_s, threads,
                             world_size * threads > cpu_count(), out_q)
        out_q.put(("ready", rank, 0, None))
    except BaseException as e:
        out_q.put(("error", rank, 0, _format_exception(e)))
        return
    while True:
        msg = job_q.get()
        if msg is None:
            break
        job_id, payload = msg
        try:
            fn, args, kwargs, lines = pickle.loads(payload)
            for name, text in lines.items():  # a cell's source, so tracebacks can quote it
                linecache.cache[name] = (sum(map(len, text)), None, text, name)
            state["job"] = job_id
            value = fn(*args, **kwargs)
            state["job"] = None
            out_q.put(("done", rank, job_id, cloudpickle.dumps((value, _CTX.restart_requested))))
        except BaseException as e:
            state["job"] = None
            out_q.put(("error", rank, job_id, _format_exception(e)))
            break  # the process group may be half-way through a collective: leave it
        if _CTX.restart_requested:
            out_q.close()
            out_q.join_thread()
            os._exit(0)  # skip destroy_process_group: it could wait on an abandoned operation
    try:
        dist.destroy_process_group()
    except Exception:
        pass


# --------------------------------------------------------------------------- parent side


def _importable(fn: Callable) -> bool:
    """True when a spawned worker can import ``fn`` by module and name (then it goes by reference)."""
    name, module = getattr(fn, "__qualname__", ""), getattr(fn, "__module__", None)
    if module in (None, "__main__", "__mp_main__") or "<locals>" in name or "<lambda>" in name:
        return False
    try:
        obj: Any = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return False
    return obj is fn


def _cell_sources() -> dict[str, list[str]]:
    """Source lines of code that exists only in this process's memory (notebook cells).

    IPython keeps each executed cell in ``linecache`` under a file name that does not exist on
    disk; a worker that has these lines prints them in its tracebacks.
    """
    out = {}
    for name, entry in list(linecache.cache.items()):
        if len(entry) == 4 and entry[2] and not name.startswith("<frozen") and not os.path.exists(name):
            out[name] = entry[2]
    return out


def _code_reduce_keep_filename(code: types.CodeType):
    ctor, args = cloudpickle.cloudpickle._code_reduce(code)
    return ctor, tuple(code.co_filename if a == "<dynamic-code>" else a for a in args)


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, keeping each code object's file name.

    cloudpickle 3.1 writes ``<dynamic-code>`` instead (for deterministic payloads); we keep the
    cell's name, so that a worker's traceback can say 'Cell In[7], line 3' and quote the line.
    """

    dispatch_table = collections.ChainMap({types.CodeType: _code_reduce_keep_filename},
                                          cloudpickle.Pickler.dispatch_table)

    def reducer_override(self, obj):
        # Module objects of a ModuleType subclass (torch.classes, torch.ops) are not in cloudpickle's
        # table, which matches exact types; a cell function whose code merely names `.classes`
        # drags them in. An imported module travels by name.
        if isinstance(obj, types.ModuleType) and sys.modules.get(obj.__name__) is obj:
            return importlib.import_module, (obj.__name__,)
        return super().reducer_override(obj)


def _dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def pack_job(fn: Callable, args: tuple = (), kwargs: dict | None = None) -> bytes:
    """The bytes a worker needs to run ``fn(*args, **kwargs)``.

    Importable functions go by reference; functions defined in a notebook cell, ``__main__``,
    lambdas and closures go by value (cloudpickle), with the cells' source lines.
    """
    if not callable(fn):
        raise TypeError(f"Cluster.run needs a function to run on every rank, got {fn!r}")
    lines = {} if _importable(fn) else _cell_sources()
    try:
        return _dumps((fn, tuple(args), dict(kwargs or {}), lines))
    except Exception as e:
        name = getattr(fn, "__qualname__", repr(fn))
        raise TypeError(f"{name} or its arguments cannot be sent to the workers: {e}. Everything a "
                        "worker needs must be picklable: pass tensors, numbers, lists and "
                        "functions, not clusters, locks, open files or widgets.") from e


def _cell_label(filename: str) -> str | None:
    """'Cell In[7]' for a notebook cell's file name, as IPython writes it; None elsewhere."""
    try:
        from IPython import get_ipython
        number = get_ipython().compile._filename_map.get(filename)
    except Exception:
        return None
    return None if number is None else f"Cell In[{number}]"


def _relabel_cells(text: str) -> str:
    """Write notebook cells' temporary file names the way IPython does ('Cell In[7], line 3')."""
    def sub(m: "re.Match") -> str:
        label = _cell_label(m.group(1))
        return f"{label}, line" if label else m.group(0)
    return re.sub(r'File "([^"]+)", line', sub, text)


_LIBRARY_DIRS = (os.path.dirname(os.path.abspath(torch.__file__)), os.path.dirname(_RUNTIME_FILE))


def _where(frames: list) -> str:
    """'waiting in torch.distributed recv(), called from Cell In[3], line 4: dist.recv(t, 1)'.

    The learner's frame is the innermost one outside torch and lesson_lib; the call it is blocked
    in is the first library frame below it (past decorators' wrappers).
    """
    def library(f) -> bool:
        return os.path.abspath(f[0]).startswith(_LIBRARY_DIRS)

    mine = [i for i, f in enumerate(frames) if not library(f)]
    if not mine:  # library code alone (a milestone's worker): its innermost non-torch frame
        mine = [i for i, f in enumerate(frames) if not f[0].startswith(_LIBRARY_DIRS[0])]
    if not mine:
        return "running (no frame outside torch)"
    i = mine[-1]
    filename, lineno, _, line = frames[i]
    at = f"{_cell_label(filename) or os.path.basename(filename)}, line {lineno}" + (
        f": {line.strip()}" if line else "")
    below = [f for f in frames[i + 1:] if f[2] not in ("wrapper", "inner")]
    if not below:
        return f"running {at}"
    where = "torch.distributed" if below[0][0].startswith(_LIBRARY_DIRS[0]) else \
        "lesson_lib." + os.path.splitext(os.path.basename(below[0][0]))[0]
    return f"waiting in {where} {below[0][2]}(), called from {at}"


def _is_peer_fallout(tb: str) -> bool:
    # Messages a rank gets when a *peer* died; the peer, not this rank, is the root cause.
    return any(s in tb for s in ("Connection closed by peer", "Connection reset by peer",
                                 "Broken pipe", "ECONNRESET", "closed by peer"))


_LIVE: "weakref.WeakSet[Cluster]" = weakref.WeakSet()


@atexit.register
def close_all() -> None:
    """Close every cluster this process started (called at interpreter exit too)."""
    for cluster in list(_LIVE):
        cluster.close()


class Cluster:
    """``world_size`` warm worker processes with a process group ready.

    >>> with Cluster(world_size=2) as cluster:                        # doctest: +SKIP
    ...     ranks = cluster.run(some_module.fn, arg)   # fn(arg) on every rank, list by rank

    A failed job closes the workers (their process group may be broken); the next ``run``
    starts fresh ones. Used by every chapter.
    """

    def __init__(self, world_size: int = 2, backend: str = "auto", timeout_s: float = 30.0,
                 threads: int | None = None, start: bool = True, quiet: bool = False):
        self.world_size = validate_world_size(world_size)
        if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s <= 3600):
            raise ValueError(f"timeout_s must be a number of seconds in (0, 3600], got {timeout_s!r}")
        self.placement = choose_placement(world_size, backend)
        self.backend = self.placement.backend
        self.timeout_s = float(timeout_s)
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be a positive int, got {threads!r}")
        self.threads = threads or threads_per_rank(world_size)
        self.oversubscribed = world_size * self.threads > cpu_count() and self.backend == "gloo"
        self.quiet = quiet
        self._procs: list = []
        self._job_qs: list = []
        self._out_q = None
        self._report = None
        self._tmp: str | None = None
        self._job_id = 0
        self.start_seconds = float("nan")
        note = (f"{world_size} ranks on {cpu_count()} CPU cores: ranks time-share the cores, so "
                "wall-clock times stretch; compare the per-rank busy time shown beside them")
        if not quiet:
            print(f"lesson_lib: {world_size} rank(s) — {self.placement.reason}"
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
        if self.running:  # a warm worker died between jobs: replace the whole world
            self.close()
        if getattr(mp.current_process(), "_inheriting", False):
            # We are a worker being started, re-importing a script that starts workers at import
            # time. Leave a note for the parent, which turns it into a clear error.
            mark = os.environ.get(_SPAWN_MARK)
            if mark:
                with open(mark, "w") as f:
                    f.write("main guard")
            raise RuntimeError(MAIN_GUARD_HELP)
        t0 = time.perf_counter()
        ctx = mp.get_context("spawn")
        self._tmp = tempfile.mkdtemp(prefix="lesson_lib_")
        init_method = "file://" + os.path.join(self._tmp, "rendezvous")
        self._out_q = ctx.Queue()
        self._report = ctx.Event()
        self._job_qs = [ctx.Queue() for _ in range(self.world_size)]
        env_backup = {k: os.environ.get(k) for k in ("GLOO_SOCKET_IFNAME", "OMP_NUM_THREADS", _SPAWN_MARK)}
        if self.backend == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ and _has_iface("lo"):
            os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # one machine: keep Gloo on loopback
        os.environ["OMP_NUM_THREADS"] = str(self.threads)
        os.environ[_SPAWN_MARK] = os.path.join(self._tmp, "main-guard")
        # Children start with SIGINT ignored (an ignored signal stays ignored across exec, and
        # Python then installs no KeyboardInterrupt handler): an interrupt during their start-up
        # must not print a traceback per worker. The parent alone handles it, and stops them.
        sigint = None
        if threading.current_thread() is threading.main_thread():
            sigint = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            for rank in range(self.world_size):
                p = ctx.Process(
                    target=_worker_main, name=f"lesson_lib-rank{rank}", daemon=True,
                    args=(rank, self.world_size, self.backend, init_method, self.timeout_s,
                          self.threads, self._job_qs[rank], self._out_q, os.getpid(), self._report),
                )
                p.start()
                self._procs.append(p)
        finally:
            if sigint is not None:
                signal.signal(signal.SIGINT, sigint)
            for k, v in env_backup.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        _LIVE.add(self)
        progress = _StartProgress(self.world_size, self.quiet)
        try:
            self._collect_or_stop("start-up", 0, kinds=("ready",),
                                  deadline=time.monotonic() + 120 + self.timeout_s, on_ready=progress)
        finally:
            progress.done()
        self.start_seconds = time.perf_counter() - t0

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
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        _LIVE.discard(self)

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    # -- jobs
    def run(self, fn: Callable, *args: Any, on_event: Callable[[dict], None] | None = None,
            timeout_s: float | None = None, **kwargs: Any) -> list:
        """Run ``fn(*args, **kwargs)`` on every rank; return the values as a list by rank.

        ``fn`` may be defined anywhere, a notebook cell included: importable functions are sent
        by reference, others (cell functions, lambdas, closures) by value.
        ``on_event`` receives each event a rank emits (``context().emit``) while the job runs.
        ``timeout_s`` bounds the whole job (default: none beyond the collective timeout); a job
        that overruns it raises :class:`WorkerTimeout` saying where each rank was waiting.
        Raises :class:`WorkerError` naming the failing rank, with its traceback.
        """
        if timeout_s is not None and not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise ValueError(f"timeout_s must be a positive number of seconds or None, got {timeout_s!r}")
        payload = pack_job(fn, args, kwargs)
        name = getattr(fn, "__qualname__", "the function")
        self.start()
        self._job_id += 1
        for q in self._job_qs:
            q.put((self._job_id, payload))
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        done = self._collect_or_stop(f"the run of {name}", self._job_id, kinds=("done",),
                                     deadline=deadline, on_event=on_event, timeout_s=timeout_s)
        if any(restart for _, restart in done):
            self.close()  # those workers are exiting; the next run starts fresh ones
        return [value for value, _ in done]

    def _collect_or_stop(self, what: str, *args, **kwargs) -> list:
        """:meth:`_collect`; on any failure or interrupt the workers are stopped first."""
        try:
            return self._collect(*args, **kwargs)
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

    def _collect(self, job_id, kinds, deadline=None, on_event=None, on_ready=None, timeout_s=None) -> list:
        values: list = [None] * self.world_size
        pending = set(range(self.world_size))
        next_check = 0.0
        while pending:
            now = time.monotonic()
            if now >= next_check:  # also while events stream in: liveness and deadline first
                next_check = now + 0.05
                self._check_alive(pending)
                if deadline is not None and now > deadline:
                    self._raise_timeout(job_id, pending, timeout_s)
                if on_ready is not None:
                    on_ready(self.world_size - len(pending))
            try:
                kind, rank, jid, data = self._out_q.get(timeout=0.05)
            except queue.Empty:
                continue
            if kind == "event":
                if on_event is not None:
                    on_event(data)
            elif kind == "error":
                self._raise_failure(rank, data)
            elif kind in kinds and jid == job_id:
                values[rank] = pickle.loads(data) if kind == "done" else None
                pending.discard(rank)
        return values

    def _raise_timeout(self, job_id: int, pending: set, timeout_s: float | None) -> None:
        """Ask the ranks still running where they are, then raise :class:`WorkerTimeout`."""
        stacks: dict[int, list] = {}
        if job_id and self._report is not None:
            self._report.set()
            end = time.monotonic() + 1.5
            while time.monotonic() < end and not pending <= stacks.keys():
                try:
                    kind, rank, jid, data = self._out_q.get(timeout=0.05)
                except queue.Empty:
                    continue
                if kind == "stack" and jid == job_id:
                    stacks[rank] = data
            self._report.clear()
        limit = f"within timeout_s={timeout_s:g} s" if timeout_s else "before the deadline"
        waiting = sorted(pending)
        lines = [f"did not finish {limit}: ranks {waiting} were still running"
                 + (" — waiting for each other? (a send or recv with no partner, or a collective "
                    "that not every rank called, waits forever)" if stacks else "")]
        lines += [f"  rank {r}: {_where(stacks[r])}" for r in waiting if r in stacks]
        raise WorkerTimeout(waiting[0], "\n".join(lines), others=())

    def _check_alive(self, pending) -> None:
        for rank, p in enumerate(self._procs):
            if rank in pending and p.exitcode is not None:
                if self._tmp and os.path.exists(os.path.join(self._tmp, "main-guard")):
                    raise RuntimeError(MAIN_GUARD_HELP)
                # It may have sent its traceback just before exiting: read it first.
                try:
                    while True:
                        kind, r, _, data = self._out_q.get(timeout=0.3)
                        if kind == "error":
                            self._raise_failure(r, data)
                except queue.Empty:
                    pass
                code = p.exitcode
                how = (f"was killed by signal {signal.Signals(-code).name}" if code < 0
                       else f"exited with code {code}")
                if code == -signal.SIGABRT and self.backend == "gloo":
                    how += (" (Gloo aborts a rank whose receive does not match what was sent to it: "
                            "a tensor of another size or dtype, or a message from another rank)")
                raise WorkerError(rank, f"worker process {how} while running a job")

    def _raise_failure(self, rank: int, tb: str) -> None:
        # Gather the errors that arrive right after the first one and blame the root cause:
        # the rank whose traceback is not just "my peer went away".
        errors = {rank: tb}
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            try:
                kind, r, _, data = self._out_q.get(timeout=0.05)
            except queue.Empty:
                continue
            if kind == "error":
                errors[r] = data
        roots = [r for r, t in errors.items() if not _is_peer_fallout(t)]
        if not roots:
            # Everyone reports a lost peer: the root cause is a worker that died without a word.
            end = time.monotonic() + 1.0
            while time.monotonic() < end:
                dead = [(r, p.exitcode) for r, p in enumerate(self._procs)
                        if p.exitcode is not None and r not in errors]
                if dead:
                    r, code = dead[0]
                    how = (f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}")
                    raise WorkerError(r, f"worker process was killed ({how}) while running a job",
                                      others=tuple(errors))
                time.sleep(0.05)
            roots = [rank]
        root = roots[0]
        tb = _relabel_cells(errors[root])
        last = tb.strip().splitlines()[-1] if tb.strip() else "failed"
        raise WorkerError(root, last, tb, others=tuple(r for r in errors if r != root))


_SPAWN_MARK = "LESSON_LIB_SPAWN_MARK"  # set while workers start: a file a worker writes on trouble


class _StartProgress:
    """'starting 64 ranks: 12/64 ready (8 s)' on one line while a big or slow world starts."""

    def __init__(self, world_size: int, quiet: bool):
        self.n, self.quiet, self.t0, self.last, self.shown = world_size, quiet, time.monotonic(), 0.0, False

    def __call__(self, ready: int) -> None:
        now = time.monotonic()
        if self.quiet or ready == self.n or now - self.last < 1.0 or (self.n < 8 and now - self.t0 < 3):
            return
        self.last, self.shown = now, True
        print(f"\rlesson_lib: starting {self.n} ranks: {ready}/{self.n} ready "
              f"({now - self.t0:.0f} s)", end="", flush=True)

    def done(self) -> None:
        if self.shown:
            print(f"\rlesson_lib: {self.n} ranks started in {time.monotonic() - self.t0:.0f} s" + " " * 10)


def _has_iface(name: str) -> bool:
    try:
        return any(n == name for _, n in socket.if_nameindex())
    except OSError:
        return False


_WARM: dict[tuple[int, str], Cluster] = {}
MAX_WARM_RANKS = 12  # each idle worker holds ~300 MB (torch imported); keep a laptop usable


def warm_cluster(world_size: int, backend: str = "auto", timeout_s: float = 30.0) -> Cluster:
    """A cluster kept warm for this kernel's life, shared by the chapters' helpers.

    At most ``MAX_WARM_RANKS`` idle workers are kept: the least recently used clusters are
    closed to make room.
    """
    key = (world_size, backend)
    cluster = _WARM.pop(key, None)
    if cluster is None:
        while _WARM and sum(c.world_size for c in _WARM.values()) + world_size > MAX_WARM_RANKS:
            _WARM.pop(next(iter(_WARM))).close()
        cluster = Cluster(world_size, backend, timeout_s=timeout_s)
    _WARM[key] = cluster  # most recently used last
    return cluster


# --------------------------------------------------------------------------- torchrun


def launched_by_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


class TorchrunCluster:
    """The same ``run`` contract as :class:`Cluster` when ``torchrun`` started the processes.

    Each process runs ``fn`` as its own rank; the values are exchanged with ``all_gather_object``
    so every rank gets the list by rank (rank 0 prints and writes files).
    """

    def __init__(self, backend: str = "auto", timeout_s: float = 30.0):
        global _CTX
        world_size = int(os.environ["WORLD_SIZE"])
        rank = int(os.environ["RANK"])
        local_rank = int(os.environ["LOCAL_RANK"])
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        use_nccl = backend == "nccl" or (
            backend == "auto" and _gpu_count() > local_rank and dist.is_nccl_available())
        if backend == "nccl" and _gpu_count() <= local_rank:
            raise ValueError(f"backend='nccl' needs a GPU for local rank {local_rank}")
        self.backend = "nccl" if use_nccl else "gloo"
        device = torch.device("cuda", local_rank) if use_nccl else torch.device("cpu")
        if use_nccl:
            torch.cuda.set_device(device)
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        threads = max(1, cpu_count() // local_world)
        torch.set_num_threads(threads)
        if not dist.is_initialized():
            dist.init_process_group(self.backend, timeout=timedelta(seconds=timeout_s))
        self.world_size, self.rank, self.timeout_s = world_size, rank, timeout_s
        self.oversubscribed = not use_nccl and local_world * threads > cpu_count()
        self.placement = Placement(self.backend, device.type, f"torchrun, {self.backend}")
        _CTX = WorkerContext(rank, world_size, self.backend, device, timeout_s, threads,
                             self.oversubscribed, None)

    def run(self, fn: Callable, *args: Any, on_event=None, timeout_s=None, **kwargs: Any) -> list:
        value = fn(*args, **kwargs)
        gathered: list = [None] * self.world_size
        dist.all_gather_object(gathered, value)
        return gathered

    def close(self) -> None:
        global _CTX
        if dist.is_initialized():
            dist.destroy_process_group()
        _CTX = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def describe() -> dict:
    """What the runtime sees: used by ``python -m lesson_lib doctor``."""
    gpus = _gpu_count()
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cpu_cores": cpu_count(),
        "gpus": gpus,
        "gloo": dist.is_gloo_available(),
        "nccl": dist.is_nccl_available(),
        "start_method": "spawn",
        "placement": {n: choose_placement(n).reason for n in (1, 2, 4, 8)},
        "threads_per_rank": {n: threads_per_rank(n) for n in (1, 2, 4, 8)},
    }
