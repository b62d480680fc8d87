"""Gloo's I/O threads at the lowest priority, where each rank trains on a core of its own (CPU ranks on
Linux).

Each Gloo process group runs an I/O thread, ``gloo_tcp_loop``: an ``epoll`` loop that reads every
message and finishes the sends its rank's own thread could not. On a core it shares with that rank's
main thread (every core, where ranks are as many as cores), it competed with the main thread for far
more than its messages need. Measured on the course's 2-core test machine (a VM, 250 Hz scheduler tick),
chapter 5's B₀ loop (SGD, 2 ranks, 2,048 steps, each rank on a core of its own): the I/O thread used
0.97 and 1.05 s of CPU and was preempted 6,244 and 5,900 times (the two ranks, one run), and 671–886 of
the 2,048 all-reduces took over 2 ms after both ranks had arrived (medians 0.56–0.74 ms; p90 4.3–4.4 ms,
about a tick; three runs). ``perf`` put the I/O thread's samples in ``epoll_wait``, ``ep_send_events``
and ``tcp_poll``, its copies of the bytes at 1.4 % of all samples: it goes round its loop without work
to do. Our reading of Gloo's ``tcp/pair.cc`` (not traced): its handler returns at once when the rank's
thread holds the connection's lock (``try_to_lock``), and ``epoll`` reports the same readiness again, so
the loop spins and keeps the core from the thread that holds the lock until the next tick.

At nice 19 the I/O thread still runs whenever its rank waits (the core is then free), but no longer
takes the core from a rank that computes or holds that lock. The same loop at nice 0 / 10 / 19: 671–820
/ 194–198 / 78–84 such all-reduces, the run 7.1–7.5 / 5.3–5.5 / 4.8–5.0 s (two runs each). Chapter 5's
LAMB at B₀, 1,024 steps, taking turns on one warm cluster (three rounds): 6.5–6.9 s at nice 0, 5.2–6.2
at 5, 4.5–5.7 at 10, 4.2–4.8 at 19; its 48-epoch run with the noise scale, 34.0–35.1 s against 26.6–29.1
s (two rounds). ``python -m lesson_lib bench io`` takes turns both ways on this machine.

Where: :func:`.placement.own_core` (chapter 5's B₀ loop, one rank per core) lowers every Gloo I/O thread
of its rank to nice 19 when it pins the rank, and they stay there: lowering a priority needs no
privilege, raising it again does, so the warm cluster's workers keep it for their life. Not every job:
with it on every rank (b17c201), a CI simulation failed chapter 4's prefetch check, the forward waiting
4.42 ms for parameters with prefetching against 4.08 ms without (medians of 5; the chapter's comment has
2.3 against 6.3 before): a gather running on a communication thread while its rank computes needs the
I/O thread to run then, which at nice 19 it seldom does. Not ``SCHED_IDLE``: the keep-awake spinners
(:mod:`.awake`) run there, and the SGD loop above took 30 s instead of 5. ``LESSON_LIB_IO_NICE=0`` turns
it off (read when a cluster starts); ``python -m lesson_lib doctor`` says whether it is on.
"""

from __future__ import annotations

import os
import sys

NICE = 19  # the lowest priority a thread can have without another scheduling class
NAME = "gloo_tcp_loop"


def reason_off(backend: str) -> str | None:
    """Why :func:`lower` leaves the I/O threads as they are, or ``None`` when it lowers them."""
    if os.environ.get("LESSON_LIB_IO_NICE", "").strip() == "0":
        return "LESSON_LIB_IO_NICE=0"
    if backend != "gloo":
        return "GPU ranks"
    if not sys.platform.startswith("linux"):
        return "not Linux"
    return None


def threads(name: str = NAME) -> list[int]:
    """The ids of this process's threads called ``name`` (raw reads: ``own_core`` looks at every job it
    pins, and with ``open()`` that took 275 µs for 7 threads, 77 µs this way)."""
    found, want = [], name.encode() + b"\n"
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:  # no /proc: nothing to find
        return []
    for tid in tids:
        try:
            fd = os.open(f"/proc/self/task/{tid}/comm", os.O_RDONLY)
            try:
                if os.read(fd, 64) == want:
                    found.append(int(tid))
            finally:
                os.close(fd)
        except OSError:  # the thread has just ended
            pass
    return found


def nices() -> list[int]:
    """The priority (nice) of each of this process's Gloo I/O threads."""
    return [os.getpriority(os.PRIO_PROCESS, tid) for tid in threads()]


def lower(backend: str) -> list[int]:
    """Set this process's Gloo I/O threads to nice :data:`NICE`; returns the ids of those it set."""
    if reason_off(backend) is not None:
        return []
    done = []
    for tid in threads():
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < NICE:
                os.setpriority(os.PRIO_PROCESS, tid, NICE)
                done.append(tid)
        except OSError:  # ended meanwhile
            pass
    return done
