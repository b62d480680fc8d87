"""The cost model's formulas, one quantity each: memory bill (chapter 0), ring time, ZeRO memory and
traffic (chapter 4), and one step's terms at scale (chapter 7). :mod:`.planner` combines them.
"""

from __future__ import annotations

from ..data import read_csv
from .alphabeta import allreduce_time

# The best single share of peak FLOP/s for chapter 7's step model, fitted once on the in-sample set,
# every row of Narayanan et al. (SC21) Table 1 (data/sc21_table1.csv), by calibrate.fit_efficiency;
# tests/test_published_runs.py refits it and fails if it moved. No held-out run (data/published.csv,
# held_out = 1) was looked at to choose it. The default is now e(x) from the GEMM shapes (gemm.py,
# fitted on the same rows); this constant stays for a Plan that fixes its efficiency.
CALIBRATED_EFFICIENCY = 0.549

# Bytes per parameter (Rajbhandari et al., ZeRO, 2020, §3.1): mixed-precision Adam keeps fp16
# params and grads plus fp32 master, momentum and variance (K = 12), 16 bytes in all.
PRECISIONS = {
    "fp32 Adam": {"params": 4, "grads": 4, "optimizer": 8},
    "mixed-precision Adam": {"params": 2, "grads": 2, "optimizer": 12},
    "fp32 SGD + momentum": {"params": 4, "grads": 4, "optimizer": 4},
}


def memory_bill(params: float, precision: str = "mixed-precision Adam") -> dict:
    """Bytes of model state (params, grads, optimizer) to train ``params`` parameters on one device,
    activations excluded."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if not params >= 0:
        raise ValueError(f"params must be a non-negative number, got {params!r}")
    per = PRECISIONS[precision]
    bill = {k: v * params for k, v in per.items()}
    bill["total"] = sum(bill.values())
    bill["bytes_per_param"] = sum(per.values())
    return bill


# A datasheet's GB of device memory are binary: DRAM is made in power-of-two densities (an H100's 80 GB
# are five 16 GiB HBM3 stacks; NVIDIA H100 Tensor Core GPU Architecture whitepaper, 2022), so "80 GB"
# holds 80·2³⁰ = 85.9e9 bytes, of which the driver keeps a little. Bills stay in 1e9-byte GB.
GIB = 2**30


def accelerators() -> list[dict]:
    """Devices from data/accelerators.csv (checksum-verified) with their memory in bytes (:data:`GIB`)."""
    return [{"device": r["device"], "bytes": float(r["memory_gb"]) * GIB, "source": r["source"]}
            for r in read_csv("accelerators.csv")]


def fits(total_bytes: float) -> dict[str, bool]:
    """Which devices hold ``total_bytes`` of model state (ignoring activations and fragmentation)."""
    return {d["device"]: total_bytes <= d["bytes"] for d in accelerators()}


def devices_needed(total_bytes: float, device_bytes: float) -> int:
    """How many devices of ``device_bytes`` the state needs if it could be split perfectly."""
    return max(1, -(-int(total_bytes) // int(device_bytes)))


# ZeRO's bytes per parameter (Rajbhandari et al., 2020, §5): each part replicated or sharded over N.
_ZERO_SHARDED = {0: (), 1: ("optimizer",), 2: ("optimizer", "grads"), 3: ("optimizer", "grads", "params")}
_ZERO_BYTES = {"fp32": {"params": 4, "grads": 4, "optimizer": 8},     # Adam: momentum + variance
               "mixed": {"params": 2, "grads": 2, "optimizer": 12}}   # + fp32 master: K = 12


def zero_memory(params: float, world_size: int, stage: int, precision: str = "mixed",
                grad_bytes: int | None = None) -> dict:
    """Model-state bytes per rank under ZeRO ``stage`` (Rajbhandari et al., 2020).

    Mixed precision (K=12): 16Ψ, 4Ψ+12Ψ/N, 2Ψ+14Ψ/N, 16Ψ/N. ``grad_bytes=4``: Megatron-LM's fp32
    main gradients instead (18Ψ; 6Ψ+12Ψ/N at stage 1). Activations and buffers excluded.
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


def devices() -> dict[str, dict]:
    """Accelerators by id (data/devices.csv): peak dense bf16 FLOP/s, dense FP8 FLOP/s (None without
    FP8), memory bytes (the datasheet's GB, binary: :data:`GIB`), HBM bytes/s, the GPUs one NVLink
    domain holds (8 in a DGX/HGX server, 72 in a GB200 NVL72), source."""
    return {r["id"]: {"name": r["name"], "peak_flops": float(r["peak_tflops"]) * 1e12,
                      "fp8_flops": float(r["fp8_tflops"]) * 1e12 if r["fp8_tflops"] else None,
                      "memory": float(r["memory_gb"]) * GIB, "hbm_bytes_per_s": float(r["hbm_tbs"]) * 1e12,
                      "domain": int(r["nvlink_domain"]), "source": r["source"]}
            for r in read_csv("devices.csv")}


def links() -> dict[str, dict]:
    """Interconnects by id (data/links.csv): β = 1/bandwidth (s/byte) each way, α (s), source."""
    return {r["id"]: {"name": r["name"], "beta": 1 / (float(r["bandwidth_gbps"]) * 1e9),
                      "alpha": float(r["latency_us"]) * 1e-6, "source": r["source"]}
            for r in read_csv("links.csv")}


def published() -> dict[str, dict]:
    """Training figures papers report (data/published.csv). ``use``: "calibration" (in the in-sample
    set), "out-of-sample" (held out, the paper's layout) or "sanity-check" (a layout assumed)."""
    text = ("case", "device", "use", "source", "link", "intra_link", "rate_basis", "precision")
    return {r["case"]: {k: (v if k in text or v == "" else float(v))
                        for k, v in r.items()} for r in read_csv("published.csv")}


def days_from_throughput(tokens: float, params: float, devices: int, flops_per_device: float,
                         flops_per_token_per_param: float = 8.0) -> float:
    """End-to-end days ≈ 8·T·Ψ / (n·X) (Narayanan et al., SC21, §5.1; 8 = 6 plus recomputation)."""
    return flops_per_token_per_param * tokens * params / (devices * flops_per_device) / 86400


def bubble_formula(stages: int, microbatches: int, chunks: int = 1) -> float:
    """Idle share of a pipeline step with equal stages and free messages: (P−1)/(v·M+P−1), v chunks
    per rank (v = 1: GPipe and 1F1B). The one definition used everywhere."""
    return (stages - 1) / (chunks * microbatches + stages - 1)


def ring_time(nbytes: float, n: int, alpha: float, beta: float) -> float:
    """A ring all-reduce of ``nbytes`` on n ranks: 2(N−1)α + 2(N−1)/N·S·β (chapter 2)."""
    return allreduce_time("ring", n, nbytes, alpha, beta)


def ps_terms(workers: int, servers: int, nbytes: float) -> tuple[float, float]:
    """(a, b) such that a synchronous parameter-server step takes a·α + b·β (chapters 1 and 7).

    N workers push S bytes as K slices, one per server (Dean et al., 2012; Li et al., 2014), then
    pull them back; endpoints handle messages one after another, push and pull not overlapped. A
    server sends/receives 2N messages, 2N·S/K bytes; a worker 2K messages, 2S bytes; the busiest
    sets the step: 2·max(N, K)·α + 2·max(N/K, 1)·S·β.
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
    """Bytes per server: 12·Ψ/K (fp32 master, momentum, variance; Rajbhandari et al., 2020). The
    server's summing buffer is left out, like the ring's transient buffers."""
    if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
        raise ValueError(f"servers must be a positive int, got {servers!r}")
    return 12 * params / servers


def activation_bytes(seq: int, micro: int, hidden: int, heads: int, tensor: int = 1,
                     sequence_parallel: bool = False) -> float:
    """One transformer layer's 16-bit saved activations per micro-batch: s·b·h·(10 + 24/t +
    5·a·s/(h·t)); with sequence parallelism the 10 becomes 10/t (Korthikanti et al., 2022, Eqs. 2, 4)."""
    between = 10 / tensor if sequence_parallel else 10
    return seq * micro * hidden * (between + 24 / tensor + 5 * heads * seq / (hidden * tensor))


def recompute_activation_bytes(seq: int, micro: int, hidden: int, layers: float, tensor: int = 1,
                               sequence_parallel: bool = False) -> float:
    """Activations kept under full recomputation: 2·s·b·h·L bytes, divided by t with sequence
    parallelism (Korthikanti et al., 2022, §5, Table 2); the layer being recomputed comes on top."""
    return 2 * seq * micro * hidden * layers / (tensor if sequence_parallel else 1)
