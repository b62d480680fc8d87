"""The tensor-parallel term of chapter 7's cost model, with chapter 8 as its source
(notebooks/08_beyond_data_parallel.ipynb, :mod:`lesson_lib.milestones.tensor_parallel`).

Megatron's tensor parallelism (Shoeybi et al., 2019) puts two all-reduces of one activation in
each transformer block forward (g, after attention and after the MLP) and two backward (f, before
them), on the node's own link; they sit on the critical path, so none of it hides behind compute.
Sequence parallelism (Korthikanti et al., 2022) turns each all-reduce into a reduce-scatter and an
all-gather (the same bytes and ring steps) and keeps what lies between the blocks split along the
sequence, so those activations are divided by t; the column layers' inputs are gathered once more
in the backward (Korthikanti et al. §4.2.2; chapter 8 §3 counts these bytes).
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
