"""The same ``run`` contract as :class:`~.cluster.Cluster` when ``torchrun`` started the processes."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from .placement import choose_placement, oversubscribed, threads_per_rank
from .worker import WorkerContext, set_context


def launched_by_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


class TorchrunCluster:
    """This process as one rank of a world that ``torchrun`` started: ``fn`` runs as this rank and the
    values are exchanged with ``all_gather_object`` (rank 0 prints and writes files). Placement follows
    :class:`~.cluster.Cluster` on the local ranks, with no core kept free."""

    def __init__(self, backend: str = "auto", timeout_s: float = 30.0):
        world_size = int(os.environ["WORLD_SIZE"])
        rank = int(os.environ["RANK"])
        local_rank = int(os.environ["LOCAL_RANK"])
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        placement = choose_placement(local_world, backend)
        self.backend = placement.backend
        device = torch.device("cuda", local_rank) if self.backend == "nccl" else torch.device("cpu")
        if self.backend == "nccl":
            torch.cuda.set_device(device)
        threads = threads_per_rank(local_world, keep_core_free=False)
        torch.set_num_threads(threads)
        if not dist.is_initialized():
            dist.init_process_group(self.backend, timeout=timedelta(seconds=timeout_s))
        self.world_size, self.rank, self.timeout_s = world_size, rank, timeout_s
        self.oversubscribed = oversubscribed(local_world, threads, self.backend)
        self.placement = type(placement)(self.backend, device.type, f"torchrun, {placement.reason}")
        set_context(WorkerContext(rank, world_size, self.backend, device, timeout_s, threads,
                                  self.oversubscribed, None))

    def run(self, fn: Callable, *args: Any, on_event=None, timeout_s=None, **kwargs: Any) -> list:
        value = fn(*args, **kwargs)
        gathered: list = [None] * self.world_size
        dist.all_gather_object(gathered, value)
        return gathered

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        set_context(None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
