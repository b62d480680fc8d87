"""Pipeline communication (chapter 3): activations forward, gradients backward, point-to-point.

Every message goes through :mod:`lesson_lib.comm`, so its bytes are counted exactly under the op
names ``send_activation`` / ``recv_activation`` / ``send_grad`` / ``recv_grad``.

Receives block: a stage cannot compute before its input arrives, and the time it waits is the
bubble. Sends are posted and left to complete on their own (Gloo's send completes only once the
receiver has posted its receive, so two neighbours sending to each other with blocking sends would
deadlock — the reason Megatron-LM pairs them into one batched exchange). A small thread per
direction waits for each posted send, so its recorded end is when it really completed.

:class:`Timeline` records every action of a rank: forward, backward, send, recv, with its
micro-batch, wall-clock start and end (``time.time()``, comparable across processes on one
machine) and busy time (the main thread's CPU time, ``time.thread_time()``).
"""

from __future__ import annotations

import queue
import threading
import time
from contextlib import contextmanager
from typing import Iterator

import torch

from .. import comm

KINDS = ("forward", "backward", "send", "recv")


class Timeline:
    """One rank's events: ``{rank, step, kind, microbatch, start, end, busy}``."""

    def __init__(self, rank: int):
        self.rank, self.step = rank, 0
        self.events: list[dict] = []

    def record(self, kind: str, microbatch: int, start: float, end: float, busy: float,
               step: int | None = None) -> dict:
        ev = {"rank": self.rank, "step": self.step if step is None else step, "kind": kind,
              "microbatch": microbatch, "start": start, "end": end, "busy": busy}
        self.events.append(ev)  # list.append is atomic: the send watchers append too
        return ev

    @contextmanager
    def event(self, kind: str, microbatch: int) -> Iterator[None]:
        t0, b0 = time.time(), time.thread_time()
        yield
        self.record(kind, microbatch, t0, time.time(), time.thread_time() - b0)

    def of_step(self, step: int) -> list[dict]:
        return [e for e in self.events if e["step"] == step]


class _SendWatcher:
    """Waits, in order, for the sends posted in one direction and records when each completed.

    Sends in one direction complete in the order they were posted (the receiver takes them in that
    order), so waiting in order records each completion at the right moment.
    """

    def __init__(self, timeline: Timeline):
        self.timeline = timeline
        self.q: queue.Queue = queue.Queue()
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            pending, microbatch, start, busy, step = item
            try:
                for w in pending.works:
                    w.wait()  # releases the GIL: the stage computes meanwhile
                self.timeline.record("send", microbatch, start, time.time(), busy, step)
            except Exception:  # the job is failing; the main thread reports it
                pass
            finally:
                self.q.task_done()


class StageLink:
    """Stage ``stage``'s links to its neighbours in a pipeline of ``stages`` ranks (rank = stage)."""

    def __init__(self, stage: int, stages: int, timeline: Timeline):
        self.prev = stage - 1 if stage > 0 else None
        self.next = stage + 1 if stage < stages - 1 else None
        self.timeline = timeline
        self._watchers = {"send_activation": _SendWatcher(timeline), "send_grad": _SendWatcher(timeline)}
        self._posted: list[tuple[comm.Pending, torch.Tensor]] = []

    def _recv(self, shape, src: int, microbatch: int, op: str) -> torch.Tensor:
        buf = torch.empty(shape)  # a fresh buffer per micro-batch: it is kept for the backward
        with self.timeline.event("recv", microbatch):
            comm.exchange(None, None, buf, src, op=op).wait()
        return buf

    def _send(self, tensor: torch.Tensor, dst: int, microbatch: int, op: str) -> None:
        start, b0 = time.time(), time.thread_time()
        pending = comm.exchange(tensor, dst, None, None, op=op)
        self._posted.append((pending, tensor))  # keep the tensor alive until the send is done
        self._watchers[op].q.put((pending, microbatch, start, time.thread_time() - b0,
                                  self.timeline.step))

    def recv_activation(self, shape, microbatch: int) -> torch.Tensor:
        return self._recv(shape, self.prev, microbatch, "recv_activation")

    def send_activation(self, tensor: torch.Tensor, microbatch: int) -> None:
        self._send(tensor, self.next, microbatch, "send_activation")

    def recv_grad(self, shape, microbatch: int) -> torch.Tensor:
        return self._recv(shape, self.next, microbatch, "recv_grad")

    def send_grad(self, tensor: torch.Tensor, microbatch: int) -> None:
        self._send(tensor, self.prev, microbatch, "send_grad")

    def flush(self) -> None:
        """Wait for every posted send (end of a step); the counters record them here."""
        for w in self._watchers.values():
            w.q.join()
        for pending, _ in self._posted:
            pending.wait()
        self._posted.clear()

    def close(self) -> None:
        for w in self._watchers.values():
            w.q.put(None)
