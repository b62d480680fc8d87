"""Pipeline parallelism (chapter 3): the model's layers cut into P stages, one per rank.

Activations flow forward and gradients back point-to-point (:mod:`.comm`); M micro-batches keep
the stages busy but for the bubble. Schedules are pure functions: naive, GPipe (Huang et al., 2019)
and 1F1B (Narayanan et al., 2021) in :mod:`.schedules`; interleaved 1F1B (Narayanan et al., 2021)
in :mod:`.interleaved` / :mod:`.interleaved_stage`; ZB-H1 (Qi et al., 2024) in :mod:`.zero_bubble`
/ :mod:`.zero_bubble_stage`.

A layer is one ``Linear`` with its ``ReLU`` (``depth + 1`` layers), balanced by parameters or
measured time. Losses are scaled by 1/M, so training equals single-process SGD (``reference``) up
to rounding. Activation memory is inventoried (``ActivationMeter``), measured with ``peak_memory``;
``recompute`` keeps only each stage's input (:func:`stage_forward`).
"""

from .config import BALANCES, NAME, Config
from .results import gaps, reference, state, summarize, verify
from .stage import build_stage, layer_units, model_layers, param_costs, stage_forward, train_stage, worker

__all__ = [
    "BALANCES", "NAME", "Config", "build_stage", "gaps", "layer_units", "model_layers",
    "param_costs", "reference", "stage_forward", "state", "summarize", "train_stage", "verify", "worker",
]
