"""The cost model: memory, traffic and time of training, from formulas (chapters 0, 2, 4 and 7).

* :mod:`.terms` — one formula per quantity, and the device and link tables
* :mod:`.alphabeta` — the alpha-beta model of each all-reduce, fits, crossovers, bus bandwidth
* :mod:`.plan` — :class:`Plan`, one training job, and each milestone's changes
* :mod:`.tensor` — the tensor-parallel term (chapter 8)
* :mod:`.compute` — FLOPs (model and hardware, MFU and HFU) and activations under each recomputation
* :mod:`.parallel` — ZeRO-3's gathers per micro-batch, context- and expert-parallel collectives
* :mod:`.planner` — memory, step time and days of a Plan
* :mod:`.report` — a Plan's assumptions in words, tables and JSON
* :mod:`.calibrate` — the one calibration (SC21 Table 1) and the held-out published runs
* :mod:`.cli` — ``python -m lesson_lib estimate``
"""

from .alphabeta import (
    allreduce_terms,
    allreduce_time,
    bus_bandwidth,
    fit_alpha_beta,
    fit_point_to_point,
    latency_crossover_bytes,
    ring_beats_tree_bytes,
)
from .calibrate import compare, compare_all, comparison_table, fit_efficiency
from .cli import cli_estimate
from .compute import (
    layer_activation_bytes,
    model_flops_per_token,
    pipeline_layers_held,
    recompute_flops_per_token,
    sc21_eq3_flops,
)
from .parallel import context_parallel_terms, expert_parallel_terms, zero3_terms
from .plan import MILESTONE_PLANS, MILESTONES, RECOMPUTE, TERMS, Plan, published_plan
from .planner import estimate, flops, memory, milestones, plan_for, step_time
from .report import assumptions, table, to_json
from .tensor import tensor_parallel_terms, tensor_parallel_time
from .terms import (
    CALIBRATED_EFFICIENCY,
    PRECISIONS,
    accelerators,
    activation_bytes,
    bubble_formula,
    days_from_throughput,
    devices,
    devices_needed,
    fits,
    links,
    memory_bill,
    ps_terms,
    ps_time,
    published,
    recompute_activation_bytes,
    ring_time,
    server_memory,
    zero_memory,
    zero_traffic,
)

__all__ = [
    "CALIBRATED_EFFICIENCY", "RECOMPUTE", "compare", "compare_all", "comparison_table",
    "context_parallel_terms", "expert_parallel_terms", "fit_efficiency", "flops", "layer_activation_bytes",
    "model_flops_per_token",
    "pipeline_layers_held", "recompute_flops_per_token", "sc21_eq3_flops", "zero3_terms",
    "MILESTONES", "MILESTONE_PLANS", "PRECISIONS", "TERMS", "Plan", "accelerators", "activation_bytes",
    "allreduce_terms", "allreduce_time", "assumptions", "bubble_formula", "bus_bandwidth", "cli_estimate",
    "days_from_throughput", "devices", "devices_needed", "estimate", "fit_alpha_beta",
    "fit_point_to_point", "fits", "latency_crossover_bytes", "links", "memory", "memory_bill",
    "milestones", "plan_for", "ps_terms", "ps_time", "published", "published_plan",
    "recompute_activation_bytes", "ring_beats_tree_bytes", "ring_time", "server_memory", "step_time", "table",
    "tensor_parallel_terms", "tensor_parallel_time", "to_json", "zero_memory", "zero_traffic",
]
