"""Where a world runs: the backend and device for ``world_size`` ranks, and threads per rank.

One rule for every way the course starts ranks (:class:`~lesson_lib.runtime.Cluster` from a
notebook or script, :class:`~lesson_lib.runtime.TorchrunCluster` under ``torchrun``).
"""

from __future__ import annotations

import math
import os
import socket
import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .start import method as start_method

MAX_WORLD_SIZE = 64
BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class Placement:
    """Where a world of ``world_size`` ranks runs: backend, device type and the reason, in words."""

    backend: str
    device_type: str
    reason: str


def cpu_count() -> int:
    """The CPUs this process may really use: the cores its affinity mask allows, capped by the
    container's CPU quota and by JupyterHub's per-user ``CPU_LIMIT``. On JupyterHub on Kubernetes
    and on Binder the mask shows every core of the host while a CFS quota limits the pod to a few;
    on a workshop server with a local spawner only ``CPU_LIMIT`` says what one learner's share is.
    The tightest decides (rounded up, at least 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        cores = os.cpu_count() or 1
    limits = [q for q in (cpu_quota(), env_limit("CPU_LIMIT")) if q is not None]
    return cores if not limits else max(1, min(cores, math.ceil(min(limits) - 1e-9)))


def env_limit(name: str, environ=None) -> float | None:
    """JupyterHub's per-user limit ``CPU_LIMIT`` (cores, e.g. "1.5") or ``MEM_LIMIT`` (bytes), which
    its spawner sets in each learner's environment whether or not it enforces it; ``None`` when
    unset, empty, zero or unreadable (JupyterHub leaves it out when no limit is set)."""
    raw = (os.environ if environ is None else environ).get(name, "").strip()
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def memory_share(root: str = "/sys/fs/cgroup", membership: str = "/proc/self/cgroup") -> dict:
    """Memory this process's user may fill, in bytes, and what limits it: the machine's RAM, the
    cgroup's ``memory.max`` (v2) or ``memory.limit_in_bytes`` (v1), and ``MEM_LIMIT``."""
    import psutil

    found = {"machine": float(psutil.virtual_memory().total)}
    cgroup = _cgroup_memory(root, membership)
    if cgroup is not None:
        found["cgroup"] = cgroup
    env = env_limit("MEM_LIMIT")
    if env is not None:
        found["MEM_LIMIT"] = env
    source = min(found, key=found.get)
    return {"bytes": int(found[source]), "limited_by": source}


def _cgroup_folders(root: str, membership: str, controller: str) -> list[tuple[int, str]]:
    """(cgroup version, folder) of this process's cgroup and of each ancestor, for ``controller``
    ("cpu", "memory"): v2's one unified hierarchy, or v1's folder for that controller."""
    try:
        with open(membership) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    folders = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":
            version, bases = 2, [root]
        elif controller in controllers.split(","):
            version, bases = 1, [os.path.join(root, controllers), os.path.join(root, controller)]
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for base in bases:  # the cgroup itself, then each ancestor
            folders += [(version, os.path.join(base, *parts[:depth])) for depth in range(len(parts), -1, -1)]
    return folders


def _cgroup_memory(root: str, membership: str) -> float | None:
    limits = []
    for version, folder in _cgroup_folders(root, membership, "memory"):
        try:
            with open(os.path.join(folder, "memory.max" if version == 2 else "memory.limit_in_bytes")) as f:
                raw = f.read().strip()
        except OSError:
            continue
        if raw.isdigit() and int(raw) < 2**60:  # v1 writes a huge number for "no limit"
            limits.append(float(raw))
    return min(limits) if limits else None


def share_note() -> str:
    """" (this user's share: CPU_LIMIT=1)" when JupyterHub's ``CPU_LIMIT`` is what caps
    :func:`cpu_count`, else "": added after "N CPU cores" in a figure's note or a warning."""
    env = env_limit("CPU_LIMIT")
    if env is None or math.ceil(env - 1e-9) != cpu_count():
        return ""
    return f" (this user's share: CPU_LIMIT={os.environ['CPU_LIMIT'].strip()})"


def cpu_quota(root: str = "/sys/fs/cgroup", membership: str = "/proc/self/cgroup") -> float | None:
    """CPUs allowed by the cgroup CPU quota of this process and its ancestors (the tightest), or
    ``None`` when there is none or it cannot be read. cgroup v2: ``cpu.max`` ("200000 100000" is 2
    CPUs, "max 100000" none); v1: ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (−1: none)."""
    limits = [q for version, folder in _cgroup_folders(root, membership, "cpu")
              if (q := (_v2_quota if version == 2 else _v1_quota)(folder)) is not None]
    return min(limits) if limits else None


def _v2_quota(folder: str) -> float | None:
    try:
        with open(os.path.join(folder, "cpu.max")) as f:
            quota, period = f.read().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def _v1_quota(folder: str) -> float | None:
    try:
        with open(os.path.join(folder, "cpu.cfs_quota_us")) as f:
            quota = int(f.read())
        with open(os.path.join(folder, "cpu.cfs_period_us")) as f:
            period = int(f.read())
    except (OSError, ValueError):
        return None
    return None if quota <= 0 or period <= 0 else quota / period


def gpu_count() -> int:
    # torch.cuda.device_count() asks NVML where it can and does not create a CUDA context, so the
    # notebook kernel stays CUDA-free. The CPU wheel answers 0 without touching anything.
    if not torch.cuda.is_available():
        return 0
    return torch.cuda.device_count()


def validate_world_size(world_size: Any) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be an int, got {world_size!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if world_size > MAX_WORLD_SIZE:
        raise ValueError(
            f"world_size={world_size} is more than this course runs on one machine "
            f"(at most {MAX_WORLD_SIZE}); use torchrun across machines for more"
        )
    return world_size


def validate_backend(backend: Any) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    return backend


def choose_placement(world_size: int, backend: str = "auto") -> Placement:
    """NCCL with one GPU per rank when enough GPUs exist, else Gloo on CPU for the whole world (NCCL
    forbids two ranks on one device, and a mixed world would skew timings). Under torchrun
    ``world_size`` is the ranks on this machine (``LOCAL_WORLD_SIZE``)."""
    validate_world_size(world_size)
    validate_backend(backend)
    gpus = gpu_count()
    if backend == "nccl":
        if not dist.is_nccl_available() or gpus < world_size:
            raise ValueError(
                f"backend='nccl' needs one GPU per rank: world_size={world_size} but "
                f"{gpus} GPU(s) visible{'' if dist.is_nccl_available() else ' and NCCL is not built in'}"
                "; use backend='auto' or 'gloo'"
            )
        return Placement("nccl", "cuda", f"NCCL, one GPU per rank ({gpus} GPUs visible)")
    if backend == "gloo":
        return Placement("gloo", "cpu", "Gloo on CPU (asked for)")
    if gpus >= world_size and dist.is_nccl_available():
        return Placement("nccl", "cuda", f"NCCL, one GPU per rank ({gpus} GPUs visible)")
    if gpus:
        return Placement("gloo", "cpu", f"Gloo on CPU: {world_size} ranks but only {gpus} GPU(s)")
    return Placement("gloo", "cpu", "Gloo on CPU: no GPU visible")


def threads_per_rank(world_size: int, keep_core_free: bool = True) -> int:
    """Intra-op threads per worker: the machine's cores shared out between its ranks.

    Ranks that together ask for more threads than there are cores slow each other down badly
    (spinning thread pools). ``keep_core_free`` leaves one core for the notebook kernel, the
    browser and the plots; under torchrun no kernel shares the machine, so all cores are shared.
    """
    return max(1, (cpu_count() - (1 if keep_core_free else 0)) // world_size)


def oversubscribed(world_size: int, threads: int, backend: str) -> bool:
    """True when the ranks' threads together outnumber the cores (CPU ranks only)."""
    return backend == "gloo" and world_size * threads > cpu_count()


def _cpu_share_words() -> str:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    limits = {"cgroup quota": cpu_quota(), "CPU_LIMIT": env_limit("CPU_LIMIT")}
    limits = {k: v for k, v in limits.items() if v is not None}
    if not limits:
        return f"all {cores} cores (no cgroup quota, no CPU_LIMIT)"
    return (f"{cpu_count()} of {cores} cores for this user's ranks ("
            + ", ".join(f"{k} {v:g}" for k, v in limits.items()) + ")")


def _memory_share_words() -> str:
    import psutil

    share, total = memory_share(), psutil.virtual_memory().total
    if share["limited_by"] == "machine":
        return f"all {total / 1e9:.1f} GB (no cgroup limit, no MEM_LIMIT)"
    return f"{share['bytes'] / 1e9:.1f} of {total / 1e9:.1f} GB ({share['limited_by']})"


def describe() -> dict:
    """What the runtime sees: used by ``python -m lesson_lib doctor``."""
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cpu_cores": cpu_count(),
        "cpu_quota": cpu_quota(),
        "cpu_share": _cpu_share_words(),
        "memory_share": _memory_share_words(),
        "gpus": gpu_count(),
        "gloo": dist.is_gloo_available(),
        "nccl": dist.is_nccl_available(),
        "start_method": {"cpu ranks": start_method("gloo"), "gpu ranks": start_method("nccl")},
        "placement": {n: choose_placement(n).reason for n in (1, 2, 4, 8)},
        "threads_per_rank": {n: threads_per_rank(n) for n in (1, 2, 4, 8)},
    }


def ranks_text(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def has_iface(name: str) -> bool:
    """Whether this machine has the network interface ``name`` (Gloo is bound to loopback, "lo")."""
    try:
        return any(n == name for _, n in socket.if_nameindex())
    except OSError:
        return False
