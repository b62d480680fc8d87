"""A run's per-rank records, typed: :class:`~lesson_lib.experiments.Result` turns each rank's plain dict
into a :class:`RankResult`. Indexing by key (``r["bytes_sent"]``) still works, as in the JSON files.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field, fields
from typing import Any


class _Keyed:
    """``obj["name"]`` is ``obj.name``; ``obj.get("name", default)`` as a dict's."""

    def __getitem__(self, key: str) -> Any:
        if key in self._names():
            return getattr(self, key)
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        value = getattr(self, key, None) if key in self._names() else None
        return default if value is None else value

    def __contains__(self, key: str) -> bool:
        return key in self._names() and getattr(self, key) is not None

    @classmethod
    def _names(cls) -> set[str]:
        return {f.name for f in fields(cls)}


@dataclass
class Step(_Keyed):
    """One step on one rank, as ``metrics.StepRecorder`` timed it."""

    step: int
    wall_s: float
    """Wall-clock time of the step."""
    comm_s: float
    """Time inside the counted communication calls."""
    compute_s: float
    """``wall_s − comm_s``: everything else."""
    busy_s: float
    """CPU time of the rank's main thread: excludes waiting for peers, and for a core."""
    bytes_sent: int = 0
    bytes_recv: int = 0
    start: float = 0.0
    """``time.time()`` when the step began (ranks' clocks agree on one machine)."""
    loss: float | None = None
    """The step's training loss, where the milestone records it per step."""
    lr: float | None = None
    """The learning rate of the step (large-batch training)."""
    samples: int | None = None
    """Samples seen by the end of the step, all ranks together (large-batch training)."""
    runqueue_s: float | None = None
    """Time runnable but waiting for a core (Linux's run queue), where measured (data parallel)."""

    @classmethod
    def of(cls, d: dict | Step) -> Step:
        return d if isinstance(d, Step) else cls(**d)  # a key no field holds is a TypeError: add the field


@dataclass
class RankResult(_Keyed):
    """One rank's record of a run: its counted traffic, its time and its memory."""

    rank: int
    bytes_sent: int
    bytes_recv: int
    compute_s: float
    comm_s: float
    busy_s: float
    wall_s: float
    """Totals over the steps (the first skipped where the milestone says so)."""
    memory: dict[str, int]
    """Bytes by category: an inventory (params, grads, optimizer...) and, where the allocator was
    watched, ``measured_peak``."""
    ops: dict[str, dict]
    """Per counted operation (``grad_all_reduce``...): its calls, bytes and seconds."""
    steps: list[Step] = field(default_factory=list)
    """Empty for a rank that runs no steps of its own (a parameter server)."""

    @classmethod
    def of(cls, d: dict | RankResult) -> RankResult:
        if isinstance(d, RankResult):
            return d
        return cls(**{**d, "steps": [Step.of(s) for s in d.get("steps", [])]})

    def median(self, key: str, skip_first: bool = True) -> float:
        """The median over steps of ``key`` (``wall_s``, ``busy_s``...), the warm-up step skipped."""
        steps = self.steps[1:] if skip_first and len(self.steps) > 1 else self.steps
        return statistics.median(getattr(s, key) for s in steps) if steps else float("nan")

    def to_dict(self) -> dict:
        out = asdict(self)
        out["steps"] = [{k: v for k, v in s.items() if v is not None} for s in out["steps"]]
        return out
