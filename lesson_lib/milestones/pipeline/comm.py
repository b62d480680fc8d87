"""Pipeline communication (chapter 3): activations forward, gradients backward, point-to-point.

Messages go through :mod:`lesson_lib.comm`, counted as ``send_activation`` / ``recv_activation`` /
``send_grad`` / ``recv_grad``. Each direction of each link has its own thread that posts messages
and waits for them; receives are posted ahead (at most ``ahead`` untaken), so the stage waits only
when its input really is not there: that wait is the bubble. Why: docs/design.md, "Pipeline links".

:class:`Timeline` records each action (forward, backward, send, recv, arrive_*) with its
micro-batch, wall-clock start and end (``time.time()``) and busy time (``time.thread_time()``; on a
GPU, the synchronized wall time).
"""

from __future__ import annotations

import collections
import contextlib
import queue
import sys
import threading
import time
from contextlib import contextmanager
from typing import Iterator

import torch

from ... import comm
from ...metrics import counters, sync


class Timeline:
    """One rank's events: ``{rank, step, kind, microbatch, start, end, busy}``."""

    def __init__(self, rank: int, device: torch.device):
        self.rank, self.step, self.device = rank, 0, device
        self.events: list[dict] = []

    def record(self, kind: str, microbatch: int, start: float, end: float, busy: float,
               step: int | None = None, chunk: int | None = None) -> dict:
        ev = {"rank": self.rank, "step": self.step if step is None else step, "kind": kind,
              "microbatch": microbatch, "start": start, "end": end, "busy": busy}
        if chunk is not None:  # interleaved 1F1B: which of the rank's model chunks
            ev["chunk"] = chunk
        self.events.append(ev)  # list.append is atomic: the link's threads append too
        return ev

    @contextmanager
    def event(self, kind: str, microbatch: int, chunk: int | None = None) -> Iterator[None]:
        t0, b0 = time.time(), time.thread_time()
        yield
        sync(self.device)  # on a GPU, wait for the kernels: the device is the one busy
        end = time.time()
        busy = end - t0 if self.device.type == "cuda" else time.thread_time() - b0
        self.record(kind, microbatch, t0, end, busy, chunk=chunk)

    def of_step(self, step: int) -> list[dict]:
        return [e for e in self.events if e["step"] == step]


def _post_and_wait(send_t, dst, recv_t, src, op: str, tag: int) -> comm.Pending:
    pending = comm.exchange(send_t, dst, recv_t, src, op=op, tag=tag)
    for w in pending.works:
        w.wait()  # releases the GIL: the stage computes meanwhile
    pending.works = []  # a Gloo work can be waited for once; the main thread only counts the bytes
    return pending


class _Channel:
    """One direction of one link, served in order by its own thread: posts each send and waits for
    it, or posts receives (at most ``ahead`` untaken) and waits for the oldest."""

    def __init__(self, timeline: Timeline, op: str, peer: int, shape=None, ahead: int | None = None,
                 meter=None):
        self.timeline, self.op, self.peer, self.shape, self.meter = timeline, op, peer, shape, meter
        self.arrive = op.replace("recv", "arrive")  # arrive_activation, arrive_grad
        # activations and gradients apart: with 2 interleaved ranks both flow from rank 0 to rank 1
        self.tag = 0 if op.endswith("activation") else 1
        self.room = threading.Semaphore(ahead or sys.maxsize)  # receives the stage has room for
        self.todo: queue.Queue = queue.Queue()  # sends to post, or a number of receives to post
        self.done: queue.Queue = queue.Queue()  # (microbatch, tensor, Pending) or an exception
        self.thread = threading.Thread(target=self._loop, daemon=True, name=f"pp-{op}")
        self.thread.start()

    def _loop(self) -> None:
        # a measured stage counts this thread's allocations too (receive buffers, freed sends)
        with self.meter.thread() if self.meter is not None else contextlib.nullcontext():
            self._serve()

    def _serve(self) -> None:
        while (item := self.todo.get()) is not None:
            try:
                if self.shape is None:  # a send: (tensor, microbatch, step, handed-over time)
                    tensor, microbatch, step, start = item
                    b0 = time.thread_time()
                    pending = _post_and_wait(tensor, self.peer, None, None, self.op, self.tag)
                    busy = time.thread_time() - b0
                    self.timeline.record("send", microbatch, start, time.time(), busy, step)
                    # sent: let the tensor go, or it would stay alive to the step's flush
                    item = tensor = None
                    self.done.put((microbatch, None, pending))
                else:
                    self._receive(*item)
            except Exception as e:  # the job is failing (a peer died, a timeout): the stage raises it
                self.done.put(e)
                return

    def _receive(self, count: int, step: int) -> None:
        """This step's ``count`` micro-batches, in order."""
        posted, nxt = collections.deque(), 0
        while nxt < count or posted:
            # post every receive there is room for; block for room only with none outstanding
            while nxt < count and self.room.acquire(blocking=not posted):
                # a fresh buffer per micro-batch: the stage keeps it for the backward
                buf = torch.empty(self.shape, device=self.timeline.device)
                posted.append((nxt, buf, comm.exchange(None, None, buf, self.peer, op=self.op, tag=self.tag),
                               time.time()))
                nxt += 1
            microbatch, buf, pending, t0 = posted.popleft()
            for w in pending.works:
                w.wait()  # releases the GIL: the stage computes meanwhile
            pending.works = []  # a Gloo work can be waited for once; the stage only counts the bytes
            # when the message landed, whether or not the stage was waiting for it yet
            self.timeline.record(self.arrive, microbatch, t0, time.time(), 0.0, step)
            self.done.put((microbatch, buf, pending))
            buf = pending = None  # the stage's now: not kept alive here while the next one travels

    def take(self) -> tuple[int, torch.Tensor, comm.Pending]:
        while True:
            try:
                item = self.done.get(timeout=1.0)
            except queue.Empty:
                if not self.thread.is_alive():
                    raise RuntimeError(f"{self.op}: the link's thread stopped") from None
                continue
            if isinstance(item, Exception):
                raise item
            if self.shape is not None:
                self.room.release()
            return item


class StageLink:
    """Stage ``stage``'s links to its neighbours in a pipeline of ``stages`` ranks (rank = stage)."""

    def __init__(self, stage: int, stages: int, microbatches: int, act_shape, grad_shape, timeline: Timeline,
                 ahead: int | None = None, meter=None, wrap: dict | None = None):
        """``wrap`` (interleaved 1F1B): the ranks form a ring; maps each receiving op to its
        messages per step (default ``microbatches``)."""
        prev = stage - 1 if stage > 0 else (stages - 1 if wrap else None)
        nxt = stage + 1 if stage < stages - 1 else (0 if wrap else None)
        self.microbatches, self.timeline, self.wrap = microbatches, timeline, wrap or {}
        specs = {"recv_activation": (prev, act_shape), "send_grad": (prev, None),
                 "recv_grad": (nxt, grad_shape), "send_activation": (nxt, None)}
        self.meter = meter  # a PeakMemory whose window the link's threads count in (or None)
        self._ch = {op: _Channel(timeline, op, peer, shape, ahead, meter)
                    for op, (peer, shape) in specs.items() if peer is not None}
        self._unsent = {op: 0 for op in self._ch if op.startswith("send")}

    def begin_step(self) -> None:
        for op in ("recv_activation", "recv_grad"):
            if op in self._ch:
                self._ch[op].todo.put((self.wrap.get(op, self.microbatches), self.timeline.step))

    def _recv(self, op: str, microbatch: int) -> torch.Tensor:
        t0 = time.perf_counter()
        with self.timeline.event("recv", microbatch):
            got, buf, pending = self._ch[op].take()
        if got != microbatch:
            raise RuntimeError(f"{op}: expected micro-batch {got}, the schedule asked for {microbatch}")
        counters().record(op, 0, pending.recv, time.perf_counter() - t0)
        return buf

    def _send(self, tensor: torch.Tensor, microbatch: int, op: str) -> None:
        self._ch[op].todo.put((tensor, microbatch, self.timeline.step, time.time()))
        self._unsent[op] += 1

    def recv_activation(self, microbatch: int) -> torch.Tensor:
        return self._recv("recv_activation", microbatch)

    def send_activation(self, tensor: torch.Tensor, microbatch: int) -> None:
        self._send(tensor, microbatch, "send_activation")

    def recv_grad(self, microbatch: int) -> torch.Tensor:
        return self._recv("recv_grad", microbatch)

    def send_grad(self, tensor: torch.Tensor, microbatch: int) -> None:
        self._send(tensor, microbatch, "send_grad")

    def flush(self) -> None:
        """End of a step: wait until every send has been taken, and count the bytes."""
        t0 = time.perf_counter()
        for op, n in self._unsent.items():
            for _ in range(n):
                self._ch[op].take()[2].wait()  # already waited for: counts its bytes
        self._unsent = dict.fromkeys(self._unsent, 0)
        counters().record("send_wait", 0, 0, time.perf_counter() - t0)

    def close(self) -> None:
        for ch in self._ch.values():
            ch.todo.put(None)
        if self.meter is not None:  # the threads' counts must be in before the meter adds them up
            for ch in self._ch.values():
                ch.thread.join(timeout=10.0)
