"""The impact (chapter 7): one model and one data set trained through the milestones of chapters
1–6 on the same ranks — sync parameter server, ring data parallel, 1F1B pipeline, ZeRO-1/2/3, LAMB
at a large batch, PowerSGD compression on the real link and on an EMULATED slow one
(:func:`comm.set_link`) — same seed, same target loss.

Each milestone is its own experiment, run unchanged: its ``Config`` (built by :func:`plans`) and
its ``worker`` on every rank, its ``summarize`` afterwards. For each we record the time to reach
the target loss (a mean over ``window`` steps, so one lucky batch does not count; step 0's one-off
costs replaced by a median step), the steps it
took, the bytes the busiest rank moved per step (counted, sent + received), and each rank's
measured memory by category. Before the milestones, the ranks measure this machine — α and β
fit to our ring all-reduce, each rank's FLOP/s on the task's own step — so that the cost model of
chapter 7 can predict each milestone's step time from the same α-β formulas (:func:`predict`).
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
