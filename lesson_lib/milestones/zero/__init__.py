"""ZeRO (chapter 4): stop storing everything everywhere (Rajbhandari et al., SC 2020).

Data-parallel Adam where each of N ranks keeps only its 1/N share of the model states:
stage 1 shards the optimizer state, stage 2 also the gradients, stage 3 also the parameters.

How we shard: each layer's parameters live in one flat buffer, padded to a multiple of N; rank r
owns the contiguous slice r of every layer (``chunk_bounds``), like PyTorch's FSDP units. Every
collective is our ring over point-to-point (``comm.ring_reduce_scatter`` / ``comm.ring_all_gather``),
so traffic is counted exactly and the sums happen in the same order at every stage — the stages
agree bit for bit.

Per step, per rank (Ψ parameters):
* stage 0: reduce-scatter + all-gather the gradients (an all-reduce), full Adam step   — 2Ψ
* stage 1: reduce-scatter the gradients, Adam on my shard, all-gather the parameters   — 2Ψ
* stage 2: as stage 1, but only my gradient shard outlives the step                    — 2Ψ
* stage 3: before each layer's forward, all-gather its parameters and free them after;
  gather them again before its backward; reduce-scatter its gradient as soon as it is
  complete and free both; Adam on my shard                                              — 3Ψ
So a stage-3 rank holds one layer's full parameters and gradient at a time (module hooks do it);
with ``prefetch = d`` the forward gathers d layers ahead on a communication thread (d + 1 at once).
Stage 2 builds the whole gradient before scattering it, unless ``bucket_mb > 0``: then, as in real
ZeRO-2, layers' gradients are grouped into buckets reduce-scattered during the backward on a
communication thread and freed, and a layer's gradient is allocated only once the gradients not yet
scattered fit in one bucket — so at most one bucket plus one layer of full gradients exist at a
time (:func:`scatter_during_backward`). Mixed precision keeps bf16 parameters and gradients (CPU
has no fast fp16) and an fp32 master copy with Adam's moments: K = 12 bytes per parameter.

:mod:`.fsdp` runs PyTorch's FSDP2 (``fully_shard``, Zhao et al., VLDB 2023) on the same model and
batches as stage 3, and maps our steps to its own; :mod:`.checkpoint` saves its sharded state with
``torch.distributed.checkpoint``, kills a rank, and resumes on fresh processes (section 9);
:mod:`.hsdp` runs FSDP2 on a device mesh: hybrid sharding (HSDP), the precision gradients are
reduced in, and its backward prefetch (section 8); :mod:`.loss_scaling` shows why fp16 needs a loss
scale and bf16 does not (section 10).
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
