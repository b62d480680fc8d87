"""Warm clusters kept for a kernel's life, shared by every chapter's cells; idle ones give their
memory back (:mod:`.idle`)."""

from __future__ import annotations

from . import idle
from .cluster import Cluster
from .placement import memory_share

_WARM: dict[tuple[int, str], Cluster] = {}
MAX_WARM_RANKS = 12  # an idle spawned worker holds ~300 MB, a forked one less; keep a laptop usable
RANK_BYTES = 500e6  # a warm rank after a chapter ran: benchmarks/learner-memory.md
KERNEL_BYTES = 1e9  # the notebook kernel itself, with torch, plotly and the widgets


def max_warm_ranks() -> int:
    """Idle ranks a kernel keeps: :data:`MAX_WARM_RANKS`, fewer where this user's memory share
    (``MEM_LIMIT`` on a workshop server, a cgroup limit in a container) cannot hold them."""
    share = memory_share()["bytes"]
    return max(1, min(MAX_WARM_RANKS, int((share - KERNEL_BYTES) // RANK_BYTES)))


def warm_cluster(world_size: int, backend: str = "auto", timeout_s: float = 30.0) -> Cluster:
    """A cluster kept warm for this kernel's life, shared by the chapters' helpers.

    At most :func:`max_warm_ranks` idle workers are kept: the least recently used clusters are
    closed to make room. A cluster idle for long, or once another chapter's kernel started one, is
    closed by the kernel's reaper thread; the next run starts it again.
    """
    key = (world_size, backend)
    cluster = _WARM.pop(key, None)
    if cluster is None:
        cap = max_warm_ranks()
        while _WARM and sum(c.world_size for c in _WARM.values() if c.running) + world_size > cap:
            _WARM.pop(next(iter(_WARM))).close()
        cluster = Cluster(world_size, backend, timeout_s=timeout_s)
        idle.announce()
    elif not cluster.running:  # closed while idle: its next run starts it again
        idle.announce()
    _WARM[key] = cluster  # most recently used last
    idle.watch(lambda: list(_WARM.values()))
    return cluster
