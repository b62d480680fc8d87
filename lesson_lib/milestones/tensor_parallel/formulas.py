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


def _check_split(cfg, pp: int, tp: int) -> None:
    """ValueError naming the parameter for a layout the model cannot be cut into."""
    if pp < 1 or cfg.layers % pp:
        raise ValueError(f"pp = {pp} stages cannot split {cfg.layers} layers evenly")
    if tp < 1 or cfg.heads % tp:
        raise ValueError(f"tp = {tp} cannot split {cfg.heads} heads evenly")


def stage_params(cfg, tp: int, pp: int, stage: int) -> int:
    """Parameters one rank of pipeline stage ``stage`` holds: its layers / pp blocks with q, k, v,
    fc1 (weights and biases) and o, fc2 (weights) cut t ways, their norms and o, fc2 biases whole;
    the embeddings on the first stage, the final norm and head on the last."""
    _check_split(cfg, pp, tp)
    d, f = cfg.d_model, cfg.ffn
    block = (3 * (d * d + d) + d * d + d * f + f + f * d) // tp + 2 * d + 4 * d
    out = cfg.layers // pp * block
    if stage == 0:
        out += cfg.vocab * d + cfg.seq * d
    if stage == pp - 1:
        out += 2 * d + d * cfg.vocab + cfg.vocab
    return out


def step_bytes(cfg, dp: int, pp: int, tp: int, micro: int, sequence_parallel: bool = False) -> dict:
    """Bytes each group's collectives send per step from the busiest rank of that group, float32,
    by the cost model's terms (:func:`lesson_lib.costmodel.tensor_parallel_terms` for tp, a ring
    all-reduce for dp, an activation forward and its gradient back per micro-batch for pp)."""
    from ...costmodel import allreduce_terms, tensor_parallel_terms

    _check_split(cfg, pp, tp)
    seq = cfg.seq // tp if sequence_parallel else cfg.seq
    size = cfg.batch // dp // micro
    act = 4 * cfg.seq * size * cfg.d_model
    _, tp_b = tensor_parallel_terms(tp, act, cfg.layers / pp, micro, sequence_parallel=sequence_parallel)
    pp_b = min(2, pp - 1) * micro * 4 * seq * size * cfg.d_model  # a middle stage sends both ways
    dp_b = max(allreduce_terms("ring", dp, 4 * stage_params(cfg, tp, pp, s))[1] for s in range(pp))
    return {"tp": tp_b, "pp": pp_b, "dp": dp_b, "total": tp_b + pp_b + dp_b}


def step_time(cfg, dp: int, pp: int, tp: int, micro: int, *, device: str = "a100-80gb",
              efficiency: float = 0.5, intra: str = "nvlink3", inter: str = "ib-hdr") -> dict:
    """Seconds per step on a cluster, by chapter 7's terms, for the layout (float32 bytes, as counted).

    compute: 6·Ψ FLOPs per token (Kaplan et al., 2020) split over the dp·pp·tp ranks at
    ``efficiency`` × the device's peak, stretched by GPipe's bubble to (M + P − 1)/M of itself;
    tp: its collectives on the node's link (``intra``), exposed; pp: 2 messages (activation and
    gradient) per micro-batch from a middle stage, between nodes (``inter``), exposed; dp: a ring
    all-reduce of the largest stage's gradients between nodes, hidden behind the backward (2/3 of
    compute) as far as it lasts. α and β from data/links.csv."""
    from ...costmodel import allreduce_terms, devices, links, tensor_parallel_terms

    _check_split(cfg, pp, tp)
    world, fast, slow = dp * pp * tp, links()[intra], links()[inter]
    whole = stage_params(cfg, 1, 1, 0)
    ideal = 6 * whole * cfg.seq * cfg.batch / world / (efficiency * devices()[device]["peak_flops"])
    size = cfg.batch // dp // micro
    a, b = tensor_parallel_terms(tp, 4 * cfg.seq * size * cfg.d_model, cfg.layers / pp, micro)
    sends = min(2, pp - 1) * micro
    pp_bytes = sends * 4 * cfg.seq * size * cfg.d_model
    da, db = allreduce_terms("ring", dp, 4 * max(stage_params(cfg, tp, pp, s) for s in range(pp)))
    dp_s = da * slow["alpha"] + db * slow["beta"]
    out = {"compute": ideal * (micro + pp - 1) / micro, "tp": a * fast["alpha"] + b * fast["beta"],
           "pp": sends * slow["alpha"] + pp_bytes * slow["beta"], "dp": max(0.0, dp_s - 2 / 3 * ideal)}
    out["bubble"] = (pp - 1) / (micro + pp - 1)
    out["step"] = out["compute"] + out["tp"] + out["pp"] + out["dp"]
    return out
