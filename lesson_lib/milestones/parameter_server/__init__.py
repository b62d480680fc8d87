"""The parameter server (chapter 1; Li et al., OSDI 2014; Dean et al., 2012): servers hold the model,
workers push gradients and pull parameters.

Ranks 0..K-1 are server shards of the flat parameters and their optimizer state; ranks K..K+N-1 are
workers; all messages are counted point-to-point.

* ``sync``: servers average the N slices and step (single-process SGD on the combined batch).
* ``async``: servers apply each gradient on arrival; ``staleness_bound`` caps the staleness
  (stale synchronous parallel, Ho et al., 2013; :mod:`.staleness`).

A worker silent for ``lost_after_s`` is declared lost (sync fails naming it, async goes on).
``server_gbps`` gives each server an emulated link (:func:`comm.set_link`).
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ... import comm
from ...comm import chunk_bounds
from ...config import TrainConfig, opt, parse_stragglers, positive_int
from ...data import batch_indices, shard, teacher_classification
from ...metrics import ActivationMeter, StepRecorder, counters, memory_report, per_rank_summary
from ...models import flat_views, mlp, mlp_param_count
from ...runtime import context
from ..data_parallel import extra_work
from .staleness import release

NAME = "parameter-server"


@dataclass
class Config(TrainConfig):
    # laptop: chapter 1's synchronous problem, 3 workers and one server.
    PRESETS = {"laptop": {"steps": 30, "global_batch": 48, "hidden": 64, "lr": 0.1, "workers": 3},
               "tiny": {"steps": 6, "global_batch": 24, "hidden": 32, "depth": 2, "samples": 512, "lr": 0.1}}

    world_size: int = opt(0, "derived: workers + servers (leave unset)")
    mode: str = opt("sync", "sync | async")
    workers: int = opt(2, "number of worker ranks (N)")
    servers: int = opt(1, "number of server shards (K); ranks 0..K-1")
    lr: float = opt(0.05, "learning rate of the servers' SGD (momentum 0.9)")
    straggler: str = opt("", "WORKER:FACTOR — worker index 0..N-1 does FACTOR times the work")
    staleness_bound: int = opt(-1, "async only: max pushes a worker may run ahead (-1: unbounded)")
    fail_worker: str = opt("", "WORKER:STEP — that worker stops responding at that step")
    fail_server: int = opt(-1, "step at which server 0 dies (-1: never)")
    lost_after_s: float = opt(3.0, "a server declares a silent worker lost after this many seconds")
    server_gbps: float = opt(0.0, "EMULATED bandwidth of each server's link, Gbit/s (0: the real one)")

    def __post_init__(self):
        if self.world_size == 0 and isinstance(self.workers, int) and isinstance(self.servers, int):
            self.world_size = self.workers + self.servers

    def validate(self) -> "Config":
        positive_int(self, "workers")
        positive_int(self, "servers")
        if self.world_size != self.workers + self.servers:
            raise ValueError(f"world_size={self.world_size} must equal workers + servers = "
                             f"{self.workers + self.servers} (leave world_size unset)")
        super().validate()
        if self.mode not in ("sync", "async"):
            raise ValueError(f"mode must be 'sync' or 'async', got {self.mode!r}")
        if self.global_batch % self.workers:
            raise ValueError(f"global_batch={self.global_batch} must divide evenly over "
                             f"{self.workers} workers")
        psi = param_count(self)
        if self.servers > psi:
            raise ValueError(f"servers={self.servers} is more shards than the {psi} parameters")
        parse_stragglers(self.straggler, self.workers, "straggler")
        self.failures()
        if self.staleness_bound < -1:
            raise ValueError(f"staleness_bound must be -1 (unbounded) or ≥ 0, got {self.staleness_bound}")
        if not self.lost_after_s > 0:
            raise ValueError(f"lost_after_s must be positive, got {self.lost_after_s}")
        if not (isinstance(self.server_gbps, (int, float)) and 0 <= self.server_gbps < float("inf")):
            raise ValueError(f"server_gbps must be a bandwidth >= 0 in Gbit/s (0: off), got "
                             f"{self.server_gbps!r}")
        return self

    def failures(self) -> dict[int, int]:
        """{worker index: step at which it stops}."""
        if not self.fail_worker:
            return {}
        try:
            w, s = (int(x) for x in str(self.fail_worker).split(":"))
        except ValueError:
            raise ValueError(f"fail_worker must look like WORKER:STEP, got {self.fail_worker!r}") from None
        if not 0 <= w < self.workers or not 0 <= s < self.steps:
            raise ValueError(f"fail_worker: worker {w} / step {s} out of range")
        return {w: s}


def param_count(cfg: TrainConfig) -> int:
    return mlp_param_count(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes)


def _receiver(n_messages: int, size: int, out: queue.Queue) -> None:
    """Server side: receive gradient slices from any worker, in arrival order, into ``out``."""
    for _ in range(n_messages):
        buf = torch.empty(size)
        try:
            src = comm.recv_any(buf, op="push")
        except Exception as e:  # abandoned after a lost worker, or the job is failing anyway
            out.put((None, e))
            return
        out.put((src, buf))


def serve(cfg: Config, k: int, emit) -> dict:
    n, K = cfg.workers, cfg.servers
    lo, hi = chunk_bounds(param_count(cfg), K)[k]
    model = mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed)
    flat, _ = flat_views(model)
    weights = flat[lo:hi].clone()  # this shard's slice of the model ...
    del model, flat  # ... and nothing more: a server holds only its shard
    weights.grad = torch.zeros_like(weights)
    optimizer = torch.optim.SGD([weights], lr=cfg.lr, momentum=0.9)  # ... and its optimizer state
    inbox: queue.Queue = queue.Queue()
    threading.Thread(target=_receiver, args=(n * cfg.steps, hi - lo, inbox), daemon=True).start()
    pushes, last_heard, lost, held = [0] * n, [time.monotonic()] * n, set(), []
    version, sent_version, staleness, leads = 0, [0] * n, [], []
    busy = 0.0
    sync = cfg.mode == "sync"
    waiting: dict[int, torch.Tensor] = {}  # sync: this step's slices so far

    def live_unfinished():
        return [w for w in range(n) if w not in lost and pushes[w] < cfg.steps]

    def reply(w, lead=None):
        comm.send(weights.detach(), K + w, op="pull")
        sent_version[w] = version
        if lead is not None:  # async: how many pushes ahead of the slowest worker it goes on
            leads.append(lead)

    while live_unfinished() or held:
        if k == 0 and cfg.fail_server >= 0 and version >= cfg.fail_server * (1 if sync else n):
            os.kill(os.getpid(), signal.SIGKILL)  # the single point of failure, failing
        try:
            src, grad = inbox.get(timeout=0.05)
        except queue.Empty:
            now = time.monotonic()
            blocking = [w for w in live_unfinished() if w not in waiting and w not in held]
            for w in blocking:
                if now - last_heard[w] > cfg.lost_after_s:
                    lost.add(w)
                    emit("lost", worker=w, step=pushes[w])
                    if sync:
                        raise RuntimeError(f"server {k}: worker {w} (rank {K + w}) stopped responding "
                                           f"at step {pushes[w]}; synchronous training cannot go on "
                                           "without its gradient") from None
            if not sync:
                release(held, pushes, lost, cfg.staleness_bound, cfg.steps, reply)
            continue
        if src is None:
            raise grad
        w = src - K
        t0 = time.thread_time()
        pushes[w] += 1
        last_heard[w] = time.monotonic()
        if sync:
            waiting[w] = grad
            if len(waiting) == n:  # every worker's slice is in (a lost worker raised above)
                weights.grad.copy_(torch.stack(list(waiting.values())).sum(0).div_(n))
                optimizer.step()
                version += 1
                for v in sorted(waiting):
                    reply(v)
                    last_heard[v] = time.monotonic()
                waiting.clear()
        else:
            staleness.append(version - sent_version[w])
            weights.grad.copy_(grad)
            optimizer.step()
            version += 1
            held.append(w)
            release(held, pushes, lost, cfg.staleness_bound, cfg.steps, reply)
        busy += time.thread_time() - t0
    counters().scratch((hi - lo) * 4)  # the receive buffer in flight
    memory = memory_report(params=[weights], grads=[weights.grad], optimizer=optimizer)
    if lost:
        context().request_restart()  # the receiver thread may still wait on the lost worker
    return {"role": "server", "shard": k, "updates": version, "staleness": staleness, "leads": leads,
            "lost": sorted(lost), "busy_s": busy, "memory": memory}


def work(cfg: Config, w: int, device, emit) -> dict:
    n, K = cfg.workers, cfg.servers
    bounds = chunk_bounds(param_count(cfg), K)
    model = mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed).to(device)
    flat, grads = flat_views(model)
    x_all, y_all = teacher_classification(cfg.samples, cfg.d_in, cfg.classes)
    factor = parse_stragglers(cfg.straggler, n, "straggler").get(w, 1.0)
    stop_at = cfg.failures().get(w, cfg.steps)
    meter, rec = ActivationMeter(exclude=model.parameters()), StepRecorder(device, emit)
    losses, segments = [], []
    for step in range(stop_at):
        idx = shard(batch_indices(cfg.samples, cfg.global_batch, step, cfg.seed), w, n)
        with rec.step(step) as r:
            t0 = time.time()
            grads.zero_()
            with meter.measure():
                loss = F.cross_entropy(model(x_all[idx]), y_all[idx])
            loss.backward()
            extra_work(model, x_all[idx], y_all[idx], factor)
            t1 = time.time()
            pushes = [comm.exchange(grads[lo:hi], k, None, None, op="push")
                      for k, (lo, hi) in enumerate(bounds)]
            for p in pushes:
                p.wait()
            t2 = time.time()
            pulls = [comm.exchange(None, None, flat[lo:hi], k, op="pull")
                     for k, (lo, hi) in enumerate(bounds)]
            for p in pulls:
                p.wait()
            t3 = time.time()
            r["loss"] = loss.item()
        losses.append(r["loss"])
        segments += [{"worker": w, "step": step, "phase": ph, "start": a, "end": b}
                     for ph, a, b in (("compute", t0, t1), ("push", t1, t2), ("pull (waiting)", t2, t3))]
        emit("segments", worker=w, segments=segments[-3:])
    if stop_at < cfg.steps:
        emit("stopped", worker=w, step=stop_at)
        context().request_restart()
    memory = memory_report(model, None, meter.peak)
    return {"role": "worker", "worker": w, "losses": losses, "segments": segments,
            "stopped_at": stop_at if stop_at < cfg.steps else None,
            "per_rank": per_rank_summary(K + w, rec, memory)}


def worker(cfg: Config) -> dict:
    ctx = context()
    counters().reset()
    k = ctx.rank
    if k < cfg.servers:
        t0 = time.time()
        comm.set_link(cfg.server_gbps or None)
        try:
            out = serve(cfg, k, ctx.emit)
        finally:
            comm.set_link(None)  # warm workers serve other chapters next
        c = counters()
        out["per_rank"] = {"rank": k, "bytes_sent": c.bytes_sent, "bytes_recv": c.bytes_recv, "steps": [],
                           "compute_s": out["busy_s"], "comm_s": c.seconds, "busy_s": out["busy_s"],
                           "wall_s": time.time() - t0, "memory": out["memory"], "ops": c.as_dict()}
        return {**out, "losses": []}
    return work(cfg, k - cfg.servers, ctx.device, ctx.emit)


def summarize(cfg: Config, outs: list[dict]) -> dict:
    servers = [o for o in outs if o["role"] == "server"]
    workers = [o for o in outs if o["role"] == "worker"]
    psi = param_count(cfg)
    losses = []
    for s in range(cfg.steps):  # global loss: mean of the workers' losses at that step
        vals = [o["losses"][s] for o in workers if s < len(o["losses"])]
        losses.append(sum(vals) / len(vals))
    server_bytes = sum(o["per_rank"]["bytes_sent"] + o["per_rank"]["bytes_recv"] for o in servers)
    hist: dict[int, int] = {}
    for o in servers[:1]:
        for st in o["staleness"]:
            hist[st] = hist.get(st, 0) + 1
    return {"losses": losses, "param_count": psi, "param_bytes": 4 * psi,
            "server_bytes_per_step": server_bytes / cfg.steps,
            "server_bytes_formula": 2 * cfg.workers * 4 * psi,
            "per_server_bytes": [o["per_rank"]["bytes_sent"] + o["per_rank"]["bytes_recv"] for o in servers],
            "staleness": {str(k): v for k, v in sorted(hist.items())},
            "max_lead": max((x for o in servers for x in o["leads"]), default=0),  # clocks ahead, SSP's s
            "lost_workers": sorted({w for o in servers for w in o["lost"]}),
            "worker_time": [{"worker": o["worker"], **{ph: sum(s["end"] - s["start"] for s in o["segments"]
                            if s["phase"] == ph) for ph in ("compute", "push", "pull (waiting)")}}
                            for o in workers],
            "segments": [s for o in workers for s in o["segments"]],
            "wall_s": max(o["per_rank"]["wall_s"] for o in outs)}


def reference(cfg: Config) -> list[float]:
    """Single-process SGD (momentum 0.9) on the combined batch: what sync PS must reproduce."""
    from ..data_parallel import reference as single_process

    return single_process(cfg, optimizer="sgd")
