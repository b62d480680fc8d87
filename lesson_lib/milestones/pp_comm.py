"""Pipeline communication (chapter 3): activations forward, gradients backward, point-to-point.

Every message goes through :mod:`lesson_lib.comm`, so its bytes are counted exactly under the op
names ``send_activation`` / ``recv_activation`` / ``send_grad`` / ``recv_grad``.

Receives are posted one micro-batch ahead and waited for when the input is needed: a stage
cannot compute before its input arrives, and the time it waits is the bubble. Sends are posted
and left to complete on their own (Gloo's send completes only once the receiver has posted its
receive, so two neighbours sending to each other with blocking sends would deadlock — the reason
Megatron-LM pairs them into one batched exchange). A small thread per direction waits for each
posted send, so its recorded end is when it really completed.

:class:`Timeline` records every action of a rank: forward, backward, send, recv, with its
micro-batch, wall-clock start and end (``time.time()``, comparable across processes on one
machine) and busy time (the main thread's CPU time, ``time.thread_time()``; on a GPU, the
synchronized wall time, since there the device does the work).
"""

from __future__ import annotations

import queue
import threading
import time
from contextlib import contextmanager
from typing import Iterator

import torch

from .. import comm
from ..metrics import counters, sync


class Timeline:
    """One rank's events: ``{rank, step, kind, microbatch, start, end, busy}``."""

    def __init__(self, rank: int, device: torch.device):
        self.rank, self.step, self.device = rank, 0, device
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
        sync(self.device)  # on a GPU, wait for the kernels: the device is the one busy
        end = time.time()
        busy = end - t0 if self.device.type == "cuda" else time.thread_time() - b0
        self.record(kind, microbatch, t0, end, busy)

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
                # A Gloo send can be waited for only once: the main thread's Pending.wait()
                # must now just count the bytes.
                pending.works = []
                self.timeline.record("send", microbatch, start, time.time(), busy, step)
            except Exception:  # the job is failing: flush() waits again and raises it there
                pass
            finally:
                self.q.task_done()


class StageLink:
    """Stage ``stage``'s links to its neighbours in a pipeline of ``stages`` ranks (rank = stage).

    Both directions carry micro-batches 0, 1, … in order, so the receive of micro-batch i+1 is
    posted as soon as i has arrived: it lands while the stage computes, and the stage waits only
    when its input really is not there yet.
    """

    def __init__(self, stage: int, stages: int, microbatches: int, act_shape, grad_shape, timeline: Timeline):
        self.prev = stage - 1 if stage > 0 else None
        self.next = stage + 1 if stage < stages - 1 else None
        self.microbatches, self.timeline = microbatches, timeline
        self._shapes = {"recv_activation": (act_shape, self.prev), "recv_grad": (grad_shape, self.next)}
        self._early: dict[str, tuple[int, torch.Tensor, comm.Pending]] = {}
        self._watchers = {"send_activation": _SendWatcher(timeline), "send_grad": _SendWatcher(timeline)}
        self._posted: list[tuple[comm.Pending, torch.Tensor]] = []

    def _post_recv(self, op: str, microbatch: int) -> None:
        shape, src = self._shapes[op]
        # a fresh buffer per micro-batch: it is kept for the backward
        buf = torch.empty(shape, device=self.timeline.device)
        self._early[op] = (microbatch, buf, comm.exchange(None, None, buf, src, op=op))

    def begin_step(self) -> None:
        for op, (_, peer) in self._shapes.items():
            if peer is not None:
                self._post_recv(op, 0)

    def _recv(self, op: str, microbatch: int) -> torch.Tensor:
        posted, buf, pending = self._early.pop(op)
        if posted != microbatch:
            raise RuntimeError(f"{op}: expected micro-batch {posted}, the schedule asked for {microbatch}")
        with self.timeline.event("recv", microbatch):
            pending.wait()
        if microbatch + 1 < self.microbatches:
            self._post_recv(op, microbatch + 1)
        return buf

    def _send(self, tensor: torch.Tensor, dst: int, microbatch: int, op: str) -> None:
        start, b0 = time.time(), time.thread_time()
        pending = comm.exchange(tensor, dst, None, None, op=op)
        self._posted.append((pending, tensor))  # keep the tensor alive until the send is done
        self._watchers[op].q.put((pending, microbatch, start, time.thread_time() - b0,
                                  self.timeline.step))

    def recv_activation(self, microbatch: int) -> torch.Tensor:
        return self._recv("recv_activation", microbatch)

    def send_activation(self, tensor: torch.Tensor, microbatch: int) -> None:
        self._send(tensor, self.next, microbatch, "send_activation")

    def recv_grad(self, microbatch: int) -> torch.Tensor:
        return self._recv("recv_grad", microbatch)

    def send_grad(self, tensor: torch.Tensor, microbatch: int) -> None:
        self._send(tensor, self.prev, microbatch, "send_grad")

    def flush(self) -> None:
        """End of a step: wait until every posted send has been taken, and count the bytes."""
        t0 = time.perf_counter()
        for w in self._watchers.values():
            w.q.join()
        waited = time.perf_counter() - t0
        for pending, _ in self._posted:
            pending.wait()  # done: counts its bytes (if its watcher failed, the error surfaces here)
        self._posted.clear()
        counters().record("send_wait", 0, 0, waited)

    def close(self) -> None:
        for w in self._watchers.values():
            w.q.put(None)
