"""Every figure of the course is drawn here, from data a milestone returned (or streams).

A milestone returns data; a plot draws data. Live figures are plotly ``FigureWidget`` objects fed
by worker events; under nbval (no browser) the same code runs and simply renders nothing live.
Where ranks outnumber cores, figures say so and show per-rank busy time beside wall time.
One module per kind of figure, each reached the same way: ``plots.<module>.<figure>``
(``plots.training.timeline``, ``plots.common.LiveRuns``).
"""

from . import (
    alpha_beta,
    checkpoint,
    collectives,
    common,
    compression,
    consistency,
    impact,
    large_batch,
    memory,
    parallelism,
    pipeline,
    precision,
    training,
)

__all__ = ["alpha_beta", "checkpoint", "collectives", "common", "compression", "consistency", "impact",
           "large_batch", "memory", "parallelism", "pipeline", "precision", "training"]
