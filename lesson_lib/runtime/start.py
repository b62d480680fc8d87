"""How worker processes start: from a fork server on Linux (CPU ranks), by spawn elsewhere.

The fork server imports torch once (:data:`PRELOAD`) and forks a clean worker per rank; it never
runs a tensor operation, so its children are as clean as spawned ones. Per-cluster settings travel
as arguments, since a forked worker inherits the server's environment. ``LESSON_LIB_START_METHOD=spawn``
turns it off. Why: docs/runtime.md, "Starting workers"; ``bench startup`` times both.
"""

from __future__ import annotations

import atexit
import multiprocessing.forkserver as forkserver
import multiprocessing.resource_tracker as resource_tracker
import os
import shutil
import signal
import sys
import threading
from contextlib import contextmanager

import torch.multiprocessing as mp

from . import folders, kernel_exit

SPAWN_MARK = "LESSON_LIB_SPAWN_MARK"
# What the server imports once for all its workers. Not only torch: a worker's first optimizer step
# imports torch._dynamo (and with it sympy, torch.fx, parts of inductor), which would cost every
# fresh rank its own import (``bench startup``). FSDP2 and DCP (chapter 4) add little to the
# server's one start. Never lesson_lib itself: its workers import it fresh, so an edited course
# module is what runs.
PRELOAD = ["torch", "torch.distributed", "cloudpickle", "torch._dynamo", "torch.nn.parallel",
           "torch.utils.checkpoint", "torch.distributed.fsdp", "torch.distributed.checkpoint"]
_SERVER_MARK: dict[int, str] = {}  # this process's pid → the mark file its fork server's workers write


@atexit.register
def _remove_mark_folder() -> None:
    mark = _SERVER_MARK.pop(os.getpid(), None)
    if mark:
        shutil.rmtree(os.path.dirname(mark), ignore_errors=True)


def method(backend: str) -> str:
    """``"forkserver"`` for CPU ranks on Linux, else ``"spawn"`` (see the module's docstring)."""
    if os.environ.get("LESSON_LIB_START_METHOD", "").strip().lower() == "spawn":
        return "spawn"
    if backend == "gloo" and sys.platform.startswith("linux") and "forkserver" in mp.get_all_start_methods():
        return "forkserver"
    return "spawn"


_DEFERRED: list[bool] = []  # interrupts that came while workers started (the main thread's)


def raise_deferred_interrupt() -> None:
    """KeyboardInterrupt, once, if one came while workers started (:func:`_environment`). Called
    once the workers are up (``Cluster``), so that none is killed mid-start."""
    if _DEFERRED:
        _DEFERRED.clear()
        raise KeyboardInterrupt


@contextmanager
def _environment(values: dict[str, str]):
    """``values`` in ``os.environ``, and SIGINT kept from what starts inside: an interrupt during
    start-up prints no traceback per worker (nor kills the fork server while it imports torch).

    SIGINT is blocked in this thread, not ignored, as CPython's resource tracker starts its process:
    a blocked signal stays blocked across fork and exec, so the children never see it (a worker then
    ignores it for good). The parent notes an interrupt that comes meanwhile (through another thread,
    or pending on this one) for :func:`raise_deferred_interrupt`: ignoring SIGINT here lost Jupyter's
    interrupt during a start-up, which takes seconds on a busy machine. Without ``pthread_sigmask``
    (Windows) it is ignored as before."""
    backup = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    sigint = mask = None
    if threading.current_thread() is threading.main_thread():
        if hasattr(signal, "pthread_sigmask"):
            resource_tracker.ensure_running()  # its first start unblocks SIGINT after it: start it before
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            if signal.getsignal(signal.SIGINT) is not None:  # None: a C handler, which we could not restore
                sigint = signal.signal(signal.SIGINT, lambda *_: _DEFERRED.append(True))
        else:
            sigint = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        if mask is not None:
            if signal.SIGINT in signal.sigpending():  # held back by this thread's block: take it
                signal.sigwait({signal.SIGINT})
                _DEFERRED.append(True)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if sigint is not None:
            signal.signal(signal.SIGINT, sigint)
        for k, v in backup.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def starting(backend: str, env: dict[str, str], cluster_mark: str):
    """Yields ``(context, mark)``: the multiprocessing context to start this cluster's workers with,
    inside the environment they need, and the file a worker writes when it finds itself re-importing
    a script without a main guard (``cluster_mark`` under spawn; the server's own under forkserver)."""
    how = method(backend)
    ctx = mp.get_context(how)
    kernel_exit.install()  # in a Jupyter kernel: its shutdown closes the ranks first
    if how == "spawn":
        with _environment({**env, SPAWN_MARK: cluster_mark}):
            yield ctx, cluster_mark
        return
    mark = _SERVER_MARK.get(os.getpid())
    if mark is None:
        mark = _SERVER_MARK[os.getpid()] = os.path.join(folders.new(), "main-guard")
    if os.path.exists(mark):
        os.remove(mark)  # an earlier start's
    with _environment({**env, "OMP_NUM_THREADS": "1", SPAWN_MARK: mark}):
        ctx.set_forkserver_preload(PRELOAD)
        forkserver.ensure_running()  # (re)starts it here, in this environment, if it is not running
        yield ctx, mark
