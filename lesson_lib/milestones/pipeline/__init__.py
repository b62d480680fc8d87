"""Pipeline parallelism (chapter 3): cut the model's layers into P stages, one stage per rank.

Like an assembly line, stage k owns a run of consecutive layers; activations flow forward from
stage k to k+1 and gradients flow back, point-to-point (:mod:`.comm`). Splitting the batch
into M micro-batches lets stage k work on micro-batch i+1 while stage k+1 works on i, so most
stages are busy most of the time; what is left idle is the *bubble*, (P−1)/(M+P−1) of each stage's
time with equal stages. Schedules (who does which forward and backward when) are pure functions in
:mod:`.schedules`: naive, GPipe (Huang et al., 2019) and 1F1B (Narayanan et al., 2021); interleaved
1F1B (Narayanan et al., 2021, SC21), v model chunks per rank, in :mod:`.interleaved`, its rank's loop
in :mod:`.interleaved_stage` (``schedule="interleaved"``, ``chunks``); ZB-H1 (Qi et al., 2024), each
backward split into B (the input's gradient) and W (the weights'), in :mod:`.zero_bubble`, its
rank's loop in :mod:`.zero_bubble_stage` (``schedule="zb-h1"``).

The model is :func:`lesson_lib.models.mlp`; a *layer* here is one ``Linear`` together with the
``ReLU`` after it, so the model has ``depth + 1`` layers to cut. Stages are balanced by parameter
count or by measured forward+backward time per layer. Each micro-batch's loss is scaled by 1/M, so
the gradients summed over micro-batches are the gradients of the whole batch's mean loss, and
training equals single-process SGD on the unsplit model (``reference``) up to float rounding.
Memory is inventoried: each micro-batch's saved activations (``ActivationMeter``) are live from its
forward until its backward finishes; the peak over the schedule is the stage's activation memory.
With ``peak_memory`` it is also measured (the allocator's peak, :mod:`lesson_lib.peakmem`); with
``recompute`` each stage keeps only its input per micro-batch (:func:`stage_forward`).
"""

from .config import BALANCES, NAME, Config
from .results import gaps, reference, state, summarize, verify
from .stage import build_stage, layer_units, model_layers, param_costs, stage_forward, train_stage, worker

__all__ = [
    "BALANCES", "NAME", "Config", "build_stage", "gaps", "layer_units", "model_layers",
    "param_costs", "reference", "stage_forward", "state", "summarize", "train_stage", "verify", "worker",
]
