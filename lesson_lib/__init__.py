"""lesson_lib — the runtime behind a notebook course on how distributed training evolved.

Public names only; importing this package starts nothing.
"""

from .experiments import Result, run
from .experiments import names as experiment_names
from .runtime import Cluster, RunInterrupted, WorkerError, WorkerTimeout, close_all, context, warm_cluster
from .source import show_source, source

__all__ = ["Cluster", "RunInterrupted", "WorkerError", "WorkerTimeout", "Result", "close_all", "context",
           "experiment_names", "run", "show_source", "source", "warm_cluster"]
__version__ = "0.1.0"
