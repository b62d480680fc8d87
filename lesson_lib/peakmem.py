"""The peak of the bytes a rank allocated, counted by torch's allocator (chapter 4): a measurement,
unlike :mod:`lesson_lib.metrics`' inventory, and the CPU counterpart of
``torch.cuda.max_memory_allocated``.

* CPU: the allocation and free events torch's allocator reports to a light (legacy) profiler
  session on the rank's thread and on each helper thread (``thread()``), merged in time order. A
  free counts only if a block of its size was allocated in the window and is still alive.
* GPU: ``memory_allocated`` / ``max_memory_allocated``.

Why not the resident set, and what this does not see: docs/design.md, "Peak memory".
"""

from __future__ import annotations

import gc
import threading
from collections import Counter
from contextlib import contextmanager
from typing import Iterator

import torch
from torch._C._profiler import ProfilerConfig, _ExperimentalConfig

from .comm import release_buffers
from .data import forget_permutations

_MARK = "lesson_lib.peakmem.reset"


def _profile_config() -> ProfilerConfig:  # CPU only, memory events on, no shapes or stacks
    return ProfilerConfig(torch.autograd.ProfilerState.CPU, False, True, False, False, False,
                          _ExperimentalConfig())


class PeakMemory:
    """``with PeakMemory(device) as peak:`` around a run; :meth:`reset_peak` where the peak starts,
    :meth:`stop` where it ends (else the ``with``'s end). :meth:`as_dict`: ``measured_peak`` (most
    bytes alive at once after the reset) and ``measured_at_reset``."""

    def __init__(self, device: torch.device | None = None):
        self.cuda = device is not None and device.type == "cuda"
        self.device = device
        self.method = ("CUDA allocator (max_memory_allocated)" if self.cuda
                       else "torch CPU allocator events (profiler, profile_memory)")
        self.peak = self.at_reset = 0
        self._events: list[list] = []  # per thread session: [(start_us, nbytes)] in order
        self._lock = threading.Lock()
        self._reset_us: float | None = None
        self._base = 0
        self._closed = False

    # -- the window, on the rank's thread
    def __enter__(self) -> "PeakMemory":
        # Collect garbage and drop the comm layer's buffers now: start as a fresh process would.
        release_buffers()
        forget_permutations()  # the data's cached shuffles, too
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self._open()
        return self

    def reset_peak(self) -> None:
        """The peak counts from here on (what is alive now is part of it)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self.at_reset = torch.cuda.memory_allocated(self.device) - self._base
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            with torch.profiler.record_function(_MARK):
                pass

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """Close the window early (what follows is not counted); ``with`` calls it otherwise."""
        if self._closed:
            return
        self._closed = True
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self.peak = max(self.at_reset, torch.cuda.max_memory_allocated(self.device) - self._base)
            return
        self._close(main=True)
        self.peak, self.at_reset = self._replay()

    @contextmanager
    def thread(self) -> Iterator[None]:
        """Count the allocations of another thread too (CPU; on GPU the allocator sees them all)."""
        if self.cuda:
            yield
            return
        self._open()
        try:
            yield
        finally:
            self._close()

    # -- CPU: profiler sessions and their replay
    def _open(self) -> None:
        torch._C._autograd._enable_profiler_legacy(_profile_config())

    def _close(self, main: bool = False) -> None:
        events, mine = torch._C._autograd._disable_profiler_legacy(), []
        for e in (e for thread in events for e in thread):
            if e.kind() == "memory_alloc":
                mine.append((e.start_us(), e.cpu_memory_usage()))
            elif main and e.kind() == "push" and e.name() == _MARK and self._reset_us is None:
                self._reset_us = e.start_us()
        with self._lock:
            self._events.append(mine)

    def _replay(self) -> tuple[int, int]:
        """Live bytes through the window in time order: (peak after the reset, live at the reset)."""
        merged = sorted((t, k, i, b) for k, s in enumerate(self._events) for i, (t, b) in enumerate(s))
        reset = self._reset_us if self._reset_us is not None else float("-inf")
        live = peak = at_reset = 0
        open_sizes: Counter = Counter()
        before = True
        for t, _, _, b in merged:
            if before and t >= reset:
                before, at_reset, peak = False, live, live
            if b > 0:
                open_sizes[b] += 1
                live += b
            elif open_sizes[-b] > 0:  # a block allocated in this window (else: an earlier run's)
                open_sizes[-b] -= 1
                live += b
            if not before:
                peak = max(peak, live)
        if before:
            at_reset = peak = live
        return peak, at_reset

    def as_dict(self) -> dict:
        return {"measured_peak": int(self.peak), "measured_at_reset": int(self.at_reset),
                "measured_method": self.method}
