"""One runtime for every chapter: worker processes, rendezvous, backend choice, timeouts, teardown.

Milestones hand a function to :class:`Cluster.run` (or :class:`TorchrunCluster.run`, same
contract) and never touch ports or processes. Modules: ``errors``, ``placement``, ``messages``,
``pickling``, ``worker`` (``context()`` in a rank), ``checked`` and ``ledger`` (each collective
compared with the peers' before it starts), ``diagnosis``, ``failures``, ``silence``,
``cluster``, ``pool``, ``torchrun``; ``replicas``, the mode in which a rank may die and the others
carry on (chapter 10). See docs/runtime.md.
"""

from .cluster import Cluster, close_all
from .errors import RunInterrupted, WorkerError, WorkerMismatch, WorkerTimeout
from .pickling import pack_job
from .placement import (
    BACKENDS,
    MAX_WORLD_SIZE,
    Placement,
    choose_placement,
    cpu_count,
    describe,
    env_limit,
    memory_share,
    share_note,
    threads_per_rank,
    validate_backend,
    validate_world_size,
)
from .pool import MAX_WARM_RANKS, warm_cluster
from .torchrun import TorchrunCluster, launched_by_torchrun
from .worker import WorkerContext, context

__all__ = [
    "BACKENDS", "MAX_WARM_RANKS", "MAX_WORLD_SIZE", "Cluster", "Placement", "RunInterrupted",
    "TorchrunCluster", "WorkerContext", "WorkerError", "WorkerMismatch", "WorkerTimeout", "choose_placement",
    "close_all", "context", "cpu_count", "describe", "env_limit", "launched_by_torchrun", "memory_share",
    "pack_job", "share_note",
    "threads_per_rank", "validate_backend", "validate_world_size", "warm_cluster",
]
