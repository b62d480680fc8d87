"""Every figure of the course, drawn from data a milestone returned (or streams).

Live figures are plotly ``FigureWidget`` objects fed by worker events. Where ranks outnumber
cores, figures say so and show busy time beside wall time. One module per kind of figure:
``plots.<module>.<figure>`` (``plots.training.timeline``, ``plots.common.LiveRuns``).
"""

from . import (
    alpha_beta,
    checkpoint,
    collectives,
    common,
    compression,
    consistency,
    fp8,
    impact,
    large_batch,
    live,
    memory,
    parallelism,
    pipeline,
    precision,
    resilience,
    training,
)

__all__ = ["alpha_beta", "checkpoint", "collectives", "common", "compression", "consistency", "fp8", "impact",
           "large_batch", "live", "memory", "parallelism", "pipeline", "precision", "resilience",
           "training"]
