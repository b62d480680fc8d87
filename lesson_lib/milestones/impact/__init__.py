"""The impact (chapter 7): one model and data set trained through chapters 1–6's milestones on the
same ranks, same seed, same target loss — PowerSGD also on an emulated slow link (:func:`comm.set_link`).

Each milestone runs unchanged (its ``Config`` from :func:`plans`, its ``worker``, its
``summarize``). Recorded: time to the target loss (a mean over ``window`` steps; step 0's one-off
costs replaced by a median step), steps, the busiest rank's bytes per step and measured memory.
α, β and FLOP/s measured first let the cost model predict each step time (:func:`predict`).
"""

from .milestone import (
    COMPRESSOR,
    LABELS,
    MILESTONES,
    NAME,
    OPTIMIZER,
    SIZES,
    Config,
    measure_machine,
    plans,
    worker,
)
from .predict import powersgd_sizes, predict, predict_compression
from .results import reached_at, record, slowest, smoothed, summarize

__all__ = [
    "COMPRESSOR", "LABELS", "MILESTONES", "NAME", "OPTIMIZER", "SIZES", "Config", "measure_machine",
    "plans", "powersgd_sizes", "predict", "predict_compression", "reached_at", "record", "slowest",
    "smoothed", "summarize", "worker",
]
