"""Gradient buckets reduced during the backward, as soon as they are ready (chapters 0 and 4).

As in PyTorch's DDP (Li et al., VLDB 2020; :func:`plan_ddp`) and ZeRO-2 (Rajbhandari et al., SC 2020;
:func:`plan`), a bucket's collective runs once autograd has written its last gradient, while the
backward goes on. :class:`Overlap` uses ``register_post_accumulate_grad_hook`` and one communication
thread that runs the buckets in the same order on every rank, so the collectives match.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

import torch

from .metrics import counters, in_background


def plan(sizes: list[int], cap: int) -> list[list[int]]:
    """Indices of ``sizes`` grouped into buckets in backward order (last item first); a bucket is
    closed before the next item would pass ``cap`` bytes (DeepSpeed ZeRO's ``reduce_bucket_size``),
    so pending gradients never exceed it; a larger item goes alone. ``cap <= 0``: one bucket.
    """
    if cap <= 0:
        return [list(reversed(range(len(sizes))))]
    buckets: list[list[int]] = []
    size = 0
    for i in reversed(range(len(sizes))):
        if not buckets or size + sizes[i] > cap:
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += sizes[i]
    return buckets


def plan_ddp(sizes: list[int], cap: int) -> list[list[int]]:
    """DDP's buckets (torch's ``compute_bucket_assignment_by_size``) in backward order: a bucket
    closes once it holds ``cap`` bytes or more, so it may pass ``cap`` by its last item.
    ``cap <= 0``: one bucket.
    """
    if cap <= 0:
        return [list(reversed(range(len(sizes))))]
    buckets: list[list[int]] = [[]]
    size = 0
    for i in reversed(range(len(sizes))):
        buckets[-1].append(i)
        size += sizes[i]
        if size >= cap:
            buckets.append([])
            size = 0
    return [b for b in buckets if b]


class Overlap:
    """Run ``reduce(i)`` on a communication thread once all of bucket ``i``'s gradients are written,
    in bucket order; :meth:`wait` blocks until every bucket is reduced.

    ``groups[i]``: bucket ``i``'s parameters. Call :meth:`start` before each backward. ``events``:
    per bucket, launch and collective times (``time.perf_counter``), for the timeline figure.
    """

    def __init__(self, groups: list[list[torch.Tensor]], reduce: Callable[[int], None]):
        self.groups, self.reduce = groups, reduce
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="comm")
        self.futures: list[Future] = []
        self.events: list[dict] = []
        for i, group in enumerate(groups):
            for p in group:
                p.register_post_accumulate_grad_hook(lambda p, i=i: self._ready(i))

    def start(self) -> None:
        self.pending = [len(g) for g in self.groups]
        self.launched, self.futures, self.events = 0, [], []

    def _ready(self, i: int) -> None:  # autograd has just written one gradient of bucket i
        self.pending[i] -= 1
        while self.launched < len(self.groups) and self.pending[self.launched] == 0:
            self._launch(self.launched)  # in order: every rank runs the same sequence
            self.launched += 1

    def _launch(self, i: int) -> None:
        event = {"bucket": i, "launched": time.perf_counter()}
        self.events.append(event)
        self.futures.append(self.thread.submit(self._run, i, event))

    def _run(self, i: int, event: dict) -> None:  # on the communication thread
        with in_background():
            event["start"] = time.perf_counter()
            self.reduce(i)
            event["end"] = time.perf_counter()

    def wait_oldest(self) -> bool:
        """Block until the oldest unfinished bucket is reduced; False when none is in flight."""
        for f in self.futures:
            if not f.done():
                self._result(f)
                return True
        return False

    def wait(self) -> None:
        """Block until every bucket is reduced (the exposed communication, counted as comm time)."""
        if self.launched < len(self.groups):
            missing = sum(self.pending[self.launched:])
            raise RuntimeError(f"bucket {self.launched} never became ready: {missing} parameter(s) "
                               "got no gradient in this backward (a layer the loss does not use?)")
        for f in self.futures:
            self._result(f)

    def _result(self, f: Future) -> None:
        t0 = time.perf_counter()
        f.result()  # re-raises the collective's error (a peer failed, a timeout) on this thread
        counters().record("grad_wait", 0, 0, time.perf_counter() - t0)

    def close(self) -> None:
        """Stop the thread once its current collective ends (not waited for: after a failure it
        may be blocked until the collective times out)."""
        self.thread.shutdown(wait=False, cancel_futures=True)
