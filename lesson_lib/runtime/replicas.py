"""The runtime's second mode: replica groups as processes that may die while the others carry on
(chapter 10 §2–3).

The course's clusters (:mod:`lesson_lib.runtime`) stop every rank when one dies: that is right for
a job, and wrong for a demonstration of surviving one. Here each replica group is one process,
started, SIGKILLed and restarted independently; the survivors never notice the launcher, only the
missing peer. Everything they share lives in a fresh temporary folder: a ``FileStore`` (no port),
the job (cloudpickled, so a function from a notebook cell runs on the replicas) and their results.

:func:`run` starts ``n`` replicas of ``job(replica, n, store_path, *args)``, restarts a replica that
died (once per ``restart`` entry, ``restart_after_s`` after the watcher saw it dead, from a hot spare
started with the others and waiting with torch imported, as a cluster keeps spare machines), calls
``watch(store, alive)`` in a thread while they run, and returns every result, the deaths and restarts,
and the wall time. On any error, every process it started is killed and reaped and the folder removed.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import shutil
import tempfile
import threading
import time
from typing import Any, Callable

from .diagnosis import format_exception, relabel_cells
from .errors import ReplicaError
from .failures import exception_line
from .pickling import install_sources, pack_job

ENV = {"GLOO_SOCKET_IFNAME": "lo", "RUST_LOG": "warn", "OMP_NUM_THREADS": "1"}  # loopback, quiet torchft


def _main(folder: str, replica: int, n: int, env: dict, spare: bool = False) -> None:
    os.environ.update(env)
    import torch
    import torch.distributed

    torch.set_num_threads(1)
    with open(os.path.join(folder, "job.pkl"), "rb") as f:
        job, args, _, lines = pickle.load(f)  # imports what the job needs, before a spare waits
    install_sources(lines)  # a notebook cell's lines, for the traceback below
    go = os.path.join(folder, f"go_{replica}")
    while spare and not os.path.exists(go):
        time.sleep(0.005)
    try:
        out = job(replica, n, os.path.join(folder, "store"), *args)
    except BaseException as e:  # the launcher raises it in the notebook, naming this replica
        tmp = os.path.join(folder, f"error_{replica}.tmp")
        with open(tmp, "w") as f:
            f.write(format_exception(e))
        os.replace(tmp, os.path.join(folder, f"error_{replica}.txt"))
        raise
    tmp = os.path.join(folder, f"result_{replica}.tmp")
    torch.save(out, tmp)
    os.replace(tmp, os.path.join(folder, f"result_{replica}.pt"))


def _raise_if_it_raised(folder: str, replica: int) -> None:
    """A replica that died of an exception (not a kill): its traceback, as the notebook's error."""
    path = os.path.join(folder, f"error_{replica}.txt")
    if os.path.exists(path):
        with open(path) as f:
            tb = relabel_cells(f.read())
        raise ReplicaError(replica, exception_line(tb), tb)


def _context():
    """Forked from a fork server that has imported torch (the one the course's clusters use, with the
    same preload), so a replica starts in a fraction of a second; spawned where there is none."""
    from .start import method, raise_deferred_interrupt, starting

    if method("gloo") != "forkserver":
        return mp.get_context("spawn")
    with starting("gloo", {}, "") as (ctx, _):  # started as the runtime starts it, if not running yet
        pass
    raise_deferred_interrupt()  # one that came while the fork server started
    return ctx


def run(job: Callable, n: int, *args: Any, restart: tuple[int, ...] = (), restart_after_s: float = 0.2,
        watch: Callable | None = None, timeout_s: float = 60.0, env: dict | None = None) -> dict:
    """``job(replica, n, store_path, *args)`` on ``n`` replica processes; see the module docstring."""
    import torch

    folder = tempfile.mkdtemp(prefix=f"lesson_lib_ch10_{os.getpid()}_")
    ctx = _context()
    procs: dict[int, Any] = {}
    deaths, restarts, left = [], [], list(restart)
    stop = threading.Event()
    environ = {**ENV, **(env or {})}

    spares: dict[int, Any] = {}

    seen_dead: list = []  # the processes the watcher saw dead

    def alive(r: int) -> bool:
        p = procs[r]
        if p.is_alive():
            return True
        seen_dead.append(p)
        return False

    def start(r: int, spare: bool = False) -> None:
        p = ctx.Process(target=_main, args=(folder, r, n, environ, spare), daemon=True)
        p.start()
        (spares if spare else procs)[r] = p

    t0 = time.monotonic()
    try:
        with open(os.path.join(folder, "job.pkl"), "wb") as f:
            f.write(pack_job(job, args))  # a cell's code keeps its name and lines (not <dynamic-code>)
        import torch.distributed as dist

        store = dist.FileStore(os.path.join(folder, "store"), -1)
        for r in range(n):
            start(r)
        for r in set(restart):  # a hot spare per replica that will be restarted: the machine is ready
            start(r, spare=True)
        thread = None
        if watch is not None:
            thread = threading.Thread(target=watch, args=(store, alive, stop), daemon=True)
            thread.start()
        done: set[int] = set()
        while len(done) < n:
            if time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"replicas still running after {timeout_s:.0f} s: "
                                   f"{sorted(set(range(n)) - done)}")
            for r, p in list(procs.items()):
                if r in done or p.is_alive():
                    continue
                if os.path.exists(os.path.join(folder, f"result_{r}.pt")):
                    done.add(r)
                    continue
                _raise_if_it_raised(folder, r)
                deaths.append({"replica": r, "exitcode": p.exitcode, "at_s": time.monotonic() - t0})
                if r not in left:
                    again = any(x["replica"] == r for x in restarts)
                    raise RuntimeError(
                        f"replica {r} died (exit code {p.exitcode}) and is not restarted: " + (
                            f"it had been restarted once already, and this run keeps one hot spare per "
                            f"restart it plans (restart={tuple(restart)}), so a second fault ends it"
                            if again else f"this run restarts only the replicas in restart={tuple(restart)}"))
                left.remove(r)
                # the spare takes r's place only once the watcher has seen r dead: on a busy machine its
                # thread can sleep through a short restart, and would then wait for the dead one forever
                while thread is not None and thread.is_alive() and p not in seen_dead:
                    if time.monotonic() - t0 > timeout_s:
                        raise TimeoutError(f"the watcher had not seen replica {r} die in {timeout_s:.0f} s")
                    time.sleep(0.005)
                time.sleep(restart_after_s)
                restarts.append({"replica": r, "at_s": time.monotonic() - t0})
                procs[r] = spares.pop(r)
                open(os.path.join(folder, f"go_{r}"), "w").close()
            time.sleep(0.02)
        results = [torch.load(os.path.join(folder, f"result_{r}.pt"), weights_only=False) for r in range(n)]
        return {"results": results, "deaths": deaths, "restarts": restarts, "wall_s": time.monotonic() - t0}
    finally:
        stop.set()
        for p in [*procs.values(), *spares.values()]:
            if p.is_alive():
                p.kill()
            p.join(5)
        if watch is not None and thread is not None:
            thread.join(5)
        shutil.rmtree(folder, ignore_errors=True)
