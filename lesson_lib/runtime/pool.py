"""Warm clusters kept for a kernel's life, shared by every chapter's cells."""

from __future__ import annotations

from .cluster import Cluster

_WARM: dict[tuple[int, str], Cluster] = {}
MAX_WARM_RANKS = 12  # an idle spawned worker holds ~300 MB, a forked one less; keep a laptop usable


def warm_cluster(world_size: int, backend: str = "auto", timeout_s: float = 30.0) -> Cluster:
    """A cluster kept warm for this kernel's life, shared by the chapters' helpers.

    At most ``MAX_WARM_RANKS`` idle workers are kept: the least recently used clusters are
    closed to make room.
    """
    key = (world_size, backend)
    cluster = _WARM.pop(key, None)
    if cluster is None:
        while _WARM and sum(c.world_size for c in _WARM.values()) + world_size > MAX_WARM_RANKS:
            _WARM.pop(next(iter(_WARM))).close()
        cluster = Cluster(world_size, backend, timeout_s=timeout_s)
    _WARM[key] = cluster  # most recently used last
    return cluster
