"""Whatever a learner's function does to its worker, the next job starts from a clean one.

After each job a worker puts back what it can (default dtype and device, grad mode, threads,
environment, working folder, :func:`undo_after_job` registrations such as ``comm.set_link``); what
it cannot (a replaced process group, threads left running) makes it ask to be replaced, with a reason.
Before each job, its random generators start as a fresh process's would (:func:`fresh_random`).
"""

from __future__ import annotations

import concurrent.futures.thread
import os
import random
import sys
import threading
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist

_UNDO: dict[str, Callable[[], None]] = {}  # what the running job set that the next must not see


def undo_after_job(key: str, undo: Callable[[], None]) -> None:
    """Have ``undo()`` run once after the job that calls this (once per ``key``), so the next job on
    this warm worker starts fresh (e.g. a link ``comm.set_link`` slowed). Outside a worker, nothing
    runs it."""
    _UNDO[key] = undo


@dataclass
class Baseline:
    rank: int
    world_size: int
    dtype: torch.dtype
    device: torch.device
    grad: bool
    threads: int
    cwd: str
    env: dict = field(repr=False)
    thread_ids: set = field(repr=False)
    cuda_rng: list | None = field(default=None, repr=False)  # CUDA generators' start-up states


def baseline() -> Baseline:
    """The worker's state once it joined the process group (call before the first job)."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None  # CPU ranks: no CUDA call
    return Baseline(dist.get_rank(), dist.get_world_size(), torch.get_default_dtype(),
                    torch.get_default_device(), torch.is_grad_enabled(), torch.get_num_threads(),
                    os.getcwd(), dict(os.environ), {t.ident for t in threading.enumerate()}, cuda)


def fresh_random(base: Baseline) -> None:
    """Before each job: random numbers as a freshly started process draws them, whatever earlier jobs
    seeded. torch seeds a process's CPU generator non-deterministically (so ranks differ, as under
    torchrun; forked from one fork server they would all share its seed) and its CUDA generators
    with a fixed default (so GPU ranks agree). Python's ``random`` and NumPy's, if imported, are
    reseeded from the OS as well."""
    torch.random.default_generator.seed()
    if base.cuda_rng is not None:
        torch.cuda.set_rng_state_all(base.cuda_rng)
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def broken(base: Baseline) -> str | None:
    """Why this worker cannot run another job (None when it can)."""
    if not dist.is_initialized():
        return "its function destroyed the process group (dist.destroy_process_group())"
    if (dist.get_rank(), dist.get_world_size()) != (base.rank, base.world_size):
        return "its function replaced the default process group"
    left = [t.name for t in threading.enumerate() if t.ident not in base.thread_ids and t.is_alive()
            and not t.daemon and not _idle_pool_thread(t)]
    if left:
        return f"its function left thread(s) running: {', '.join(left)}"
    return None


def _idle_pool_thread(t: threading.Thread) -> bool:
    # A ThreadPoolExecutor's worker (the library's communication thread among them) only runs what
    # is submitted to it; left idle it does nothing to the next job.
    return getattr(t, "_target", None) is concurrent.futures.thread._worker


def restore(base: Baseline) -> None:
    """Put back what a job may have changed in this process's settings."""
    while _UNDO:
        _UNDO.pop(next(iter(_UNDO)))()
    if torch.get_default_dtype() != base.dtype:
        torch.set_default_dtype(base.dtype)
    if torch.get_default_device() != base.device:
        torch.set_default_device(base.device)
    torch.set_grad_enabled(base.grad)
    if torch.get_num_threads() != base.threads:
        torch.set_num_threads(base.threads)
    if os.getcwd() != base.cwd:
        os.chdir(base.cwd)
    if os.environ != base.env:
        os.environ.clear()
        os.environ.update(base.env)
