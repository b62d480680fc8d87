"""One rank of one round: what every activity's code is handed, and how a failure is described.

A round's world is made fresh with ``init_process_group`` on the room's store under the round's
prefix and destroyed when the round ends, on every member, whether it succeeded or not: destroying
it closes this rank's Gloo connections, so a neighbour blocked on it fails at once instead of
waiting for the timeout.
"""

from __future__ import annotations

import linecache
import os
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Callable

import torch.distributed as dist

from . import place

LIBRARY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # lesson_lib/


@dataclass
class RankContext:
    """What an activity's code on one rank sees. ``names[i]`` is rank i's name (``"instructor"``
    for rank 0 when the instructor takes part); ``mine`` is what this process kept from earlier
    rounds (a learner's model, for example)."""

    round: int
    rank: int
    names: list[str]
    opts: dict
    store: object
    me: str
    submitted: dict = field(default_factory=dict)
    mine: dict = field(default_factory=dict)

    @property
    def world(self) -> int:
        return len(self.names)

    def status(self, state: str, waiting_for: str | list | None = None, **extra) -> None:
        """Tell the instructor's dashboard what this rank is doing now."""
        place.put(self.store, f"r{self.round}/s/{self.me}",
                  {"state": state, "for": waiting_for, "t": time.time(), **extra})


def start_world(ctx: RankContext, timeout_s: float) -> None:
    if dist.is_initialized():
        raise RuntimeError("this kernel already has a torch.distributed process group of its own: "
                           "restart the kernel (or call dist.destroy_process_group()) and join again")
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # Gloo binds 127.0.0.1 only: nothing beyond this machine
    dist.init_process_group("gloo", store=dist.PrefixStore(f"r{ctx.round}/pg", ctx.store), rank=ctx.rank,
                            world_size=ctx.world, timeout=timedelta(seconds=timeout_s))


def end_world() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def describe(error: BaseException, own: Callable | None = None) -> dict:
    """The error as the instructor is told it: type, message, and the line where it was raised in
    code that is not the course's or torch's (the learner's own cell), if any."""
    frames = traceback.extract_tb(error.__traceback__)
    own_file = getattr(getattr(own, "__code__", None), "co_filename", None)
    theirs = [f for f in frames if f.filename == own_file] or [
        f for f in frames if not f.filename.startswith(LIBRARY) and "/torch/" not in f.filename
        and "/site-packages/" not in f.filename]
    where = theirs[-1] if theirs else (frames[-1] if frames else None)
    line = None
    if where is not None:
        line = {"function": where.name, "line": where.lineno,
                "code": (where.line or linecache.getline(where.filename, where.lineno)).strip(),
                "file": os.path.basename(where.filename)}
    text = str(error).splitlines()[0][:300] if str(error) else ""
    peer = isinstance(error, (RuntimeError, dist.DistBackendError)) and not theirs and any(
        k in str(error) for k in ("Connection closed", "Timed out", "timeout", "Connection reset", "closed"))
    return {"type": type(error).__name__, "message": text, "where": line, "own": bool(theirs) and not peer,
            "peer": peer}


def say_error(name: str, e: dict) -> str:
    """'bob: IndexError: list index out of range, in my_step line 3: return chunks[9]'"""
    where = e.get("where")
    at = f", in {where['function']} line {where['line']}: {where['code']}" if where else ""
    return f"{name}: {e['type']}: {e['message']}{at}"
