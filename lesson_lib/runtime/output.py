"""What a rank prints reaches the notebook through the parent, each line marked with its rank.

A worker's ``sys.stdout``/``sys.stderr`` send whole lines to the parent, which prints
``[rank 1] ...`` before the run returns (the raw file descriptor would arrive late and unmarked).
Output below Python goes to a file per rank (:func:`redirect_native`), relayed after each job and
quoted in the error when a rank dies.

The runtime's own notices (a cluster's banner, the warning that ranks share the cores, workers
replaced) go through :func:`notice`: once per cell, whole, and never between the parts of a figure or
a verdict (:func:`held`, :func:`reserve`).
"""

from __future__ import annotations

import io
import os
import re
import sys
import time
from contextlib import contextmanager
from typing import Any, Iterator

from .messages import Kind, Message

CAP = 200_000  # characters per rank, stream and job: more would stall the notebook, and nobody reads it


class RankStream(io.TextIOBase):
    """A text stream that sends complete lines to the parent's queue (flush sends the rest), at most
    :data:`CAP` characters per job; past that, one line says the rest was cut."""

    def __init__(self, name: str, rank: int, out_q: Any, state: dict):
        self.name, self.rank, self.out_q, self.state, self.buf = name, rank, out_q, state, ""
        self.job, self.sent = None, 0

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
        if self.state.get("job") != self.job:
            self.job, self.sent = self.state.get("job"), 0
        room = CAP - self.sent
        if room <= 0:
            return
        if len(text) > room:
            kept = text[:room]
            kept = kept[:kept.rfind("\n") + 1] if "\n" in kept else kept + "\n"
            text = kept + (f"… (output cut: this rank printed more than {CAP:,} characters to {self.name} "
                           "in this run; the rest is not shown)\n")
            self.sent = CAP
        else:
            self.sent += len(text)
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


# --------------------------------------------------------------------------- the runtime's notices

_NOTICES: dict = {"said": set(), "held": None, "block": None, "scope": None}


def _shell():
    """The IPython kernel's shell when running in a notebook, else None (a script, the tests)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell if shell is not None and getattr(shell, "kernel", None) is not None else None


def _scope() -> Any:
    """Where "once" counts: a widget's click (:func:`notice_scope`), else the notebook cell running;
    None outside a notebook (a script says each notice where it happens)."""
    if _NOTICES["scope"] is not None:
        return _NOTICES["scope"]
    shell = _shell()
    return None if shell is None else ("cell", shell.execution_count)


def _emit(text: str) -> None:
    block = _NOTICES["block"]
    if block is not None and block["scope"] == _scope() and block["scope"] is not None:
        block["lines"].append(text)  # the cell's block, placed ahead of its figure: said there
        block["handle"].update({"text/plain": "\n".join(block["lines"])}, raw=True)
        return
    sys.stdout.write(text + "\n")  # one write: nothing lands between its lines
    sys.stdout.flush()


def notice(text: str) -> None:
    """A runtime notice: said once per cell (or widget click), in one piece; inside :func:`held`,
    kept until the block ends; in a cell with a place kept by :func:`reserve`, said there, ahead of
    the figure that followed."""
    text = text.rstrip("\n")
    scope = _scope()
    if scope is not None:
        if (scope, text) in _NOTICES["said"]:
            return
        _NOTICES["said"].add((scope, text))
    if _NOTICES["held"] is not None:
        _NOTICES["held"].append(text)
        return
    _emit(text)


@contextmanager
def held() -> Iterator[None]:
    """Around a checker: notices raised while it runs (a cluster started for one of its cases) are
    kept and said together as it ends, so that the verdict printed next follows them whole instead
    of being preceded by banners scattered among the ranks' output. Nested blocks hold for the
    outermost."""
    if _NOTICES["held"] is not None:
        yield
        return
    _NOTICES["held"] = []
    try:
        yield
    finally:
        kept, _NOTICES["held"] = _NOTICES["held"], None
        for text in dict.fromkeys(kept):
            _emit(text)


def reserve() -> None:
    """In a notebook, before showing a figure that runs will feed (a live plot, an explorer's
    output): an empty output placed now, where this cell's later notices are said, ahead of the
    figure instead of between it and its caption. Elsewhere, nothing."""
    shell, scope = _shell(), _scope()
    block = _NOTICES["block"]
    if shell is None or (block is not None and block["scope"] == scope):
        return
    from IPython.display import display

    handle = display({"text/plain": ""}, raw=True, display_id=True)
    _NOTICES["block"] = {"scope": scope, "handle": handle, "lines": []}


@contextmanager
def notice_scope(key: Any) -> Iterator[None]:
    """A widget's click: its own "once", and its own reserved place, apart from the cell it sits in."""
    outer, outer_block = _NOTICES["scope"], _NOTICES["block"]
    _NOTICES["scope"] = ("widget", key)
    try:
        yield
    finally:
        _NOTICES["scope"], _NOTICES["block"] = outer, outer_block
