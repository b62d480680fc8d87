"""The bytes each rank sends, by formula, for every collective of chapter 8 (ring collectives:
an all-reduce sends 2(N−1)/N·S per rank, a reduce-scatter or an all-gather (N−1)/N·S; Patarasuk &
Yuan, 2009). The counted bytes (:mod:`lesson_lib.comm`'s counters) are compared with these."""

from __future__ import annotations


def activation_bytes(cfg, dp: int = 1) -> int:
    """S: one ``[seq, batch / dp, d_model]`` float32 activation, what g and f all-reduce."""
    return 4 * cfg.seq * (cfg.batch // dp) * cfg.d_model


def tensor_parallel(cfg, tp: int, dp: int = 1) -> dict[str, float]:
    """Per step and rank, plain tensor parallelism: 2 all-reduces of S per block forward (g after
    attention and MLP), 2 backward (f before them)."""
    one = 2 * (tp - 1) / tp * activation_bytes(cfg, dp)
    return {"forward": 2 * cfg.layers * one, "backward": 2 * cfg.layers * one, "per_all_reduce": one,
            "all_reduces_per_block": 2}


def sequence_parallel(cfg, tp: int) -> dict[str, float]:
    """Per step and rank with sequence parallelism: each all-reduce becomes a reduce-scatter and an
    all-gather, (N−1)/N·S each — the same bytes; the backward's re-gather of the input (one
    all-gather per column layer) comes on top."""
    half = (tp - 1) / tp * activation_bytes(cfg)
    return {"forward": 4 * cfg.layers * half, "backward": 4 * cfg.layers * half,
            "regather": 2 * cfg.layers * half, "per_collective": half}


def data_parallel(numel: int, dp: int) -> float:
    """One all-reduce of a replica's gradients (``numel`` floats on this rank)."""
    return 2 * (dp - 1) / dp * 4 * numel


def all_to_all(experts: int, capacity: int, d_model: int, ranks: int) -> float:
    """One all-to-all of the ``[experts, capacity, d]`` buffer: all but my own chunk leaves."""
    return (ranks - 1) / ranks * 4 * experts * capacity * d_model


def ring_attention(batch: int, heads: int, seq: int, dim: int, ranks: int) -> float:
    """c − 1 steps, each passing one block of K and V (seq / c tokens) to the next rank."""
    return (ranks - 1) * 2 * 4 * batch * heads * (seq // ranks) * dim
