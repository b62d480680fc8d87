"""What failures cost (chapter 10 §1): the mean time between failures of a job, goodput, and the
checkpoint interval that wastes least (Young, 1974; Daly, 2006), from a checkpoint cost measured here.

A job of n devices, each failing on average once every ``device_mtbf`` hours (independently), fails
once every ``device_mtbf / n`` hours. Checkpointing every τ seconds at a cost δ, with a restart cost R,
loses per failure on average τ/2 of work plus R, and δ per interval: the waste is about
δ/τ + (τ/2 + R)/M, least at τ = √(2δM) (Young). Daly's higher-order form keeps δ's share of τ.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time

import torch
import torch.distributed as dist

# Llama 3 (Dubey et al., 2024, §3.3.4): a 54-day snapshot of the 405B pre-training on 16,384 H100s saw
# 466 job interruptions, 419 of them unexpected, and over 90 % effective training time.
LLAMA3 = {"gpus": 16_384, "days": 54, "unexpected": 419, "effective_time": 0.90,
          "params": 405e9, "tokens": 15.6e12}


def job_mtbf_h(device_mtbf_h: float, devices: int) -> float:
    """Independent failures add their rates: the job's mean time between failures."""
    return device_mtbf_h / devices


def device_mtbf_from(failures: int, devices: int, hours: float) -> float:
    """A device's MTBF implied by ``failures`` seen on ``devices`` in ``hours`` (device-hours per failure)."""
    return devices * hours / failures


def young(delta_s: float, mtbf_s: float) -> float:
    """Young (1974): τ = √(2·δ·M)."""
    return math.sqrt(2 * delta_s * mtbf_s)


def daly(delta_s: float, mtbf_s: float) -> float:
    """Daly (2006), eq. 37: τ = √(2δM)·[1 + ⅓√(δ/2M) + ⅑(δ/2M)] − δ for δ < 2M, else M."""
    if delta_s >= 2 * mtbf_s:
        return mtbf_s
    x = delta_s / (2 * mtbf_s)
    return math.sqrt(2 * delta_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - delta_s


def goodput(tau_s: float, delta_s: float, mtbf_s: float, restart_s: float) -> float:
    """Useful time over wall time, to first order: each interval pays δ; each failure loses half an
    interval (with its checkpoint) and the restart."""
    lost = (restart_s + (tau_s + delta_s) / 2) / mtbf_s
    return max(0.0, (1 - lost) * tau_s / (tau_s + delta_s))


def days_with_failures(days: float, devices: int, device_mtbf_h: float, delta_s: float,
                       restart_s: float) -> dict:
    """A run that would take ``days`` without failures, checkpointed at Young's interval."""
    m = job_mtbf_h(device_mtbf_h, devices) * 3600
    tau = young(delta_s, m)
    g = goodput(tau, delta_s, m, restart_s)
    wall = days / g if g > 0 else math.inf
    return {"devices": devices, "mtbf_h": m / 3600, "tau_s": tau, "goodput": g, "days": wall,
            "failures": wall * 86400 / m}


def save_job(folder: str, numel: int, repeats: int = 3) -> list[float]:
    """On every rank: write this rank's shard (``numel`` floats of parameters and as many of
    optimizer state) with ``torch.distributed.checkpoint``; seconds per save, slowest rank's view."""
    import torch.distributed.checkpoint as dcp

    state = {f"shard{dist.get_rank()}": {"params": torch.randn(numel), "momentum": torch.randn(numel)}}
    times = []
    for i in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        dcp.save(state, checkpoint_id=os.path.join(folder, f"step{i}"))
        dist.barrier()
        times.append(time.perf_counter() - t0)
    return times


def measure_save(cluster, numel: int = 1_000_000) -> dict:
    """δ measured: the median of three DCP saves of ``numel`` parameters per rank, and the bytes."""
    folder = tempfile.mkdtemp(prefix=f"lesson_lib_ch10_{os.getpid()}_dcp_")
    try:
        times = cluster.run(save_job, folder, numel)[0]
        nbytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs) / 3
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {"delta_s": sorted(times)[1], "bytes": nbytes, "ranks": cluster.world_size,
            "gb_per_s": nbytes / sorted(times)[1] / 1e9}
