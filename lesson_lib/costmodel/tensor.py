"""The tensor-parallel term of chapter 7's cost model, after chapter 8.

Megatron's tensor parallelism (Shoeybi et al., 2019): two all-reduces of one activation per block
forward and two backward, on the node's link. How much of that hides behind compute is the plan's
``tp_overlap`` (planner.py; 0, none hidden, is the bound chapter 7 prints). Sequence parallelism
(Korthikanti et al., 2022) makes each a reduce-scatter plus all-gather (same bytes), splits the
activations between blocks by t, and re-gathers the column layers' inputs in the backward (§4.2.2).
"""

from __future__ import annotations

from .alphabeta import allreduce_terms


def tensor_parallel_terms(tensor: int, nbytes: float, blocks: float, microbatches: float,
                          recompute: bool = False, sequence_parallel: bool = False) -> tuple[float, float]:
    """(a, b) such that one step's tensor-parallel collectives take a·α + b·β on the node's link.

    Per block and micro-batch: 2 all-reduces of the ``nbytes`` activation forward and 2 backward
    (chapter 8 §1), 2 more when the forward is recomputed; each is a ring over t ranks, 2(t−1) steps
    and 2(t−1)/t·S bytes (chapter 2). With sequence parallelism each all-reduce is a reduce-scatter
    plus an all-gather, the same (a, b), and the backward re-gathers the 2 column layers' inputs:
    2 all-gathers of (t−1) steps and (t−1)/t·S bytes each (chapter 8 §3). t = 1: no messages.
    """
    if isinstance(tensor, bool) or not isinstance(tensor, int) or tensor < 1:
        raise ValueError(f"tensor must be a positive int, got {tensor!r}")
    for name, v in (("nbytes", nbytes), ("blocks", blocks), ("microbatches", microbatches)):
        if not v >= 0:
            raise ValueError(f"{name} must be non-negative, got {v!r}")
    if not isinstance(sequence_parallel, bool):
        raise ValueError(f"sequence_parallel must be True or False, got {sequence_parallel!r}")
    if tensor == 1:
        return 0.0, 0.0
    a, b = allreduce_terms("ring", tensor, nbytes)
    per_block = 6 if recompute else 4
    a, b = per_block * a, per_block * b
    if sequence_parallel:  # the backward's re-gather of the 2 column layers' inputs
        a, b = a + 2 * (tensor - 1), b + 2 * (tensor - 1) / tensor * nbytes
    return blocks * microbatches * a, blocks * microbatches * b


def tensor_parallel_time(tensor: int, nbytes: float, blocks: float, microbatches: float, alpha: float,
                         beta: float, recompute: bool = False, sequence_parallel: bool = False) -> float:
    """Seconds of one step's tensor-parallel collectives: :func:`tensor_parallel_terms` at α, β."""
    a, b = tensor_parallel_terms(tensor, nbytes, blocks, microbatches, recompute, sequence_parallel)
    return a * alpha + b * beta
