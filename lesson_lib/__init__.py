"""lesson_lib — the runtime behind a notebook course on how distributed training evolved.

Public names only; importing this package starts nothing.
"""

from .experiments import Result, run
from .experiments import names as experiment_names
from .runtime import Cluster, WorkerError, close_all, context, warm_cluster

__all__ = ["Cluster", "WorkerError", "Result", "close_all", "context", "experiment_names", "run",
           "warm_cluster"]
__version__ = "0.1.0"
