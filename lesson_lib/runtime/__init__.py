"""One runtime for every chapter: worker processes, rendezvous, backend choice, timeouts, teardown.

Milestones never touch ports, ``init_process_group`` or processes themselves; they write a
function that runs on every rank and hand it to :class:`Cluster.run` (or, under ``torchrun``,
to :class:`TorchrunCluster.run`, which has the same contract). One concern per module:

* ``errors``     what a run raises in the notebook (WorkerError, WorkerTimeout, RunInterrupted)
* ``placement``  backend and device for a world, threads per rank, ``describe`` for ``doctor``
* ``messages``   the typed messages a worker sends its parent
* ``pickling``   jobs as bytes: importable functions by reference, cell functions by value
* ``worker``     the worker process: join the process group, run jobs; ``context()`` in a rank
* ``diagnosis``  the learner's frames and cells in tracebacks, where a stuck rank waits
* ``failures``   the parent's side of a failure: which rank to blame, and why
* ``silence``    one line when a job has said nothing for a while: which ranks are busy, and where
* ``cluster``    ``Cluster``: start, run, close; ``pool``: warm clusters; ``torchrun``
"""

from .cluster import Cluster, close_all
from .errors import RunInterrupted, WorkerError, WorkerTimeout
from .pickling import pack_job
from .placement import (
    BACKENDS,
    MAX_WORLD_SIZE,
    Placement,
    choose_placement,
    cpu_count,
    describe,
    threads_per_rank,
    validate_backend,
    validate_world_size,
)
from .pool import MAX_WARM_RANKS, warm_cluster
from .torchrun import TorchrunCluster, launched_by_torchrun
from .worker import WorkerContext, context

__all__ = [
    "BACKENDS", "MAX_WARM_RANKS", "MAX_WORLD_SIZE", "Cluster", "Placement", "RunInterrupted",
    "TorchrunCluster", "WorkerContext", "WorkerError", "WorkerTimeout", "choose_placement",
    "close_all", "context", "cpu_count", "describe", "launched_by_torchrun", "pack_job",
    "threads_per_rank", "validate_backend", "validate_world_size", "warm_cluster",
]
