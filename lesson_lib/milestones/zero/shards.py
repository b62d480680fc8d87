"""ZeRO's shards and hooks (chapter 4): each layer's parameters in one flat buffer of which rank r owns
slice r (:class:`Flat`), the bytes a rank holds only for a moment (:class:`Transients`), the module
hooks of stage 3 and of stage 2 with buckets, and one step after the backward (:func:`sharded_step`).
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from ... import buckets, comm
from ...metrics import in_background, storage_bytes


class Flat:
    """One layer's parameters made views of one flat buffer, padded to a multiple of N, that can
    be freed and refilled; rank r owns slice r."""

    def __init__(self, params: list, n: int, rank: int):
        self.params = params
        self.numel = sum(p.numel() for p in params)
        self.padded = -(-self.numel // n) * n
        self.lo, self.hi = comm.chunk_bounds(self.padded, n)[rank]
        self.full = torch.zeros(self.padded, dtype=params[0].dtype, device=params[0].device)
        offset = 0
        for p in params:
            self.full[offset:offset + p.numel()].copy_(p.detach().view(-1))
            p.data = self.full[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        self.shard: torch.Tensor | None = None  # stage 3: the only parameters a rank keeps
        self.grad_shard: torch.Tensor | None = None  # stages 2-3: the only gradient kept
        self.full_grad: torch.Tensor | None = None  # this layer's whole gradient, while it lives
        self.pending = 0

    def point_grads(self, grad: torch.Tensor | None) -> None:
        offset = 0
        for p in self.params:
            p.grad = None if grad is None else grad[offset:offset + p.numel()].view_as(p)
            offset += p.numel()

    def new_grad(self, transient: "Transients | None" = None) -> None:
        """Allocate this layer's full gradient (zeros) and make the parameters' grads views of it."""
        self.full_grad = torch.zeros(self.padded, dtype=self.full.dtype, device=self.full.device)
        if transient is not None:  # stages 2-3: it lives only until scattered
            transient.add(self.full_grad.untyped_storage().nbytes(), grads=True)
        self.point_grads(self.full_grad)

    def drop_grad(self, transient: "Transients") -> None:
        """Free the full gradient once this rank's shard of it is kept."""
        self.point_grads(None)
        transient.add(-self.full_grad.untyped_storage().nbytes(), grads=True)
        self.full_grad = None

    def free(self) -> None:  # the views stay valid; their storage is given back
        self.full.untyped_storage().resize_(0)

    def allocate(self) -> None:  # stage 3: room for the full layer, my shard in its place
        self.full.untyped_storage().resize_(self.padded * self.full.element_size())
        self.full[self.lo:self.hi].copy_(self.shard)

    def gather(self, op: str = "param_all_gather") -> None:
        self.allocate()
        comm.ring_all_gather(self.full, op=op)


class Transients:
    """Live bytes of the buffers a rank allocates only for a moment, and their peak; also of the
    full (unsharded) gradients among them."""

    def __init__(self):
        self.live = self.peak = self.grads_live = self.grads_peak = 0
        self.params_peak = 0  # stage 3: most bytes of gathered (full) parameters allocated at once
        self.lock = threading.Lock()  # stage 2 with buckets frees them on the communication thread

    def add(self, nbytes: int, grads: bool = False) -> None:
        with self.lock:
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            if grads:
                self.grads_live += nbytes
                self.grads_peak = max(self.grads_peak, self.grads_live)


class Prefetch:
    """Stage 3 with ``prefetch = d``: gather the next d layers' parameters on a communication thread
    during the forward. Storage is allocated on the rank's thread at launch, so at most d + 1 layers
    are gathered at once."""

    def __init__(self, units: list[Flat], depth: int, transient: Transients, peak=None, timeline=None):
        self.units, self.depth, self.transient, self.peak = units, depth, transient, peak
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="prefetch")
        self.inflight: dict[int, Future] = {}
        self.timeline = timeline

    def _ring(self, u: Flat) -> None:  # on the communication thread
        with in_background(), self.peak.thread() if self.peak is not None else contextlib.nullcontext():
            with span(self.timeline, "gather, communication thread", self.units.index(u)):
                comm.ring_all_gather(u.full, op="param_all_gather")

    def fetch(self, u: Flat) -> None:
        """Layer ``u``'s forward is next: wait for its gather (or run it), launch the next ones."""
        i = self.units.index(u)
        if i in self.inflight:
            with span(self.timeline, "waiting for the gather", i):
                self.inflight.pop(i).result()  # re-raises a failed collective here
        else:
            with span(self.timeline, "gather, in the forward", i):
                u.gather()
            self.transient.add(u.full.untyped_storage().nbytes())
        for j in range(i + 1, min(i + 1 + self.depth, len(self.units))):
            if j not in self.inflight:  # in layer order: every rank launches the same sequence
                self.units[j].allocate()
                self.transient.add(self.units[j].full.untyped_storage().nbytes())
                self.inflight[j] = self.thread.submit(self._ring, self.units[j])

    def close(self) -> None:
        self.thread.shutdown(wait=False, cancel_futures=True)


@contextlib.contextmanager
def span(timeline: list | None, lane: str, layer: int):
    """Record ``{lane, layer, start, end}`` (perf_counter seconds) in ``timeline`` if one is kept."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        if timeline is not None:
            timeline.append({"lane": lane, "layer": layer, "start": t0, "end": time.perf_counter()})


def fetch_layer_by_layer(units: list[Flat], modules: list, n: int, transient: Transients,
                         prefetch: int = 0, peak=None, timeline: list | None = None) -> Prefetch | None:
    """Stage 3: gather a layer's parameters just before its forward and its backward, free them
    right after; reduce-scatter its gradient once complete. ``prefetch`` > 0: :class:`Prefetch`.
    ``timeline``, if given, receives the forward's gather, compute and wait spans."""
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    ahead = Prefetch(units, prefetch, transient, peak, timeline) if prefetch else None
    started: dict[int, float] = {}

    def gather(u, forward=False):
        if forward and ahead is not None:
            ahead.fetch(u)
        else:
            with span(timeline if forward else None, "gather, in the forward", units.index(u)):
                u.gather()
            transient.add(u.full.untyped_storage().nbytes())
        allocated = sum(v.full.untyped_storage().nbytes() for v in units)  # measured, not bookkept
        transient.params_peak = max(transient.params_peak, allocated)
        if forward:
            started[units.index(u)] = time.perf_counter()

    def free(u):
        i = units.index(u)
        if timeline is not None and i in started:
            timeline.append({"lane": "compute", "layer": i, "start": started.pop(i),
                             "end": time.perf_counter()})
        transient.add(-u.full.untyped_storage().nbytes())
        u.free()

    def before_backward(u):
        gather(u)
        u.new_grad(transient)
        u.pending = len(u.params)

    def grad_ready(u):
        u.pending -= 1
        if u.pending:
            return
        u.grad_shard.copy_(comm.ring_reduce_scatter(u.full_grad, op="grad_reduce_scatter")).div_(n)
        u.drop_grad(transient)
        free(u)

    for u, m in zip(units, modules):
        m.register_forward_pre_hook(lambda mod, args, u=u: gather(u, forward=True))
        m.register_forward_hook(lambda mod, args, out, u=u: free(u))
        m.register_full_backward_pre_hook(lambda mod, grad, u=u: before_backward(u))
        for p in u.params:
            p.register_post_accumulate_grad_hook(lambda p, u=u: grad_ready(u))
    return ahead


def scatter_during_backward(units: list[Flat], modules: list, n: int, bucket_bytes: int,
                            transient: Transients, peak=None) -> buckets.Overlap:
    """Stage 2 with buckets: before a layer's backward, wait until the unscattered gradients fit in
    one bucket; a complete bucket is reduce-scattered on the communication thread, and only this
    rank's slice kept.
    """
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    plan = buckets.plan([u.padded * u.full.element_size() for u in units], bucket_bytes)

    def allocate(u):
        while transient.grads_live > bucket_bytes and overlap.wait_oldest():
            pass  # the backward waits for the network: the price of a bounded memory
        u.new_grad(transient)

    def reduce(i):  # on the communication thread (whose allocations the peak meter counts too)
        with peak.thread() if peak is not None else contextlib.nullcontext():
            for u in (units[j] for j in plan[i]):
                u.grad_shard.copy_(comm.ring_reduce_scatter(u.full_grad, op="grad_reduce_scatter")).div_(n)
                u.drop_grad(transient)

    overlap = buckets.Overlap([[p for j in b for p in units[j].params] for b in plan], reduce)
    for u, m in zip(units, modules):
        m.register_full_backward_pre_hook(lambda mod, grad, u=u: allocate(u))
    return overlap


def sharded_step(units: list[Flat], masters: list, owned: list, optimizer, stage: int, n: int,
                 mixed: bool, transient: Transients, scattered: bool = False) -> None:
    """One ZeRO step after backward (shown in chapter 4): average the gradients, update, share.

    Stages 0-2 reduce-scatter each gradient (rank r: slice r); stage 0 all-gathers it back and
    updates everything, stages 1-2 update slice r and all-gather the parameters. ``scattered``:
    already reduce-scattered during backward (stage 3, or stage 2 with buckets).
    """
    grads = []
    for u in units if stage < 3 and not scattered else ():
        mine = comm.ring_reduce_scatter(u.full_grad, op="grad_reduce_scatter").div_(n)
        if stage == 0:
            grads.append(comm.ring_all_gather(u.full_grad, op="grad_all_gather"))
        elif stage == 1:
            grads.append(mine)
        else:
            u.grad_shard.copy_(mine)
            del mine
            u.drop_grad(transient)  # the full gradient buffer is freed here
    if stage >= 2:
        grads = [u.grad_shard for u in units]
    for m, g in zip(masters, grads):
        m.grad = g.float() if mixed else g
    if mixed:  # the fp32 copy of the gradients Adam reads
        transient.add(storage_bytes([m.grad for m in masters]))
        transient.add(-storage_bytes([m.grad for m in masters]))
    optimizer.step()
    for m, o in zip(masters, owned):
        m.grad = None
        if mixed:
            o.copy_(m)
    for u in units if stage in (1, 2) else ():
        comm.ring_all_gather(u.full, op="param_all_gather")
