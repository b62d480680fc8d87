"""Counters of bytes and time, per-step timing, and memory accounting, for all chapters.

Memory here is an *inventory*: the distinct storages of the tensors a rank knows it holds, the
activations autograd saves (``saved_tensors_hooks``), and communication buffers; plus the CUDA
allocator's bytes on GPU or the process RSS on CPU. The measurement that also sees temporaries is
:class:`lesson_lib.peakmem.PeakMemory`.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import torch

MEMORY_CATEGORIES = ("params", "grads", "optimizer", "activations", "buffers")


# --------------------------------------------------------------------------- device timing


def sync(device: torch.device) -> None:
    """Wait for queued work on ``device``; a no-op on CPU (never a CUDA call on the CPU path)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --------------------------------------------------------------------------- byte/time counters


@dataclass
class OpStats:
    calls: int = 0
    bytes_sent: int = 0
    bytes_recv: int = 0
    seconds: float = 0.0
    overlapped: bool = False  # recorded by a background thread while the rank computed


_THREAD = threading.local()


@contextmanager
def in_background() -> Iterator[None]:
    """Calls recorded inside run beside the computation (a communication thread): kept per op but
    left out of the step's communication time, which counts only what the main thread waited for."""
    _THREAD.background = True
    try:
        yield
    finally:
        _THREAD.background = False


@dataclass
class CommCounters:
    """Per-rank traffic and time of every call made through :mod:`lesson_lib.comm`."""

    ops: dict[str, OpStats] = field(default_factory=dict)
    scratch_live: int = 0
    scratch_peak: int = 0

    def record(self, op: str, sent: int, recv: int, seconds: float) -> None:
        s = self.ops.setdefault(op, OpStats(overlapped=getattr(_THREAD, "background", False)))
        s.calls += 1
        s.bytes_sent += int(sent)
        s.bytes_recv += int(recv)
        s.seconds += seconds

    def scratch(self, nbytes: int) -> None:
        """Note a communication scratch allocation (``-nbytes`` when it is freed)."""
        self.scratch_live += nbytes
        self.scratch_peak = max(self.scratch_peak, self.scratch_live)

    @property
    def bytes_sent(self) -> int:
        return sum(s.bytes_sent for s in self.ops.values())

    @property
    def bytes_recv(self) -> int:
        return sum(s.bytes_recv for s in self.ops.values())

    @property
    def seconds(self) -> float:
        """Seconds the rank's main thread spent communicating (overlapped calls left out)."""
        return sum(s.seconds for s in self.ops.values() if not s.overlapped)

    def reset(self) -> None:
        self.ops.clear()
        self.scratch_live = self.scratch_peak = 0

    def as_dict(self) -> dict:
        return {op: vars(s).copy() for op, s in self.ops.items()}


_COUNTERS = CommCounters()


def counters() -> CommCounters:
    """This process's (this rank's) communication counters."""
    return _COUNTERS


# --------------------------------------------------------------------------- per-step split


class StepRecorder:
    """Per step: wall time, time inside communication, compute (the rest) and busy time (the main
    thread's CPU time, which excludes waiting for peers or for a core)."""

    def __init__(self, device: torch.device, emit=None):
        self.device = device
        self.steps: list[dict] = []
        self._emit = emit

    @contextmanager
    def step(self, index: int) -> Iterator[dict]:
        c = counters()
        sync(self.device)
        t0, b0, comm0 = time.perf_counter(), time.thread_time(), c.seconds
        sent0, recv0 = c.bytes_sent, c.bytes_recv
        rec: dict = {"step": index, "start": time.time()}
        yield rec
        sync(self.device)
        wall = time.perf_counter() - t0
        comm = c.seconds - comm0
        rec.update(wall_s=wall, comm_s=comm, compute_s=max(0.0, wall - comm),
                   busy_s=min(wall, time.thread_time() - b0),
                   bytes_sent=c.bytes_sent - sent0, bytes_recv=c.bytes_recv - recv0)
        self.steps.append(rec)
        if self._emit is not None:
            self._emit("step", batched=True, **rec)  # batched with the next ones (WorkerContext.emit)

    def totals(self, skip_first: bool = False) -> dict:
        steps = self.steps[1:] if skip_first and len(self.steps) > 1 else self.steps
        keys = ("wall_s", "comm_s", "compute_s", "busy_s")
        return {k: sum(s[k] for s in steps) for k in keys}


# --------------------------------------------------------------------------- memory


def storage_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views and repeats counted once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def optimizer_tensors(optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    if optimizer is None:
        return []
    return [v for state in optimizer.state.values() for v in state.values()
            if isinstance(v, torch.Tensor)]


class ActivationMeter:
    """Bytes of the activations autograd keeps for backward, measured during forward; tensors sharing
    storage with a parameter count as params."""

    def __init__(self, exclude: Iterable[torch.Tensor] = ()):
        self._exclude_tensors = list(exclude)
        self._seen: dict[int, int] = {}
        self.peak = 0

    def _pack(self, t: torch.Tensor):
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr not in self._seen and ptr not in self._excluded():
            self._seen[ptr] = st.nbytes()
        return t

    def _excluded(self) -> set[int]:
        # Looked up at each saved tensor: ZeRO-3 allocates a layer's parameters just before use.
        return {t.untyped_storage().data_ptr() for t in self._exclude_tensors}

    @contextmanager
    def measure(self) -> Iterator["ActivationMeter"]:
        self._seen = {}
        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
            yield self
        self.peak = max(self.peak, sum(self._seen.values()))


def memory_report(model: torch.nn.Module | None = None, optimizer=None, activations: int = 0,
                  buffers: Iterable[torch.Tensor] = (), device: torch.device | None = None,
                  params: Iterable[torch.Tensor] | None = None,
                  grads: Iterable[torch.Tensor] | None = None) -> dict:
    """Inventoried bytes per category for the calling rank (see the module docstring)."""
    ps = list(params) if params is not None else (list(model.parameters()) if model else [])
    gs = list(grads) if grads is not None else [p.grad for p in ps]
    report = {
        "params": storage_bytes(ps),
        "grads": storage_bytes(gs),
        "optimizer": storage_bytes(optimizer_tensors(optimizer)),
        "activations": int(activations),
        "buffers": storage_bytes(buffers) + counters().scratch_peak,
    }
    report.update(device_memory(device))
    return report


def device_memory(device: torch.device | None) -> dict:
    """The allocator's view: CUDA current and peak bytes on GPU; the process RSS on CPU."""
    if device is not None and device.type == "cuda":
        return {"cuda_allocated": torch.cuda.memory_allocated(device),
                "cuda_peak": torch.cuda.max_memory_allocated(device)}
    return {"rss": _rss()}


def _rss() -> int:
    try:
        import psutil

        return psutil.Process().memory_info().rss
    except Exception:  # pragma: no cover - psutil is a dependency, this is belt and braces
        return 0


def per_rank_summary(rank: int, recorder: StepRecorder, memory: dict, skip_first: bool = True) -> dict:
    """The common ``per_rank`` entry of every experiment's JSON."""
    c = counters()
    t = recorder.totals(skip_first=skip_first)
    return {"rank": rank, "bytes_sent": c.bytes_sent, "bytes_recv": c.bytes_recv,
            "compute_s": t["compute_s"], "comm_s": t["comm_s"], "busy_s": t["busy_s"],
            "wall_s": t["wall_s"], "memory": memory, "ops": c.as_dict(), "steps": recorder.steps}
