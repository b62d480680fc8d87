"""ZeRO (chapter 4; Rajbhandari et al., SC 2020): each of N ranks keeps 1/N of the model states —
stage 1 the optimizer state, stage 2 also the gradients, stage 3 also the parameters.

Each layer's parameters live in one flat buffer padded to a multiple of N; rank r owns slice r.
Every collective is our counted ring, summing in the same order at every stage, so the stages agree
bit for bit. Traffic per step: 2Ψ for stages 0–2, 3Ψ for stage 3. Stage 3 gathers a layer's
parameters before its forward and backward (``prefetch = d``: d layers ahead); stage 2 with
``bucket_mb > 0`` reduce-scatters buckets during the backward (:func:`scatter_during_backward`).
Mixed precision keeps bf16 parameters and gradients and fp32 master and Adam (K = 12).

Also: :mod:`.fsdp` (PyTorch's FSDP2), :mod:`.checkpoint` (sharded checkpoints and a killed rank),
:mod:`.hsdp` (FSDP2 on a device mesh), :mod:`.loss_scaling` (fp16 vs bf16).
"""

from . import checkpoint, fsdp, hsdp
from .fsdp import fsdp2_worker
from .milestone import NAME, Config, param_count, summarize, worker
from .references import layerwise_reference, reference, torch_zero_reference
from .shards import Flat, Prefetch, Transients, fetch_layer_by_layer, scatter_during_backward, sharded_step

__all__ = [
    "NAME", "Config", "Flat", "Transients", "checkpoint", "fetch_layer_by_layer", "fsdp", "fsdp2_worker",
    "hsdp", "layerwise_reference", "param_count", "Prefetch",
    "reference", "scatter_during_backward", "sharded_step", "summarize", "torch_zero_reference", "worker",
]
