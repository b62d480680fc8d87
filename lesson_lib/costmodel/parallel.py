"""The collectives of ZeRO-3/FSDP, context parallelism and expert parallelism, as (a, b) such that
they take a·α + b·β on their link (chapters 4 and 8; :mod:`.planner` prices them).
"""

from __future__ import annotations


def _positive(**values) -> None:
    for name, v in values.items():
        if not v >= 0:
            raise ValueError(f"{name} must be non-negative, got {v!r}")


def zero3_terms(ranks: int, param_bytes: float, grad_bytes: float, blocks: float,
                microbatches: float) -> tuple[float, float]:
    """ZeRO-3 / FSDP over ``ranks``: every micro-batch all-gathers each block's parameters for its
    forward and again for its backward, and reduce-scatters its gradients (Rajbhandari et al., 2020,
    §5.3; DeepSpeed and FSDP without ``no_sync``): 3 ring collectives of N−1 steps per block and
    micro-batch, (N−1)/N·(2·P + G) bytes per micro-batch. One micro-batch per step is the 1.5× of a
    plain all-reduce (chapter 4); M micro-batches are M times that."""
    _positive(param_bytes=param_bytes, grad_bytes=grad_bytes, blocks=blocks, microbatches=microbatches)
    n = ranks
    if n <= 1:
        return 0.0, 0.0
    return 3 * blocks * (n - 1) * microbatches, (n - 1) / n * (2 * param_bytes + grad_bytes) * microbatches


def context_parallel_terms(context: int, kv_bytes: float, blocks: float, microbatches: float,
                           algorithm: str = "all-gather", recompute: bool = False) -> tuple[float, float]:
    """Context parallelism over c ranks, each holding s/c of a sequence: attention needs every
    rank's keys and values. all-gather (Llama 3, Dubey et al., 2024, §3.3.2): per block the K/V of the
    whole sequence gathered in the forward ((c−1)/c of ``kv_bytes``, the full K+V tensor) and their
    gradients reduce-scattered in the backward; ring (ring attention, Liu et al., 2023): c−1 steps
    passing one rank's K/V block in the forward, and K/V with their gradients in the backward — the
    same bytes forward, twice backward, in c−1 messages each. Full recomputation repeats the
    forward's exchange."""
    _positive(kv_bytes=kv_bytes, blocks=blocks, microbatches=microbatches)
    if algorithm not in ("all-gather", "ring"):
        raise ValueError(f"algorithm must be 'all-gather' or 'ring', got {algorithm!r}")
    c = context
    if c <= 1:
        return 0.0, 0.0
    forward = 2 if recompute else 1
    backward = 1 if algorithm == "all-gather" else 2
    per = (forward + backward) * (c - 1), (forward + backward) * (c - 1) / c * kv_bytes
    return blocks * microbatches * per[0], blocks * microbatches * per[1]


def expert_parallel_terms(expert_parallel: int, token_bytes: float, top_k: int, blocks: float,
                          microbatches: float, recompute: bool = False) -> tuple[float, float]:
    """Expert parallelism over e ranks (GShard, Lepikhin et al., 2021; Switch, Fedus et al., 2022):
    per MoE block and micro-batch an all-to-all sends each token's activation to its k experts and
    another brings the results back, and the backward does both again: 4 all-to-alls (6 under full
    recomputation), each e−1 messages and (e−1)/e of the k·``token_bytes`` a rank holds (experts
    spread evenly, the router balanced)."""
    _positive(token_bytes=token_bytes, blocks=blocks, microbatches=microbatches)
    e = expert_parallel
    if e <= 1:
        return 0.0, 0.0
    count = 6 if recompute else 4
    return (blocks * microbatches * count * (e - 1),
            blocks * microbatches * count * (e - 1) / e * top_k * token_bytes)


def moe_params_per_rank(params: float, active: float, experts: int, top_k: int, ranks_model: int,
                        expert_parallel: int) -> float:
    """Parameters one device holds in a MoE: the shared part (attention, router, embeddings) over the
    model-parallel ranks and the E experts over those and the e expert-parallel ranks. From the total Ψ
    and the active Ψ_a: one expert is (Ψ − Ψ_a)/(E − k), the shared part Ψ_a − k·that."""
    if experts <= 1 or active >= params:
        return params / ranks_model
    expert = (params - active) / (experts - top_k)
    shared = active - top_k * expert
    return shared / ranks_model + experts * expert / (ranks_model * expert_parallel)
