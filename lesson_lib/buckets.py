"""Gradient buckets reduced *during* the backward, as soon as they are ready (chapters 0 and 4).

The backward computes gradients from the last layer to the first. Waiting for all of them before
communicating leaves the network idle during the backward and the cores idle during the
all-reduce. PyTorch's DDP (Li et al., VLDB 2020) groups gradients into buckets (25 MB by default,
in reverse order of the parameters: :func:`plan_ddp`) and all-reduces a bucket as soon as autograd
has written its last gradient, while the backward goes on with earlier layers; ZeRO-2 (Rajbhandari
et al., SC 2020) reduce-scatters buckets the same way and frees each one once scattered (:func:`plan`).

:class:`Overlap` does that with two standard pieces: a hook autograd calls after it has written a
parameter's gradient (``register_post_accumulate_grad_hook``), and one communication thread that
runs the buckets' collectives in order while the main thread computes. Every rank launches the
buckets in the same order (bucket ``i`` only after bucket ``i-1``), so the collectives match.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

import torch

from .metrics import counters, in_background


def plan(sizes: list[int], cap: int) -> list[list[int]]:
    """Indices of ``sizes`` grouped into buckets in backward order (last item first): a bucket
    takes items until adding the next would pass ``cap`` (bytes); an item larger than ``cap``
    gets a bucket of its own. ``cap <= 0`` puts everything in one bucket.

    DeepSpeed's ZeRO rule (``reduce_bucket_size``: a bucket is reduced before an item would make it
    overflow), so the gradients waiting for their reduce-scatter never pass ``cap`` — ZeRO-2's
    memory bound. DDP closes its buckets the other way: :func:`plan_ddp`.
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
    """DDP's buckets for ``sizes`` (bytes) in backward order (last item first): an item joins the
    open bucket, and the bucket closes once it holds ``cap`` bytes or more, so it may pass ``cap``
    by its last item, and a small item never sits alone between two large ones (torch's
    ``compute_bucket_assignment_by_size``, with an explicit ``bucket_cap_mb``; the tests compare
    the two). ``cap <= 0`` puts everything in one bucket.
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
    """Run ``reduce(i)`` for bucket ``i`` on a communication thread once all of its parameters'
    gradients are written, in bucket order; :meth:`wait` blocks until every bucket is reduced.

    ``groups[i]`` is the list of parameters of bucket ``i``. Call :meth:`start` before each
    backward. ``events`` holds, per bucket, when it was launched and when its collective ran
    (``time.perf_counter`` seconds), for the timeline figure.
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
        """Stop the thread once its current collective ends (after a failure it may be blocked in
        one until the peers' connection closes or the collective times out: it is not waited for)."""
        self.thread.shutdown(wait=False, cancel_futures=True)
