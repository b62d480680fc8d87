"""What a rank prints reaches the notebook through the parent, each line marked with its rank.

A worker's ``sys.stdout``/``sys.stderr`` send whole lines to the parent, which prints
``[rank 1] ...`` before the run returns (the raw file descriptor would arrive late and unmarked).
Output below Python goes to a file per rank (:func:`redirect_native`), relayed after each job and
quoted in the error when a rank dies.
"""

from __future__ import annotations

import io
import os
import re
import sys
import time
from typing import Any

from .messages import Kind, Message


class RankStream(io.TextIOBase):
    """A text stream that sends complete lines to the parent's queue (flush sends the rest)."""

    def __init__(self, name: str, rank: int, out_q: Any, state: dict):
        self.name, self.rank, self.out_q, self.state, self.buf = name, rank, out_q, state, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.buf += text
        if "\n" in self.buf:
            whole, self.buf = self.buf.rsplit("\n", 1)
            self._send(whole + "\n")
        return len(text)

    def flush(self) -> None:
        if self.buf:
            text, self.buf = self.buf, ""
            self._send(text)

    def _send(self, text: str) -> None:
        self.out_q.put(Message(Kind.OUTPUT, self.rank, self.state.get("job"), (self.name, text)))


def capture(rank: int, out_q: Any, state: dict) -> None:
    """In a worker: route ``print`` (stdout and stderr) to the parent."""
    sys.stdout = RankStream("stdout", rank, out_q, state)
    sys.stderr = RankStream("stderr", rank, out_q, state)


def native_path(folder: str, rank: int) -> str:
    return os.path.join(folder, f"native-stderr-{rank}")


def redirect_native(folder: str, rank: int) -> None:
    """In a worker: file descriptor 2 (what C++ libraries write, below ``sys.stderr``) into a file."""
    fd = os.open(native_path(folder, rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 2)
    os.close(fd)


class NativeStderr:
    """In the parent: what each rank wrote below Python since the last read."""

    def __init__(self, folder: str, world_size: int):
        self.folder, self.offsets = folder, [0] * world_size

    def take(self, rank: int) -> str:
        try:
            with open(native_path(self.folder, rank), "rb") as f:
                f.seek(self.offsets[rank])
                data = f.read()
        except OSError:
            return ""
        self.offsets[rank] += len(data)
        return data.decode("utf-8", "replace")

    def relay(self) -> None:
        for rank in range(len(self.offsets)):
            if text := self.take(rank):
                show(rank, "stderr", text)


def flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


_WARNING = re.compile(r"^\S.*:\d+: \w*Warning: ", re.MULTILINE)
_WARNED: set[str] = set()  # warnings already shown in this kernel, from any rank


def show(rank: int, stream: str, text: str) -> None:
    """In the parent: print a rank's text, each line marked ``[rank N]``. A Python warning (torch's
    FutureWarning for a deprecated collective, say) is shown once per kernel, not once per rank and
    job: every rank would print the same lines."""
    if stream == "stderr" and _WARNING.search(text):
        if text in _WARNED:
            return
        _WARNED.add(text)
        sys.stderr.write(text.rstrip("\n") + "\n  (a warning from the ranks: shown once per kernel)\n")
        sys.stderr.flush()
        return
    out = sys.stderr if stream == "stderr" else sys.stdout
    lines = text.split("\n")
    end = "\n" if text.endswith("\n") else ""
    if end:
        lines = lines[:-1]
    out.write("\n".join(f"[rank {rank}] {line}" for line in lines) + end)
    out.flush()


class StartProgress:
    """'starting 64 ranks: 40/64 processes up, 0/64 in the process group (8 s)' on one line while a
    big or slow world starts: processes come up one by one (each imports torch), then all join the
    process group together."""

    def __init__(self, world_size: int, quiet: bool):
        self.n, self.quiet, self.t0, self.last, self.shown = world_size, quiet, time.monotonic(), 0.0, False
        self.width = 0  # the longest line shown: the last one is padded to cover all of it

    def __call__(self, ready: int, started: int | None = None) -> None:
        now = time.monotonic()
        if self.quiet or ready == self.n or now - self.last < 1.0 or (self.n < 8 and now - self.t0 < 3):
            return
        self.last, self.shown = now, True
        up = "" if started is None else f"{max(started, ready)}/{self.n} processes up, "
        line = (f"lesson_lib: starting {self.n} ranks: {up}{ready}/{self.n} in the process group "
                f"({now - self.t0:.0f} s)")
        self.width = max(self.width, len(line))
        print(f"\r{line}", end="", flush=True)

    def done(self) -> None:
        if self.shown:  # padded, or the tail of a longer progress line (its ")") would stay on screen
            line = f"lesson_lib: {self.n} ranks started in {time.monotonic() - self.t0:.0f} s"
            print(f"\r{line.ljust(self.width)}")
