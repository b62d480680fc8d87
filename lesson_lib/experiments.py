"""The experiment registry and the one path every run takes:

notebook cell or CLI → milestone ``Config`` → ``Cluster.run(milestone.worker, cfg)`` → events →
per-rank dicts → ``milestone.summarize`` → :class:`Result` → plots.

A milestone module has ``NAME``, a ``Config`` (a :class:`~lesson_lib.config.CommonConfig`),
``worker(cfg) -> dict`` (at least ``losses`` and ``per_rank``), ``summarize(cfg, outs) -> dict``
and usually ``reference(cfg)``, the single-process answer. ``summarize`` may return typed records
(dataclasses with ``to_dict``, as chapter 8's :class:`~.milestones.tensor_parallel.GridRankResult`):
:class:`Result` keeps them typed, its JSON file holds their dicts.
"""

from __future__ import annotations

import importlib
import json
import math
import statistics
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any, Callable

from .results import RankResult
from .runtime import Cluster, warm_cluster

EXPERIMENTS = {
    "data-parallel": "lesson_lib.milestones.data_parallel",
    "parameter-server": "lesson_lib.milestones.parameter_server",
    "zero": "lesson_lib.milestones.zero",
    "ring-allreduce": "lesson_lib.milestones.ring_allreduce",
    "pipeline": "lesson_lib.milestones.pipeline",
    "large-batch": "lesson_lib.milestones.large_batch",
    "impact": "lesson_lib.milestones.impact",
    "compression": "lesson_lib.milestones.compression",
    # the package's own ``Config`` is the transformer's: the experiment is its milestone module
    "tensor-parallel": "lesson_lib.milestones.tensor_parallel.milestone",
}


def names() -> list[str]:
    return sorted(EXPERIMENTS)


def load(name: str):
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; choose one of: {', '.join(names())}")
    return importlib.import_module(EXPERIMENTS[name])


@dataclass
class Result:
    """What every experiment returns; ``to_dict()`` is the ``--json`` file."""

    experiment: str
    world_size: int
    backend: str
    config: dict
    losses: list[float]
    per_rank: list[RankResult]
    """One typed record per rank (dicts as the ranks return them are converted once, here)."""
    extra: dict = field(default_factory=dict)
    oversubscribed: bool = False

    def __post_init__(self):
        self.per_rank = [RankResult.of(p) for p in self.per_rank]

    def to_dict(self) -> dict:
        return {"experiment": self.experiment, "world_size": self.world_size,
                "backend": self.backend, "config": self.config, "losses": self.losses,
                "per_rank": [p.to_dict() for p in self.per_rank], "oversubscribed": self.oversubscribed,
                **{k: _plain(v) for k, v in self.extra.items()}}

    def save_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    def __getitem__(self, key: str) -> Any:
        """A key of the ``--json`` file: a milestone's own (``extra``) or a field, without building it."""
        if key in self.extra:
            return self.extra[key]
        if key in _FIELDS:
            return getattr(self, key)
        raise KeyError(key)

    def step_times(self) -> list[float]:
        """Per step, the slowest rank's wall time (a synchronous step ends with the slowest)."""
        steps = zip(*(r.steps for r in self.per_rank if r.steps))
        return [max(s.wall_s for s in per_step) for per_step in steps]

    def median_step_time(self) -> float:
        """Median over steps (the warm-up step 0 skipped) of the slowest rank's step time; NaN for a
        run that recorded no steps (the impact experiment keeps its milestones' own records)."""
        times = self.step_times()
        return statistics.median(times[1:] or times) if times else math.nan

    def median_step(self, key: str, skip_first: bool = True) -> list[float]:
        """Per rank, the median over steps of ``key`` (``wall_s``, ``comm_s``, ``busy_s``...).

        The first step is skipped by default: it pays one-off costs (allocations, warm-up).
        """
        return [r.median(key, skip_first) for r in self.per_rank]

    def summary(self) -> str:
        head = f"{self.experiment}: {self.world_size} rank(s), {self.backend}"
        if self.losses:
            head += f", loss {self.losses[0]:.4f} → {self.losses[-1]:.4f}"
        lines = [head, f"{'rank':>4} {'sent MB':>9} {'recv MB':>9} {'compute s':>10} {'comm s':>8} "
                       f"{'busy s':>8} {'params MB':>10} {'optim MB':>9}"]
        for r in self.per_rank:
            m = r.memory
            lines.append(f"{r.rank:>4} {r.bytes_sent / 1e6:>9.3f} {r.bytes_recv / 1e6:>9.3f} "
                         f"{r.compute_s:>10.3f} {r.comm_s:>8.3f} {r.busy_s:>8.3f} "
                         f"{m['params'] / 1e6:>10.3f} {m['optimizer'] / 1e6:>9.3f}")
        return "\n".join(lines)


def _plain(value: Any) -> Any:
    """A milestone's typed records in ``extra`` (dataclasses, in lists too) as the JSON file's dicts."""
    if is_dataclass(value) and not isinstance(value, type):
        return value.to_dict() if hasattr(value, "to_dict") else asdict(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


_FIELDS = ("experiment", "world_size", "backend", "config", "losses", "per_rank", "oversubscribed")


def run(name: str, cfg=None, cluster=None, on_event: Callable[[dict], None] | None = None,
        **options) -> Result:
    """Run experiment ``name`` with ``cfg`` (or keyword options) on ``cluster``.

    Without a cluster, one is started for this run and closed after it.
    """
    mod = load(name)
    if cfg is None:
        cfg = mod.Config(**options)
    elif options:
        raise TypeError("pass either cfg or keyword options, not both")
    elif not isinstance(cfg, mod.Config):
        raise TypeError(f"cfg must be a {mod.__name__}.Config, got {type(cfg).__name__}")
    cfg.validate()
    own = cluster is None
    if own:
        cluster = Cluster(cfg.world_size, cfg.backend, timeout_s=cfg.timeout_s, quiet=True)
    elif cluster.world_size != cfg.world_size:
        raise ValueError(f"world_size={cfg.world_size} but the cluster has {cluster.world_size} ranks")
    try:
        outs = cluster.run(mod.worker, cfg, on_event=on_event)
    finally:
        if own:
            cluster.close()
    extra = mod.summarize(cfg, outs)
    return Result(experiment=mod.NAME, world_size=cfg.world_size, backend=cluster.backend,
                  config=cfg.as_dict(), losses=extra.pop("losses", outs[0]["losses"]),
                  per_rank=[o["per_rank"] for o in outs], extra=extra,
                  oversubscribed=cluster.oversubscribed)


def experiment_of(cfg) -> str:
    """The registered experiment whose ``Config`` ``cfg`` is."""
    for name in names():
        if type(cfg) is load(name).Config:
            return name
    raise TypeError(f"{type(cfg).__module__}.{type(cfg).__name__} is no experiment's Config")


def run_warm(cfg, live=None, label: str | None = None, ranks: int | None = None,
             loss_rank: int = 0, on_event: Callable[[dict], None] | None = None) -> Result:
    """Run ``cfg``'s experiment on the kernel's warm cluster of ``cfg.world_size`` ranks.

    ``live`` (a ``plots.common.LiveRuns``) streams the steps as ``label``; ``ranks`` report steps
    (default all) and ``loss_rank`` carries the loss; ``on_event`` takes the events instead."""
    name = experiment_of(cfg)
    cfg.validate()
    if live is not None:
        on_event = live.track(label or name, cfg.steps, ranks or cfg.world_size, loss_rank=loss_rank)
    cluster = warm_cluster(cfg.world_size, cfg.backend, timeout_s=cfg.timeout_s)
    result = run(name, cfg, cluster=cluster, on_event=on_event)
    if live is not None:
        live.finish(label or name)  # every event is in: a run that stopped early is drawn in full too
    return result
