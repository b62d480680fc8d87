"""The cost model: memory, traffic and time of training, from formulas (chapters 0, 2, 4 and 7).

* :mod:`.terms` — one formula per quantity, and the device and link tables
* :mod:`.alphabeta` — the alpha-beta model of each all-reduce, fits, crossovers, bus bandwidth
* :mod:`.plan` — :class:`Plan`, one training job, and each milestone's changes
* :mod:`.tensor` — the tensor-parallel term (chapter 8)
* :mod:`.planner` — memory, step time and days of a Plan; ``python -m lesson_lib estimate``
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
from .plan import MILESTONE_PLANS, MILESTONES, TERMS, Plan, published_plan
from .planner import (
    assumptions,
    cli_estimate,
    estimate,
    memory,
    milestones,
    plan_for,
    step_time,
    table,
    to_json,
)
from .tensor import tensor_parallel_terms, tensor_parallel_time
from .terms import (
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
    "MILESTONES", "MILESTONE_PLANS", "PRECISIONS", "TERMS", "Plan", "accelerators", "activation_bytes",
    "allreduce_terms", "allreduce_time", "assumptions", "bubble_formula", "bus_bandwidth", "cli_estimate",
    "days_from_throughput", "devices", "devices_needed", "estimate", "fit_alpha_beta",
    "fit_point_to_point", "fits", "latency_crossover_bytes", "links", "memory", "memory_bill",
    "milestones", "plan_for", "ps_terms", "ps_time", "published", "published_plan",
    "recompute_activation_bytes", "ring_beats_tree_bytes", "ring_time", "server_memory", "step_time", "table",
    "tensor_parallel_terms", "tensor_parallel_time", "to_json", "zero_memory", "zero_traffic",
]
