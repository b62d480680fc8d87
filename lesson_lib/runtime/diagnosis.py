"""What went wrong, in the learner's terms: their frames, their cells, where a stuck rank waits."""

from __future__ import annotations

import os
import re
import traceback

import torch

RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__))
LIBRARY_DIR = os.path.dirname(RUNTIME_DIR)  # lesson_lib/
TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
STDLIB_DIR = os.path.dirname(os.path.abspath(os.__file__))  # os.path.exists, json, queue...


def _stdlib(filename: str) -> bool:
    """Python's own modules, frozen ('<frozen genericpath>') or on disk (not its site-packages)."""
    if filename.startswith("<frozen "):
        return True
    path = os.path.abspath(filename)
    return path.startswith(STDLIB_DIR + os.sep) and os.sep + "site-packages" + os.sep not in path


def in_runtime(filename: str) -> bool:
    return os.path.abspath(filename).startswith(RUNTIME_DIR + os.sep)


def user_frames(stack) -> list:
    """Frames outside the runtime: the learner's code and the library's, not the job loop."""
    return [f for f in stack if not in_runtime(f.filename)]


def format_exception(exc: BaseException) -> str:
    """The traceback of ``exc`` (and its causes) without the runtime's own frames."""
    te = traceback.TracebackException.from_exception(exc)
    todo, seen = [te], set()
    while todo:
        t = todo.pop()
        if t is None or id(t) in seen:
            continue
        seen.add(id(t))
        t.stack = traceback.StackSummary.from_list(user_frames(t.stack))
        todo += [t.__cause__, t.__context__]
    return "".join(te.format())


def cell_label(filename: str) -> str | None:
    """'Cell In[7]' for a notebook cell's file name, as IPython writes it; None elsewhere."""
    try:
        from IPython import get_ipython
        number = get_ipython().compile._filename_map.get(filename)
    except Exception:
        return None
    return None if number is None else f"Cell In[{number}]"


def relabel_cells(text: str) -> str:
    """Write notebook cells' temporary file names the way IPython does ('Cell In[7], line 3')."""
    def sub(m: "re.Match") -> str:
        label = cell_label(m.group(1))
        return f"{label}, line" if label else m.group(0)
    return re.sub(r'File "([^"]+)", line', sub, text)


def _library_module(filename: str) -> str:
    """'lesson_lib.comm' for .../lesson_lib/comm.py (a package's __init__ names the package)."""
    rel = os.path.relpath(os.path.splitext(os.path.abspath(filename))[0], os.path.dirname(LIBRARY_DIR))
    parts = rel.split(os.sep)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def where(frames: list) -> str:
    """'waiting in torch.distributed recv(), called from Cell In[3], line 4: dist.recv(t, 1)'.

    ``frames`` are ``(filename, lineno, name, line)`` from outermost to innermost. The learner's
    frame is the innermost one outside torch and lesson_lib; the call it is blocked in is the first
    library frame below it (past decorators' wrappers).
    """
    def library(f) -> bool:
        return os.path.abspath(f[0]).startswith((TORCH_DIR, LIBRARY_DIR))

    mine = [i for i, f in enumerate(frames) if not library(f) and not _stdlib(f[0])]
    if not mine:  # library code alone (a milestone's worker): its innermost non-torch frame
        mine = [i for i, f in enumerate(frames) if not f[0].startswith(TORCH_DIR) and not _stdlib(f[0])]
    if not mine:
        return "running (no frame outside torch)"
    i = mine[-1]
    filename, lineno, _, line = frames[i]
    at = f"{cell_label(filename) or os.path.basename(filename)}, line {lineno}" + (
        f": {line.strip()}" if line else "")
    below = [f for f in frames[i + 1:] if f[2] not in ("wrapper", "inner")]
    if not below or all(_stdlib(f[0]) for f in below):  # Python's own helpers are part of the line
        return f"running {at}"
    callee = "torch.distributed" if below[0][0].startswith(TORCH_DIR) else _library_module(below[0][0])
    return f"waiting in {callee} {below[0][2]}(), called from {at}"


def is_peer_fallout(tb: str) -> bool:
    """True for the messages a rank gets when a *peer* died: the peer is the root cause."""
    return any(s in tb for s in ("Connection closed by peer", "Connection reset by peer",
                                 "Broken pipe", "ECONNRESET", "closed by peer"))


def is_collective_timeout(tb: str) -> bool:
    """True for a collective or point-to-point operation that gave up waiting (Gloo's "Timed out
    waiting 30000ms for recv operation to complete", NCCL's watchdog)."""
    last = tb.strip().splitlines()[-1] if tb.strip() else ""
    return bool(re.search(r"timed out|timeout", last, re.IGNORECASE)) and (
        "torch/distributed" in tb or "gloo" in last.lower() or "nccl" in last.lower())
