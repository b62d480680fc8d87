"""Rehearsal: the room with learners of its own, so an instructor can rehearse and a learner alone
can play it (``notebooks/11_the_room.ipynb`` runs this way under nbval).

Each rehearsal learner is a separate process (``python -m lesson_lib.room.rehearsal``) that joins
the room exactly as a learner's kernel does and submits the learner code below: most submit the
right ring step, ``wrong`` ones submit a step with chapter 2's classic slip (adding into the chunk
just sent), and ``slow`` ones compute each gradient ``work`` times over (a straggler that really
computes more, not one that sleeps). They die with the kernel that started them (PR_SET_PDEATHSIG)
and stop when the room closes.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

from . import place

JOIN_TIMEOUT_S = 60.0  # starting a process that imports torch: ~2–5 s each on 2 busy cores
STOP_TIMEOUT_S = 5.0  # told the room closed, a learner exits in ~1 s; then SIGKILL


def my_step(rank, n, s):
    """The right answer to chapter 2's exercise, as a learner writes it."""
    send_i = (rank - s) % n
    into_i = (rank - s - 1) % n
    return send_i, into_i


def my_wrong_step(rank, n, s):
    """A learner's slip: what arrives is added into the chunk just sent, not the next one."""
    send_i = (rank - s) % n
    into_i = send_i
    return send_i, into_i


class Rehearsal:
    """Learner processes for ``room``: ``names`` join with the right step, those also in ``wrong``
    with the slip, those in ``slow`` compute ``work`` times over."""

    def __init__(self, room, names=("ada", "bob", "cy", "dee"), wrong=(), slow=(), work: int = 4):
        self.room, self.work = room, work
        self.procs: dict[str, subprocess.Popen] = {}
        self.wrong, self.slow = set(wrong), set(slow)
        for name in names:
            self.start(name)
        self.wait_ready(list(names))

    def start(self, name: str) -> None:
        args = [sys.executable, "-m", "lesson_lib.room.rehearsal", self.room.name, name,
                "--base", str(self.room.folder.parent)]
        if name in self.wrong:
            args.append("--wrong")
        if name in self.slow:
            args += ["--work", str(self.work)]
        self.procs[name] = subprocess.Popen(args, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)

    def wait_ready(self, names: list[str], timeout_s: float = JOIN_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ready = set(self.room.ready())
            if all(n in ready and self.room.joined[n]["pid"] == self.procs[n].pid for n in names):
                return
            dead = [n for n in names if self.procs[n].poll() is not None]
            if dead:
                raise RuntimeError(f"rehearsal learners {dead} exited before joining (codes "
                                   f"{[self.procs[n].returncode for n in dead]})")
            time.sleep(0.1)
        raise TimeoutError(f"rehearsal learners not ready after {timeout_s:.0f} s: "
                           f"{[n for n in names if n not in self.room.ready()]}")

    def kill(self, name: str) -> int:
        """SIGKILL a learner's process, as a closed laptop would; returns its pid."""
        p = self.procs[name]
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=STOP_TIMEOUT_S)
        return p.pid

    def rejoin(self, name: str) -> None:
        """Start ``name`` again (a fresh process, nothing kept): healed from a peer in its next round."""
        if self.procs[name].poll() is None:
            self.kill(name)
        self.start(name)
        self.wait_ready([name])

    def fix(self, name: str) -> None:
        """The learner corrects their step: a fresh process with the right one."""
        self.wrong.discard(name)
        self.rejoin(name)

    def kill_when(self, name: str, step: int = 3, timeout_s: float = 30.0) -> threading.Thread:
        """SIGKILL ``name`` once their status in the room's current round reaches ``step``: a laptop
        closed mid-round. Returns the watching thread (``.killed_at``: the time of the kill)."""
        def watch():
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                r = self.room.rounds[-1] if self.room.rounds else None
                s = r.statuses.get(name) if r is not None and r.running else None
                if s and s.get("step", -1) >= step:
                    watcher.killed_at = time.time()
                    self.kill(name)
                    return
                time.sleep(0.01)

        watcher = threading.Thread(target=watch, daemon=True, name=f"kill {name} at step {step}")
        watcher.killed_at = None
        watcher.start()
        return watcher

    def stop(self) -> None:
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=STOP_TIMEOUT_S)

    def pids(self) -> dict[str, int]:
        return {n: p.pid for n, p in self.procs.items()}


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: the rehearsal ends with the kernel that began it


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="one rehearsal learner")
    p.add_argument("room")
    p.add_argument("name")
    p.add_argument("--base")
    p.add_argument("--wrong", action="store_true")
    p.add_argument("--work", type=int, default=1)
    a = p.parse_args(argv)
    parent = os.getppid()
    import torch

    from .learner import join

    torch.set_num_threads(1)  # a room of processes on a few cores: one thread each
    me = join(a.room, as_name=a.name, work=a.work, base=a.base and place.Path(a.base), quiet=True)
    me.submit("ring", my_wrong_step if a.wrong else my_step)
    while me._thread.is_alive() and os.getppid() == parent:
        me._thread.join(timeout=0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
