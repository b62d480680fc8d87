"""Peak memory a rank really allocated, measured without knowing what it allocated (chapter 4).

:func:`lesson_lib.metrics.memory_report` is an *inventory*: it adds up the storages the code knows
it holds, so it agrees with the ZeRO formulas nearly by construction and never sees a temporary.
:class:`PeakMemory` asks the system instead:

* **GPU** — the CUDA caching allocator's ``max_memory_allocated``, its peak reset when the window
  opens; the footprint is that peak minus what was allocated before the model was built.
* **CPU** — the kernel's own high-water mark of the process's resident memory (``VmHWM`` in
  ``/proc/self/status``), reset when the window opens by writing ``5`` to ``/proc/self/clear_refs``.
  The kernel updates it on every page it maps, so unlike a thread polling the RSS every few ms it
  misses no short spike (Adam's temporaries live for microseconds), costs nothing during the steps,
  and unlike ``torch.profiler(profile_memory=True)`` needs no walk over millions of events. Where
  the file cannot be written (not Linux, a locked-down kernel) a sampler thread polls the RSS every
  millisecond instead, and ``method`` says so. Before the baseline and before the window opens,
  ``malloc_trim(0)`` hands memory glibc freed but kept back to the system, so memory cached from an
  earlier run in the same (warm) worker is not already counted in the baseline.

The CPU footprint (peak RSS during the steps minus the RSS before the model was built) **includes**
everything the process touched: the model states, the gathered full parameters and gradients of a
ZeRO-3 layer, reduce-scatter and all-gather buffers, activations, Adam's temporaries, the data set,
Gloo's buffers, malloc's caching of freed blocks and Python objects. It **misses** memory allocated
but never written (``torch.empty`` pages the kernel has not mapped yet), and pages that were resident
before the baseline and reused (the interpreter and torch themselves, which is the point of the
baseline). It is the rank's training footprint, not the model states alone: it can only be larger
than the inventory of the model states, never smaller, which is what chapter 4 checks.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import threading
from pathlib import Path

import torch

_STATUS, _CLEAR = Path("/proc/self/status"), Path("/proc/self/clear_refs")


def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:  # pragma: no cover - not glibc
        return None


_LIBC = _libc()


def trim() -> None:
    """Collect garbage and give memory malloc keeps cached back to the system (glibc only)."""
    gc.collect()
    if _LIBC is not None and hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)


def _status_kb(field: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:  # pragma: no cover - not Linux
        return None
    return None


def rss() -> int:
    """The process's resident bytes now (0 where it cannot be read)."""
    return _status_kb("VmRSS") or 0


def _reset_hwm() -> bool:
    try:
        _CLEAR.write_text("5")
    except OSError:
        return False
    hwm, now = _status_kb("VmHWM"), _status_kb("VmRSS")
    return hwm is not None and now is not None and hwm <= now + (1 << 20)


class PeakMemory:
    """``base()`` before the model is built, ``with window():`` around the training steps, then
    ``footprint`` (bytes: the peak during the window minus the baseline) and ``as_dict()``."""

    def __init__(self, device: torch.device | None = None, poll_s: float = 0.001):
        self.cuda = device is not None and device.type == "cuda"
        self.device, self.poll_s = device, poll_s
        self.baseline = self.peak = 0
        self.method = "cuda max_memory_allocated" if self.cuda else "VmHWM"

    def _now(self) -> int:
        return torch.cuda.memory_allocated(self.device) if self.cuda else rss()

    def base(self) -> "PeakMemory":
        trim()
        self.baseline = self._now()
        return self

    def window(self) -> "_Window":
        return _Window(self)

    @property
    def footprint(self) -> int:
        return max(0, self.peak - self.baseline)

    def as_dict(self) -> dict:
        return {"measured_peak": self.footprint, "measured_baseline": self.baseline,
                "measured_method": self.method}


class _Window:
    def __init__(self, pm: PeakMemory):
        self.pm, self._stop, self._thread, self._max = pm, threading.Event(), None, 0

    def __enter__(self) -> PeakMemory:
        pm = self.pm
        trim()
        if pm.cuda:
            torch.cuda.synchronize(pm.device)
            torch.cuda.reset_peak_memory_stats(pm.device)
        elif not _reset_hwm():
            pm.method = "RSS sampled every %g ms" % (1e3 * pm.poll_s)
            self._max = rss()
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()
        return pm

    def _poll(self) -> None:
        while not self._stop.wait(self.pm.poll_s):
            self._max = max(self._max, rss())

    def __exit__(self, *exc) -> None:
        pm = self.pm
        if pm.cuda:
            torch.cuda.synchronize(pm.device)
            peak = torch.cuda.max_memory_allocated(pm.device)
        elif self._thread is not None:
            self._stop.set()
            self._thread.join()
            peak = max(self._max, rss())
        else:
            peak = _status_kb("VmHWM") or 0
        pm.peak = max(pm.peak, peak)
