"""The alpha-beta model of communication (chapter 2; chapters 6 and 7 price their messages with it):
a message of m bytes costs α + m·β, a fixed latency plus its bytes over the link's bandwidth
(Hockney, 1994); an all-reduce is a sequence of such messages (Thakur, Rabenseifner & Gropp, 2005).
The terms of each all-reduce algorithm, their fits to measured times, and the crossovers between them.
"""

from __future__ import annotations


def allreduce_terms(algorithm: str, world_size: int, nbytes: float) -> tuple[float, float]:
    """(a, b) such that an all-reduce of ``nbytes`` on ``world_size`` ranks takes a·α + b·β.

    ring (and library): 2(N−1)α + 2(N−1)/N·S·β; naive: 2(N−1)α + 2(N−1)·S·β; tree: NCCL's double
    binary tree (Sanders, Speck & Träff, 2009; Jeaugey, 2019), best case 2·log₂N·α + 2·S·β.
    halving-doubling (Rabenseifner's reduce-scatter + all-gather) and recursive doubling as MPICH runs
    them for any N (Thakur, Rabenseifner & Gropp, 2005, §4): N = 2^k gives 2kα + 2(N−1)/N·S·β and
    kα + k·S·β; otherwise the N − p′ ranks above p′ = 2^⌊log₂N⌋ first fold their data into a partner
    and get the result back at the end, one message of S each way: halving-doubling costs
    (2⌊log₂N⌋ + 2)α + (2(p′−1)/p′ + 2)·S·β (4α + 3·S·β at N = 3), recursive doubling
    (⌊log₂N⌋ + 2)(α + S·β). log₂N is rounded down."""
    n = world_size
    if n < 1:
        raise ValueError(f"world_size must be at least 1, got {n}")
    if nbytes < 0:
        raise ValueError(f"nbytes must be non-negative, got {nbytes}")
    k = n.bit_length() - 1  # ⌊log₂N⌋
    p2 = 1 << k             # p′, the power of two at or below N
    fold = 0.0 if p2 == n else 2.0  # one message each way for the ranks above p′
    if algorithm in ("ring", "library"):
        return 2.0 * (n - 1), 2.0 * (n - 1) / n * nbytes
    if algorithm == "halving-doubling":
        return 2.0 * k + fold, (2.0 * (p2 - 1) / p2 + fold) * nbytes
    if algorithm == "recursive-doubling":
        return k + fold, (k + fold) * nbytes
    if algorithm == "naive":
        return 2.0 * (n - 1), 2.0 * (n - 1) * nbytes
    if algorithm == "tree":
        return 2.0 * k, (2.0 * nbytes if n > 1 else 0.0)
    raise ValueError("algorithm must be ring, library, halving-doubling, recursive-doubling, naive or tree, "
                     f"got {algorithm!r}")


def allreduce_time(algorithm: str, world_size: int, nbytes: float, alpha: float, beta: float) -> float:
    a, b = allreduce_terms(algorithm, world_size, nbytes)
    return a * alpha + b * beta


def fit_alpha_beta(rows: list[dict], algorithm: str = "ring") -> dict:
    """Least-squares α (s) and β (s/byte) from measured ``rows`` ({world_size, size_bytes, time_s}).

    Errors are weighed relative to each time, so 4 KB messages (latency) count as much as 64 MB
    ones (bandwidth); α and β are kept non-negative. Returns α, β, the bandwidth 1/β and the
    root-mean-square relative error of the fit.
    """
    import numpy as np

    rows = [r for r in rows if r["time_s"] > 0 and r["world_size"] > 1]
    if len(rows) < 2:
        raise ValueError("need at least two measurements on two or more ranks to fit α and β")
    a = np.array([allreduce_terms(algorithm, r["world_size"], r["size_bytes"]) for r in rows])
    t = np.array([r["time_s"] for r in rows])
    w = a / t[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(w, np.ones(len(t)), rcond=None)
    one = lambda col: float(np.linalg.lstsq(w[:, col:col + 1], np.ones(len(t)), rcond=None)[0][0])
    if alpha < 0:  # the data say "no latency": keep α at zero and fit β alone
        alpha, beta = 0.0, one(1)
    elif beta <= 0:
        alpha, beta = one(0), 1e-15
    model = a @ np.array([alpha, beta])
    return {"alpha_s": float(alpha), "beta_s_per_byte": float(beta), "bandwidth_GBps": 1e-9 / beta,
            "rms_rel_error": float(np.sqrt(np.mean((model / t - 1) ** 2))), "points": len(rows),
            "algorithm": algorithm}


def latency_crossover_bytes(world_size: int, alpha: float, beta: float) -> float:
    """Message size S* at which a ring all-reduce's latency term equals its bandwidth term:
    2(N−1)α = 2(N−1)/N·S*·β, so S* = N·α/β. Below S*, latency dominates."""
    if beta <= 0:
        raise ValueError(f"beta must be positive, got {beta}")
    return world_size * alpha / beta


def ring_beats_tree_bytes(world_size: int, alpha: float, beta: float) -> float:
    """Message size above which the ring all-reduce beats the double binary tree: 2(N−1)α +
    2(N−1)/N·S·β < 2·log₂N·α + 2·S·β once S > N·(N−1−log₂N)·α/β (chapter 2 §8)."""
    if beta <= 0:
        raise ValueError(f"beta must be positive, got {beta}")
    n = world_size
    return n * (n - 1 - (n.bit_length() - 1)) * alpha / beta


def bus_bandwidth(algbw: float, world_size: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce: algbw · 2(N−1)/N, what each rank's link carries
    per second under a bandwidth-optimal algorithm — comparable across N and with a link's speed."""
    return algbw * 2 * (world_size - 1) / world_size


def fit_point_to_point(sizes: list[float], times: list[float]) -> dict:
    """α (s) and β (s/byte) of t = α + m·β from one-way message times (a ping-pong; chapter 7).

    Errors weigh relative to each time, as :func:`fit_alpha_beta` does; α and β stay ≥ 0.
    """
    import numpy as np

    if len(sizes) != len(times) or len(sizes) < 2 or min(times) <= 0:
        raise ValueError("need at least two (size, positive time) pairs to fit α and β")
    t = np.array(times, dtype=float)
    w = np.stack([np.ones_like(t), np.array(sizes, dtype=float)], axis=1) / t[:, None]
    alpha, beta = np.linalg.lstsq(w, np.ones(len(t)), rcond=None)[0]
    if alpha < 0:
        alpha, beta = 0.0, float(np.linalg.lstsq(w[:, 1:], np.ones(len(t)), rcond=None)[0][0])
    elif beta <= 0:
        alpha, beta = float(np.linalg.lstsq(w[:, :1], np.ones(len(t)), rcond=None)[0][0]), 1e-15
    return {"alpha_s": float(alpha), "beta_s_per_byte": float(beta), "bandwidth_GBps": 1e-9 / beta}
