"""What failures cost (chapter 10 §1): the mean time between failures of a job, goodput, and the
checkpoint interval that wastes least (Young, 1974; Daly, 2006), from a checkpoint cost measured here.

A job of n devices, each failing on average once every ``device_mtbf`` hours (independently), fails
once every ``device_mtbf / n`` hours. Checkpointing every τ seconds of work at a cost δ, with a restart
cost R, loses per failure on average half an interval, (τ + δ)/2, plus R, and δ per interval: the
waste is about δ/(τ + δ) + (R + (τ + δ)/2)/M, least near τ = √(2δM) (Young). Daly's higher-order
form keeps δ's share of τ. δ and R are separate costs: :func:`waste` splits the waste between them.
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


def waste(tau_s: float, delta_s: float, mtbf_s: float, restart_s: float) -> dict:
    """The waste :func:`goodput` counts, by cause (shares of wall time, to first order): δ per
    interval, half an interval lost per failure, and R per failure."""
    return {"checkpoints": delta_s / (tau_s + delta_s), "lost work": (tau_s + delta_s) / 2 / mtbf_s,
            "restarts": restart_s / mtbf_s}


def days_with_failures(days: float, devices: int, device_mtbf_h: float, delta_s: float,
                       restart_s: float) -> dict:
    """A run that would take ``days`` without failures, checkpointed at Young's interval."""
    m = job_mtbf_h(device_mtbf_h, devices) * 3600
    tau = young(delta_s, m)
    g = goodput(tau, delta_s, m, restart_s)
    wall = days / g if g > 0 else math.inf
    return {"devices": devices, "mtbf_h": m / 3600, "tau_s": tau, "goodput": g, "days": wall,
            "failures": wall * 86400 / m}


def save_job(folder: str, numel: int, repeats: int = 3) -> dict:
    """On every rank: this rank's shard (``numel`` floats of parameters and as many of optimizer
    state) saved three ways, ``repeats`` times each, seconds the training loop stops for each:
    ``dcp.save`` (blocks until written), ``dcp.async_save`` (returns once the state is staged; the
    write finishes in the background, ``written_s``), and a copy into a peer's memory (the next rank
    keeps it, as Gemini's redundant in-memory copies do). Each copy is read back and compared."""
    import torch.distributed.checkpoint as dcp

    r, n = dist.get_rank(), dist.get_world_size()
    state = {f"shard{r}": {"params": torch.randn(numel), "momentum": torch.randn(numel)}}
    times = {"blocking dcp.save": [], "dcp.async_save": [], "written_s": [], "copy to a peer": []}
    for i in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        dcp.save(state, checkpoint_id=os.path.join(folder, f"sync{i}"))
        times["blocking dcp.save"].append(time.perf_counter() - t0)
        dist.barrier()
        t0 = time.perf_counter()
        pending = dcp.async_save(state, checkpoint_id=os.path.join(folder, f"async{i}"))
        times["dcp.async_save"].append(time.perf_counter() - t0)  # training would resume here
        pending.result()
        times["written_s"].append(time.perf_counter() - t0)
        dist.barrier()
        t0 = time.perf_counter()
        mine = torch.cat([state[f"shard{r}"]["params"], state[f"shard{r}"]["momentum"]])
        held = torch.empty_like(mine)  # the previous rank's shard, kept in this rank's memory
        for req in (dist.isend(mine, (r + 1) % n), dist.irecv(held, (r - 1) % n)):
            req.wait()
        times["copy to a peer"].append(time.perf_counter() - t0)
    back = {k: {"params": torch.zeros(numel), "momentum": torch.zeros(numel)} for k in state}
    dcp.load(back, checkpoint_id=os.path.join(folder, f"async{repeats - 1}"))
    got = [torch.empty_like(mine) for _ in range(n)]
    dist.all_gather(got, mine)
    same = all(torch.equal(back[k][f], state[k][f]) for k in state for f in ("params", "momentum"))
    return {"times": times, "async_equal": same, "peer_equal": torch.equal(held, got[(r - 1) % n]),
            "peer_bytes": held.numel() * held.element_size()}


def measure_save(cluster, numel: int = 1_000_000) -> dict:
    """δ measured three ways (:func:`save_job`): the median of three of each, the slowest rank's;
    the bytes one blocking checkpoint wrote."""
    folder = tempfile.mkdtemp(prefix=f"lesson_lib_ch10_{os.getpid()}_dcp_")
    try:
        outs = cluster.run(save_job, folder, numel)
        first = os.path.join(folder, "sync0")
        nbytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(first) for f in fs)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    median = {k: max(sorted(o["times"][k])[len(o["times"][k]) // 2] for o in outs) for k in outs[0]["times"]}
    return {"delta_s": median["blocking dcp.save"], "median_s": median, "bytes": nbytes,
            "ranks": cluster.world_size, "gb_per_s": nbytes / median["blocking dcp.save"] / 1e9,
            "async_equal": all(o["async_equal"] for o in outs),
            "peer_equal": all(o["peer_equal"] for o in outs),
            "peer_bytes": sum(o["peer_bytes"] for o in outs)}
