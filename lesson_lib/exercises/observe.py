"""What a learner's code did on a rank, for the checkers: :func:`observe` records every
communication call made through ``torch.distributed`` or :mod:`lesson_lib.comm`.

``torch.distributed`` is observed at ``ProcessGroup``'s methods, where every spelling of a call
passes; functional collectives bypass them from C++ and are seen through a ``TorchDispatchMode``;
:mod:`lesson_lib.comm` is patched by name. Only the outermost call is recorded.

Each call is a dict: ``op`` (``all_reduce``, ``send``...; an ``exchange`` is a send plus a recv),
``api`` (the name called), ``bytes`` (tensors handed in), ``peer`` (p2p only), ``async``,
``start``/``done`` (``done``: when it finished for the caller, ``None`` if never waited for) and
``in_backward``. :meth:`Log.mark` notes a moment; :meth:`Log.in_flight` lists calls outstanding then.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from ..runtime.checked import PG_OPS  # a process group's method -> what it is

# a functional collective's operator (torch.ops._c10d_functional.<name>) begins with what it is
FUNCTIONAL_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
COMM_OPS = {
    "ring_all_reduce": "all_reduce", "pipelined_ring_all_reduce": "all_reduce", "all_reduce": "all_reduce",
    "naive_all_reduce": "all_reduce", "halving_doubling_all_reduce": "all_reduce",
    "ring_reduce_scatter": "reduce_scatter", "ring_all_gather": "all_gather",
    "send": "send", "recv": "recv", "recv_any": "recv", "exchange": "exchange",
}
_STATE = threading.local()


def _nbytes(args: tuple, kwargs: dict) -> int:
    """Bytes of every tensor handed in, in lists of tensors and lists of lists too."""
    def size(a) -> int:
        if isinstance(a, torch.Tensor):
            return a.numel() * a.element_size()
        return sum(map(size, a)) if isinstance(a, (list, tuple)) else 0

    return sum(size(a) for a in (*args, *kwargs.values()))


class Work:
    """The handle an observed call returns; notes when the learner's wait returned."""

    def __init__(self, inner: Any, calls: list[dict]):
        self._inner, self._calls, self._future = inner, calls, False

    def get_future(self):
        self._future = True
        return self._inner.get_future()

    def settle(self, at: float) -> None:
        """Done by ``at`` if waited for through its future and complete. A handle nobody waited for
        stays undone even if its work completed (Gloo's small messages often have)."""
        if self._future and any(c["done"] is None for c in self._calls) and self._inner.get_future().done():
            for c in self._calls:
                c["done"] = c["done"] or at

    def wait(self, *args, **kwargs):
        out = self._inner.wait(*args, **kwargs)
        for c in self._calls:
            if c["done"] is None:
                c["done"] = time.perf_counter()
        return out

    def __getattr__(self, name):
        return getattr(self._inner, name)


class Log(list):
    """The calls, in the order they were made (a list of dicts), and the marks."""

    def __init__(self):
        super().__init__()
        self.marks: list[dict] = []
        self.handles: list[Work] = []

    def mark(self, label: str, settle: bool = False) -> None:
        """Note this moment; with ``settle``, future-awaited handles whose work completed count as
        done by now. Otherwise a call is done only when ``wait()`` returned."""
        at = time.perf_counter()
        if settle:
            for h in self.handles:
                h.settle(at)
        self.marks.append({"label": label, "at": at})

    def ops(self) -> list[str]:
        return [c["op"] for c in self]

    def in_flight(self, at: float, op: str | None = None) -> list[dict]:
        """The calls begun before ``at`` and not yet finished for the caller then."""
        return [c for c in self if c["start"] < at and (c["done"] is None or c["done"] > at)
                and (op is None or c["op"] == op)]

    def as_data(self) -> dict:
        return {"calls": [dict(c) for c in self], "marks": list(self.marks)}


def summary(calls: list[dict]) -> str:
    """"all_reduce ×2 (1,024 bytes) + all_gather ×1 (512 bytes)", in order of first use."""
    seen: dict[str, list[int]] = {}
    for c in calls:
        n = seen.setdefault(c["api"], [0, 0])
        n[0] += 1
        n[1] += c["bytes"]
    return " + ".join(f"{api} ×{k} ({b:,} bytes)" for api, (k, b) in seen.items()) or "no communication"


def _peer(op: str, args: tuple, kwargs: dict) -> int | None:
    """The other rank of a point-to-point call (``dst`` of a send, ``src`` of a receive)."""
    if op not in ("send", "recv"):
        return None
    peer = kwargs.get("dst" if op == "send" else "src", args[1] if len(args) > 1 else None)
    return peer if isinstance(peer, int) else None


def _wrap(fn, api: str, op: str, log: Log):
    @functools.wraps(fn)
    def recorded(*args, **kwargs):
        if getattr(_STATE, "depth", 0):  # inside another recorded call: its own business
            return fn(*args, **kwargs)
        in_backward = torch._C._current_graph_task_id() != -1
        made = []
        if op == "exchange":  # exchange(send_t, dst, recv_t, src): a send and a receive, either may be None
            names = ("send_t", "dst", "recv_t", "src")
            full = {**dict(zip(names, args)), **kwargs}
            sides = [(o, full.get(t), full.get(p)) for o, t, p in (("send", "send_t", "dst"),
                                                                   ("recv", "recv_t", "src"))
                     if full.get(t) is not None]
        else:
            sides = [(op, None, _peer(op, args, kwargs))]
        for o, tensor, peer in sides:
            nbytes = _nbytes(args, kwargs) if tensor is None else tensor.numel() * tensor.element_size()
            made.append({"op": o, "api": api, "bytes": nbytes, "async": False,
                         "peer": peer if isinstance(peer, int) else None, "in_backward": in_backward,
                         "start": time.perf_counter(), "done": None})
        log.extend(made)
        _STATE.depth = getattr(_STATE, "depth", 0) + 1
        try:
            out = fn(*args, **kwargs)
        finally:
            _STATE.depth -= 1
        if out is not None and hasattr(out, "wait"):
            for c in made:
                c["async"] = True
            log.handles.append(Work(out, made))
            return log.handles[-1]
        for c in made:
            c["done"] = time.perf_counter()
        return out

    return recorded


def unobserved(fn):
    """``fn`` for the checker's own calls inside :func:`observe`, left out of the log."""
    @functools.wraps(fn)
    def quiet(*args, **kwargs):
        _STATE.depth = getattr(_STATE, "depth", 0) + 1
        try:
            return fn(*args, **kwargs)
        finally:
            _STATE.depth -= 1

    return quiet


def _caller(method: str) -> tuple[str, bool]:
    """The ``torch.distributed`` function the learner called that led to ``method`` (the outermost
    torch.distributed frame), and whether it hands back a handle (``async_op=True``, ``isend``...)."""
    frame, outer = sys._getframe(2), None
    while frame is not None and frame.f_globals.get("__name__", "").startswith("torch.distributed"):
        if frame.f_code.co_name not in ("wrapper", "inner") and not frame.f_code.co_name.startswith("_"):
            outer = frame
        frame = frame.f_back
    if outer is None:  # the learner called the process group's method: it returns the handle
        return f"ProcessGroup.{method}", True
    name = outer.f_code.co_name
    handed = name in ("isend", "irecv", "batch_isend_irecv") or bool(outer.f_locals.get("async_op", False))
    return f"dist.{name}", handed


def _wrap_group(method, name: str, log: Log):
    """``ProcessGroup.<name>``, recorded: the call every torch.distributed collective makes."""
    op = PG_OPS[name]

    @functools.wraps(method)
    def recorded(group, *args, **kwargs):
        if getattr(_STATE, "depth", 0):  # inside another recorded call (comm's ring): its own business
            return method(group, *args, **kwargs)
        peer = args[1] if op in ("send", "recv") and name != "recv_anysource" and len(args) > 1 else None
        if isinstance(peer, int):
            try:  # the group's rank → the world's, as the learner and the checkers number ranks
                peer = dist.get_global_rank(group, peer)
            except (RuntimeError, ValueError):
                pass
        api, handed = _caller(name)
        call = {"op": op, "api": api, "bytes": _nbytes(args, kwargs), "async": handed,
                "peer": peer if isinstance(peer, int) else None,
                "in_backward": torch._C._current_graph_task_id() != -1,
                "start": time.perf_counter(), "done": None}
        log.append(call)
        _STATE.depth = getattr(_STATE, "depth", 0) + 1
        try:
            out = method(group, *args, **kwargs)
        finally:
            _STATE.depth -= 1
        if out is not None and hasattr(out, "wait"):  # torch.distributed waits on it, or hands it back
            log.handles.append(Work(out, [call]))
            return log.handles[-1]
        call["done"] = time.perf_counter()
        return out

    return recorded


class _Functional(TorchDispatchMode):
    """Records the functional collectives' operators. They are asynchronous by design: the call
    returns at once and the result is waited for when it is first used (by ``wait_tensor`` or by an
    operator on the AsyncCollectiveTensor), so a call is done when its output is first used."""

    def __init__(self, log: Log):
        super().__init__()
        self.log = log
        self.pending: dict[int, dict] = {}  # output's data_ptr → its call, until waited for

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._overloadpacket.__name__ if getattr(func, "namespace", "") == "_c10d_functional" else ""
        op = next((o for o in FUNCTIONAL_OPS if name.startswith(o)), None)
        if op is None and self.pending and name != "_wrap_tensor_autograd":
            waited = [self.pending.pop(ptr) for ptr in self._pointers(args, kwargs) if ptr in self.pending]
            out = func(*args, **kwargs)  # an AsyncCollectiveTensor waits for its result here
            for call in waited:
                call["done"] = time.perf_counter()
            return out
        if op is None or getattr(_STATE, "depth", 0):
            return func(*args, **kwargs)
        call = {"op": op, "api": f"funcol.{name}", "bytes": _nbytes(args, kwargs),
                "async": True, "peer": None, "in_backward": torch._C._current_graph_task_id() != -1,
                "start": time.perf_counter(), "done": None}
        self.log.append(call)
        _STATE.depth = getattr(_STATE, "depth", 0) + 1
        try:
            out = func(*args, **kwargs)
        finally:
            _STATE.depth -= 1
        for t in out if isinstance(out, list | tuple) else [out]:
            if isinstance(t, torch.Tensor):
                self.pending[t.data_ptr()] = call
        return out

    @staticmethod
    def _pointers(args, kwargs) -> list[int]:
        """The storage of every tensor argument, looking inside funcol's AsyncCollectiveTensor
        (whose own pointer is 0: it wraps the collective's output)."""
        out = []
        for a in torch.utils._pytree.tree_leaves((args, kwargs)):
            inner = getattr(a, "elem", a) if type(a).__name__ == "AsyncCollectiveTensor" else a
            if isinstance(inner, torch.Tensor):
                out.append(inner.data_ptr())
        return out


@contextmanager
def observe() -> Iterator[Log]:
    """On a rank: every communication call made inside, recorded in the :class:`Log` yielded."""
    from .. import comm

    log = Log()
    group = dist.ProcessGroup
    # put back the class's own entries (pybind descriptors): getattr's unbound function would not bind
    patched = [(group, name, vars(group)[name]) for name in PG_OPS if name in vars(group)]
    patched += [(comm, name, getattr(comm, name)) for name in COMM_OPS if hasattr(comm, name)]
    try:
        for owner, name, fn in patched:
            setattr(owner, name, _wrap_group(getattr(group, name), name, log) if owner is group
                    else _wrap(fn, f"comm.{name}", COMM_OPS[name], log))
        with _Functional(log):
            yield log
    finally:
        for owner, name, fn in patched:
            setattr(owner, name, fn)
