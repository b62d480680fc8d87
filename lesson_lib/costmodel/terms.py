"""The formulas of the cost model, one quantity each: the memory bill of training (chapter 0), the
ring's time in the alpha-beta model (:mod:`.alphabeta` has the rest), ZeRO's memory and traffic
(chapter 4), and the terms of one step at scale with the device and link tables they read
(chapter 7). :mod:`.planner` combines them into a training plan. Formulas live here;
measurements live in ``metrics``.
"""

from __future__ import annotations

from ..data import read_csv
from .alphabeta import allreduce_time

# Bytes per parameter for each part of the model state (Rajbhandari et al., ZeRO, 2020, §3.1):
# mixed-precision Adam keeps fp16 params and grads (2 + 2 bytes) plus an fp32 master copy,
# momentum and variance (4 + 4 + 4 bytes): K = 12 bytes of optimizer state, 16 bytes in all.
PRECISIONS = {
    "fp32 Adam": {"params": 4, "grads": 4, "optimizer": 8},
    "mixed-precision Adam": {"params": 2, "grads": 2, "optimizer": 12},
    "fp32 SGD + momentum": {"params": 4, "grads": 4, "optimizer": 4},
}


def memory_bill(params: float, precision: str = "mixed-precision Adam") -> dict:
    """Bytes of model state (params, grads, optimizer) to train ``params`` parameters on one device.

    Activations come on top and depend on batch and sequence length, so they are not included.
    Used by chapter 0 (the memory calculator) and chapter 4 (ZeRO divides these by N).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if not params >= 0:
        raise ValueError(f"params must be a non-negative number, got {params!r}")
    per = PRECISIONS[precision]
    bill = {k: v * params for k, v in per.items()}
    bill["total"] = sum(bill.values())
    bill["bytes_per_param"] = sum(per.values())
    return bill


def accelerators() -> list[dict]:
    """Devices from data/accelerators.csv (checksum-verified) with their memory in bytes."""
    return [{"device": r["device"], "bytes": float(r["memory_gb"]) * 1e9, "source": r["source"]}
            for r in read_csv("accelerators.csv")]


def fits(total_bytes: float) -> dict[str, bool]:
    """Which devices hold ``total_bytes`` of model state (ignoring activations and fragmentation)."""
    return {d["device"]: total_bytes <= d["bytes"] for d in accelerators()}


def devices_needed(total_bytes: float, device_bytes: float) -> int:
    """How many devices of ``device_bytes`` the state needs if it could be split perfectly."""
    return max(1, -(-int(total_bytes) // int(device_bytes)))


# Bytes per parameter of model states by ZeRO stage (Rajbhandari et al., 2020, §5, Figure 1):
# params / grads / optimizer, each either replicated (×1) or sharded over N ranks (×1/N).
_ZERO_SHARDED = {0: (), 1: ("optimizer",), 2: ("optimizer", "grads"), 3: ("optimizer", "grads", "params")}
_ZERO_BYTES = {"fp32": {"params": 4, "grads": 4, "optimizer": 8},     # Adam: momentum + variance
               "mixed": {"params": 2, "grads": 2, "optimizer": 12}}   # + fp32 master: K = 12


def zero_memory(params: float, world_size: int, stage: int, precision: str = "mixed",
                grad_bytes: int | None = None) -> dict:
    """Model-state bytes per rank under ZeRO ``stage`` (the paper's formulas; chapter 4).

    fp32 Adam: 16Ψ, 8Ψ+8Ψ/N, 4Ψ+12Ψ/N, 16Ψ/N. Mixed precision (K=12): 16Ψ, 4Ψ+12Ψ/N,
    2Ψ+14Ψ/N, 16Ψ/N: the paper's convention, fp16/bf16 gradients. ``grad_bytes=4`` takes
    Megatron-LM's instead, fp32 main gradients: 18Ψ, and 6Ψ+12Ψ/N at stage 1 (its distributed
    optimizer). Activations and transient buffers come on top.
    """
    if stage not in _ZERO_SHARDED:
        raise ValueError(f"stage must be 0, 1, 2 or 3, got {stage!r}")
    if precision not in _ZERO_BYTES:
        raise ValueError(f"precision must be 'fp32' or 'mixed', got {precision!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if not params >= 0:
        raise ValueError(f"params must be a non-negative number, got {params!r}")
    per_param = {**_ZERO_BYTES[precision], **({"grads": grad_bytes} if grad_bytes is not None else {})}
    out = {k: b * params / (world_size if k in _ZERO_SHARDED[stage] else 1) for k, b in per_param.items()}
    out["total"] = sum(out.values())
    return out


def zero_traffic(params: float, world_size: int, stage: int, element_size: int = 4) -> float:
    """Bytes each rank sends per step with ring collectives: 2(N−1)/N·Ψ elements for stages
    0–2 (reduce-scatter + all-gather), 3(N−1)/N·Ψ for stage 3 (one more all-gather)."""
    factor = 3 if stage == 3 else 2
    return factor * (world_size - 1) / world_size * params * element_size


# --------------------------------------------------------------------------- one step's terms (chapter 7)
# What :mod:`lesson_lib.costmodel` adds up into one step at scale. Inputs come from data/devices.csv
# and data/links.csv (a source per row).


def devices() -> dict[str, dict]:
    """Accelerators by id (data/devices.csv): peak dense bf16 FLOP/s, memory bytes, source."""
    return {r["id"]: {"name": r["name"], "peak_flops": float(r["peak_tflops"]) * 1e12,
                      "memory": float(r["memory_gb"]) * 1e9, "source": r["source"]}
            for r in read_csv("devices.csv")}


def links() -> dict[str, dict]:
    """Interconnects by id (data/links.csv): β = 1/bandwidth (s/byte) each way, α (s), source."""
    return {r["id"]: {"name": r["name"], "beta": 1 / (float(r["bandwidth_gbps"]) * 1e9),
                      "alpha": float(r["latency_us"]) * 1e-6, "source": r["source"]}
            for r in read_csv("links.csv")}


def published() -> dict[str, dict]:
    """Training figures a paper reports (data/published.csv), to check the model against. ``use``
    says whether a row calibrated the model's efficiency ("calibration"), tests it with the layout
    its paper reports ("out-of-sample"), or only checks it with a layout the model chose ("sanity-check")."""
    return {r["case"]: {k: (v if k in ("case", "device", "use", "source") or v == "" else float(v))
                        for k, v in r.items()} for r in read_csv("published.csv")}


def days_from_throughput(tokens: float, params: float, devices: int, flops_per_device: float,
                         flops_per_token_per_param: float = 8.0) -> float:
    """End-to-end days ≈ 8·T·Ψ / (n·X) (Narayanan et al., SC21, §5.1; 8 = 6 plus recomputation)."""
    return flops_per_token_per_param * tokens * params / (devices * flops_per_device) / 86400


def bubble_formula(stages: int, microbatches: int, chunks: int = 1) -> float:
    """Idle share of a pipeline step with equal stages and free messages: (P−1)/(v·M+P−1), with v
    chunks per rank (v = 1: GPipe and 1F1B, (P−1)/(M+P−1); interleaved 1F1B otherwise; chapter 3).
    The one definition: the pipeline, its chapter and the cost model all use it."""
    return (stages - 1) / (chunks * microbatches + stages - 1)


def ring_time(nbytes: float, n: int, alpha: float, beta: float) -> float:
    """A ring all-reduce of ``nbytes`` on n ranks: 2(N−1)α + 2(N−1)/N·S·β (chapter 2)."""
    return allreduce_time("ring", n, nbytes, alpha, beta)


def ps_terms(workers: int, servers: int, nbytes: float) -> tuple[float, float]:
    """(a, b) such that a synchronous parameter-server step takes a·α + b·β (chapters 1 and 7).

    Each of N workers pushes its gradient of S bytes as K slices of S/K, one per server, then pulls
    K slices of parameters back; each of K servers (Dean et al., 2012; Li et al., 2014) takes N
    slices in and sends N out. As for the naive all-reduce, an endpoint handles its messages one
    after another, each costing α + m·β, and push and pull are two phases, not overlapped:

    * a server: 2·N messages, 2·N·S/K bytes — the hotspot while K < N;
    * a worker: 2·K messages, 2·S bytes — its message count grows with K.

    The step lasts as long as the busiest endpoint: 2·max(N, K)·α + 2·max(N/K, 1)·S·β. The
    latency never falls below 2·N·α (each server still hears every worker) nor below 2·K·α;
    at K = N it is the ring's 2(N−1)α and 2(N−1)/N·S·β up to a factor N/(N−1).
    """
    for name, v in (("workers", workers), ("servers", servers)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if nbytes < 0:
        raise ValueError(f"nbytes must be non-negative, got {nbytes}")
    return 2.0 * max(workers, servers), 2.0 * max(workers / servers, 1.0) * nbytes


def ps_time(nbytes: float, workers: int, servers: int, alpha: float, beta: float) -> float:
    """Seconds of one synchronous parameter-server exchange: :func:`ps_terms` priced at α, β."""
    a, b = ps_terms(workers, servers, nbytes)
    return a * alpha + b * beta


def server_memory(params: float, servers: int) -> float:
    """Bytes each of K servers holds: mixed-precision Adam's 12 bytes per parameter (fp32 master
    weights, momentum, variance; Rajbhandari et al., 2020) over K shards, 12·Ψ/K. The workers keep
    the 16-bit weights and gradients; a server's buffer summing the N incoming gradient slices
    (one more 4·Ψ/K in fp32) is left out, as the ring's transient buffers are."""
    if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
        raise ValueError(f"servers must be a positive int, got {servers!r}")
    return 12 * params / servers


def activation_bytes(seq: int, micro: int, hidden: int, heads: int, tensor: int = 1,
                     sequence_parallel: bool = False) -> float:
    """One transformer layer's saved activations for one micro-batch, 16-bit: s·b·h·(10 + 24/t +
    5·a·s/(h·t)) bytes; with sequence parallelism the 10 between the blocks is divided by t too,
    s·b·h·(34/t + 5·a·s/(h·t)) (Korthikanti et al., 2022, Eqs. 2 and 4; chapter 8 §3)."""
    between = 10 / tensor if sequence_parallel else 10
    return seq * micro * hidden * (between + 24 / tensor + 5 * heads * seq / (hidden * tensor))


def recompute_activation_bytes(seq: int, micro: int, hidden: int, layers: float, tensor: int = 1,
                               sequence_parallel: bool = False) -> float:
    """Activations kept under full recomputation: each of the L layers' inputs, s·b·h values in 16
    bits, so 2·s·b·h·L bytes (Korthikanti et al., 2022, §4.1 and Table 2, "full recompute").
    Without sequence parallelism the layer input is replicated on every tensor-parallel rank; with
    it, each keeps its 1/t of the sequence: 2·s·b·h·L/t. The one layer being recomputed in the
    backward pass comes on top (:func:`activation_bytes`)."""
    return 2 * seq * micro * hidden * layers / (tensor if sequence_parallel else 1)
