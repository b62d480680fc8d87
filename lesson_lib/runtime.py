"""One runtime for every chapter: worker processes, rendezvous, backend choice, timeouts, teardown.

Milestones never touch ports, ``init_process_group`` or processes themselves; they write a
function that runs on every rank and hand it to :class:`Cluster.run` (or, under ``torchrun``,
to :class:`TorchrunCluster.run`, which has the same contract).

Design notes (see MACHINE-NOTES.md for the measurements behind them):

* spawn start method: fork is fast but a forked child that runs a matmul after the parent used
  intra-op threads can hang. So worker functions must be importable, and we say so clearly.
* rendezvous through a ``file://`` store in a fresh temporary folder: no port is ever fixed, so
  any number of clusters in any number of kernels can start at once.
* workers start once and stay warm; ``run`` ships (module, name, pickled args) to them.
* every wait is bounded: the process group gets ``timeout_s``; the parent polls results with a
  short timeout and checks worker liveness in between, so a dead worker is reported at once.
* workers ignore SIGINT (the parent decides) and exit when their parent disappears.
"""

from __future__ import annotations

import atexit
import importlib
import os
import pickle
import queue
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
import warnings
import weakref
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

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


def _resolve(ref: tuple[str, str]) -> Callable:
    module, qualname = ref
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _worker_main(rank, world_size, backend, init_method, timeout_s, threads, job_q, out_q, parent_pid):
    global _CTX
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
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
    except BaseException:
        out_q.put(("error", rank, 0, traceback.format_exc()))
        return
    while True:
        msg = job_q.get()
        if msg is None:
            break
        job_id, payload = msg
        try:
            ref, args, kwargs = pickle.loads(payload)
            value = _resolve(ref)(*args, **kwargs)
            out_q.put(("done", rank, job_id, pickle.dumps((value, _CTX.restart_requested))))
        except BaseException:
            out_q.put(("error", rank, job_id, traceback.format_exc()))
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


def function_ref(fn: Callable) -> tuple[str, str]:
    """(module, qualified name) by which a spawned worker can import ``fn``; clear error if none."""
    name = getattr(fn, "__qualname__", None) or repr(fn)
    module = getattr(fn, "__module__", None)
    if module in (None, "__main__", "__mp_main__") or "<locals>" in name or "<lambda>" in name:
        raise TypeError(
            f"cannot send {name!r} to the workers: it is defined in a notebook cell, a script's "
            "__main__ or inside another function. Workers are separate processes started with "
            "'spawn'; they import the function by module and name, and a notebook cell is not "
            "an importable module. Put the function in a .py file (for example in lesson_lib or "
            "next to the notebook), import it, and pass the imported function."
        )
    try:
        if _resolve((module, name)) is not fn:
            raise AttributeError
    except (ImportError, AttributeError):
        raise TypeError(f"cannot send {name!r} to the workers: {module}.{name} does not import "
                        "back to the same function; pass a module-level function") from None
    return module, name


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
        t0 = time.perf_counter()
        ctx = mp.get_context("spawn")
        self._tmp = tempfile.mkdtemp(prefix="lesson_lib_")
        init_method = "file://" + os.path.join(self._tmp, "rendezvous")
        self._out_q = ctx.Queue()
        self._job_qs = [ctx.Queue() for _ in range(self.world_size)]
        env_backup = {k: os.environ.get(k) for k in ("GLOO_SOCKET_IFNAME", "OMP_NUM_THREADS")}
        if self.backend == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ and _has_iface("lo"):
            os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # one machine: keep Gloo on loopback
        os.environ["OMP_NUM_THREADS"] = str(self.threads)
        try:
            for rank in range(self.world_size):
                p = ctx.Process(
                    target=_worker_main, name=f"lesson_lib-rank{rank}", daemon=True,
                    args=(rank, self.world_size, self.backend, init_method, self.timeout_s,
                          self.threads, self._job_qs[rank], self._out_q, os.getpid()),
                )
                p.start()
                self._procs.append(p)
        finally:
            for k, v in env_backup.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        _LIVE.add(self)
        try:
            self._collect(0, kinds=("ready",), deadline=time.monotonic() + 120 + self.timeout_s)
        except BaseException:
            self.close()
            raise
        self.start_seconds = time.perf_counter() - t0

    def close(self) -> None:
        """Stop the workers (politely, then by force); safe to call twice."""
        procs, self._procs = self._procs, []
        for q in self._job_qs:
            try:
                q.put(None)
            except Exception:
                pass
        deadline = time.monotonic() + 2.0
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
        self._job_qs, self._out_q = [], None
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
            deadline_s: float | None = None, **kwargs: Any) -> list:
        """Run ``fn(*args, **kwargs)`` on every rank; return the values as a list by rank.

        ``on_event`` receives each event a rank emits (``context().emit``) while the job runs.
        ``deadline_s`` bounds the whole job (default: none beyond the collective timeout).
        Raises :class:`WorkerError` naming the failing rank, with its traceback.
        """
        ref = function_ref(fn)
        try:
            payload = pickle.dumps((ref, args, kwargs))
        except Exception as e:
            raise TypeError(f"the arguments to {ref[1]} cannot be sent to the workers: {e}") from e
        self.start()
        self._job_id += 1
        for q in self._job_qs:
            q.put((self._job_id, payload))
        deadline = None if deadline_s is None else time.monotonic() + deadline_s
        try:
            done = self._collect(self._job_id, kinds=("done",), deadline=deadline, on_event=on_event)
        except BaseException:
            self.close()  # a failed or interrupted job leaves no worker behind
            raise
        if any(restart for _, restart in done):
            self.close()  # those workers are exiting; the next run starts fresh ones
        return [value for value, _ in done]

    def _collect(self, job_id, kinds, deadline=None, on_event=None) -> list:
        values: list = [None] * self.world_size
        pending = set(range(self.world_size))
        next_check = 0.0
        while pending:
            now = time.monotonic()
            if now >= next_check:  # also while events stream in: liveness and deadline first
                next_check = now + 0.05
                self._check_alive(pending)
                if deadline is not None and now > deadline:
                    raise WorkerError(min(pending), "did not finish before the deadline "
                                      f"(ranks still running: {sorted(pending)})")
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

    def _check_alive(self, pending) -> None:
        for rank, p in enumerate(self._procs):
            if rank in pending and p.exitcode is not None:
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
        last = errors[root].strip().splitlines()[-1] if errors[root].strip() else "failed"
        raise WorkerError(root, last, errors[root], others=tuple(r for r in errors if r != root))


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

    def run(self, fn: Callable, *args: Any, on_event=None, deadline_s=None, **kwargs: Any) -> list:
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
