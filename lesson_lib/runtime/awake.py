"""Idle cores kept awake while a job runs (CPU ranks on Linux): one spinner per core, at the lowest
priority the kernel has.

A rank that waits for a message sleeps; when its core then has nothing else to run, the core idles,
and on a virtual machine an idle core is halted and handed back to the host. Waking it for the next
message can cost more than the message: on the course's 2-core test machine (a VM), in chapter 5's
B₀ training loop on 2 ranks, our ring all-reduce of the 91k gradients took 2.2–2.4 ms per step
(median), against 0.3–0.45 ms for the same call in a tight loop, and 0.42–0.48 ms in that training
loop with these spinners (taking turns in one run). Gloo's own all_reduce, with fewer hand-offs
between threads than our ring's two exchanges, took 1.0–1.4 ms there without spinners. MPI
libraries busy-poll while a rank waits, for the same reason. What the spinners do not remove: about
one all-reduce in ten still took 5–6 ms with them, ours or Gloo's alike. ``perf sched`` showed where:
a rank's Gloo I/O thread woken onto the core on which its own main thread computed, and queued
there 4–6 ms while the other core ran a spinner. Our reading: Linux looks for an idle core to wake
a thread on only while the cores' recent load leaves room (its SIS_UTIL heuristic), and a spinner's
time counts as load. (Found later, :mod:`.iothread`: with each rank on a core of its own, that I/O
thread spins through ``epoll_wait`` while its main thread computes; at nice 19, as own_core now
sets it, such stalls fell from 671–886 to 78–84 of 2,048 all-reduces.) On that machine pinning each
rank's threads to a core of its own made our ring's
median worse (2.1 against 0.7 ms) and Gloo's better (0.5 against 0.7 ms); on another 2-core VM (no
cpuidle driver, an add on 32 × 128 floats 3.2 µs) it made chapter 5's whole step faster in every round,
so chapter 5 pins where there is one rank per core (:func:`.placement.own_core`, ``bench pin``).

A spinner is a tiny Python process (no torch) under ``SCHED_IDLE``: a rank, the kernel or any other
program woken onto a spinner's core takes it at once (about 30 µs in ``perf sched``), so a spinner
fills time in which its core would have idled, and a rank's busy time (its own CPU time) is
unchanged. It spins only while a
job runs (``during``); between jobs it sleeps in 20 ms naps. Not used where it would cost: when rank
threads outnumber the cores (chapter 2's bandwidth measurement on 4 ranks of a 2-core machine took
13.7–13.8 s with spinners, 10.3–10.8 s without; on 2 ranks 2.0 against 1.9–2.1 s), under a
container's CPU quota (the spinners' time would count against it), for GPU ranks, off Linux, or with
``LESSON_LIB_KEEP_AWAKE=0``. ``python -m lesson_lib doctor`` says whether it is on.
``python -m lesson_lib bench awake`` times the same training loop with and without, in one run.
"""

from __future__ import annotations

import atexit
import mmap
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager

from . import folders
from .placement import cpu_count, cpu_quota

# The spinner: it leaves when its parent (the process that started it) is gone, within 20 ms.
_SPIN = r"""
import os, signal, sys, time, mmap
signal.signal(signal.SIGINT, signal.SIG_IGN)
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
parent = int(sys.argv[2])
with open(sys.argv[1], "r+b") as f:
    flag = mmap.mmap(f.fileno(), 1)
while os.getppid() == parent:
    if flag[0]:
        end = time.monotonic() + 0.02
        while flag[0] and time.monotonic() < end:
            pass
    else:
        time.sleep(0.02)
"""

_STATE: dict[int, tuple[list[subprocess.Popen], mmap.mmap, str]] = {}  # pid → (spinners, flag, folder)
_ACTIVE = {"jobs": 0, "off": 0}


def reason_off(backend: str = "gloo", oversubscribed: bool = False) -> str | None:
    """Why no spinners run for ``backend``'s ranks here (``oversubscribed``: more rank threads than
    cores), or None when they do."""
    if os.environ.get("LESSON_LIB_KEEP_AWAKE", "").strip() == "0":
        return "LESSON_LIB_KEEP_AWAKE=0"
    if _ACTIVE["off"]:
        return "turned off (awake.off)"
    if backend != "gloo":
        return "GPU ranks"
    if not sys.platform.startswith("linux") or not hasattr(os, "SCHED_IDLE"):
        return "not Linux"
    if cpu_quota() is not None:
        return "a CPU quota: the spinners' time would count against it"
    if cpu_count() < 2:
        return "one core"
    if oversubscribed:  # chapter 2's bandwidth on 4 ranks, 2 cores: 13.7-13.8 s with, 10.3-10.8 without
        return "more rank threads than cores: no core idles for long, and the spinners slowed the ranks"
    return None


def _spinners() -> mmap.mmap:
    state = _STATE.get(os.getpid())
    if state is not None and all(p.poll() is None for p in state[0]):
        return state[1]
    stop()
    folder = folders.new()
    path = os.path.join(folder, "flag")
    with open(path, "wb") as f:
        f.write(b"\0")
    with open(path, "r+b") as f:
        flag = mmap.mmap(f.fileno(), 1)
    procs = [subprocess.Popen([sys.executable, "-S", "-c", _SPIN, path, str(os.getpid())],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
             for _ in range(cpu_count())]
    _STATE[os.getpid()] = (procs, flag, folder)
    return flag


@contextmanager
def during(backend: str = "gloo", oversubscribed: bool = False):
    """Spinners on every core while the block runs (a job), unless :func:`reason_off` says no."""
    if reason_off(backend, oversubscribed) is not None:
        yield
        return
    try:
        flag = _spinners()
    except OSError:  # no interpreter to start, no folder: the job runs as it would without
        yield
        return
    _ACTIVE["jobs"] += 1
    flag[0] = 1
    try:
        yield
    finally:
        _ACTIVE["jobs"] -= 1
        if _ACTIVE["jobs"] == 0:
            flag[0] = 0


@contextmanager
def off():
    """No spinners for the jobs inside: ``bench awake`` compares both in one run, and chapter 4's
    prefetch timeline (a gather thread beside the compute) runs without them."""
    _ACTIVE["off"] += 1
    try:
        yield
    finally:
        _ACTIVE["off"] -= 1


def pids() -> list[int]:
    """This process's spinners (the tests check that they leave with it)."""
    state = _STATE.get(os.getpid())
    return [p.pid for p in state[0]] if state else []


@atexit.register
def stop() -> None:
    """End this process's spinners and remove their flag's folder."""
    state = _STATE.pop(os.getpid(), None)
    if state is None:
        return
    procs, flag, folder = state
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        try:
            p.wait(2.0)
        except subprocess.TimeoutExpired:
            pass
    flag.close()
    shutil.rmtree(folder, ignore_errors=True)
