"""A replicated parameter-server shard that survives its primary's death (chapter 1 §5).

Li et al. (OSDI 2014, §4) replicate each key range: the master copies every aggregated
modification to its replicas before the push counts as done — chain replication (van Renesse &
Schneider, OSDI 2004) with a chain of two. Here rank 0 is the primary, rank 1 its backup, ranks
2…N+1 synchronous workers. The primary steps, forwards the averaged gradient and step number, and
replies only after the backup's ack, so the backup matches it bit for bit.

At step ``fail_at`` the primary leaves after receiving the pushes, sending the backup a farewell
(step −1) in place of a closed connection; the backup tells the workers, who push that step again
to it. No message waits for a rank that is gone, so nothing hangs or depends on timing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ... import comm
from ...config import TrainConfig, opt, positive_int
from ...data import batch_indices, shard, teacher_classification
from ...metrics import counters
from ...models import flat_views, mlp, mlp_param_count
from ...runtime import context

NAME = "parameter-server-replicas"
PRIMARY, BACKUP, FIRST_WORKER = 0, 1, 2
HEADER_BYTES = 4  # the step number (float32) before each forwarded update; the ack is one too


@dataclass
class Config(TrainConfig):
    # laptop: chapter 1 §5, two workers, the primary gone at step 5 of 12; tiny: for tests.
    PRESETS = {"laptop": {"steps": 12, "global_batch": 48, "hidden": 64, "lr": 0.1, "fail_at": 5},
               "tiny": {"steps": 6, "global_batch": 24, "hidden": 32, "depth": 2, "samples": 512,
                        "lr": 0.1, "fail_at": 3}}

    world_size: int = opt(0, "derived: workers + 2 server ranks (leave unset)")
    workers: int = opt(2, "number of worker ranks (N)")
    lr: float = opt(0.1, "learning rate of the servers' SGD (momentum 0.9)")
    fail_at: int = opt(-1, "step at which the primary leaves after receiving the pushes (-1: never)")

    def __post_init__(self):
        if self.world_size == 0 and isinstance(self.workers, int):
            self.world_size = self.workers + 2

    def validate(self) -> "Config":
        positive_int(self, "workers")
        if self.world_size != self.workers + 2:
            raise ValueError(f"world_size={self.world_size} must equal workers + 2 = {self.workers + 2} "
                             "(leave world_size unset)")
        super().validate()
        if self.global_batch % self.workers:
            raise ValueError(f"global_batch={self.global_batch} must divide evenly over "
                             f"{self.workers} workers")
        if isinstance(self.fail_at, bool) or not isinstance(self.fail_at, int) \
                or not -1 <= self.fail_at < self.steps:
            raise ValueError(f"fail_at must be -1 (never) or a step in [0, {self.steps}), "
                             f"got {self.fail_at!r}")
        return self


def param_count(cfg: Config) -> int:
    return mlp_param_count(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes)


def server_state(cfg: Config) -> tuple[torch.Tensor, torch.optim.Optimizer]:
    """The shard (here the whole model) and its optimizer: the same start on both servers."""
    flat, _ = flat_views(mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed))
    weights = flat.clone()
    weights.grad = torch.zeros_like(weights)
    return weights, torch.optim.SGD([weights], lr=cfg.lr, momentum=0.9)


def receive_pushes(grad: torch.Tensor, n: int) -> None:
    """Every worker's gradient, in worker order (the same sums on either server), averaged."""
    incoming = torch.empty_like(grad)
    grad.zero_()
    for w in range(n):
        comm.recv(incoming, FIRST_WORKER + w, op="push")
        grad += incoming
    grad /= n


def reply(weights: torch.Tensor, n: int, op: str = "pull") -> None:
    for w in range(n):
        comm.send(weights.detach(), FIRST_WORKER + w, op=op)


def primary(cfg: Config) -> dict:
    weights, optimizer = server_state(cfg)
    ack = torch.empty(1)
    for step in range(cfg.steps):
        receive_pushes(weights.grad, cfg.workers)
        if step == cfg.fail_at:  # it leaves: the pushes arrived, none was acknowledged
            comm.send(torch.tensor([-1.0]), BACKUP, op="farewell")  # stands for its closed connection
            return {"role": "primary", "acknowledged": step}
        optimizer.step()
        comm.send(torch.tensor([float(step)]), BACKUP, op="replicate")  # the update's timestamp ...
        comm.send(weights.grad, BACKUP, op="replicate")                 # ... and the update itself
        comm.recv(ack, BACKUP, op="ack")   # the backup has it: only now is the push acknowledged
        reply(weights, cfg.workers)
    return {"role": "primary", "acknowledged": cfg.steps}


def backup(cfg: Config) -> dict:
    weights, optimizer = server_state(cfg)
    header, took_over, in_order = torch.empty(1), None, True
    for step in range(cfg.steps):
        if took_over is None:
            comm.recv(header, PRIMARY, op="replicate")
            if header.item() >= 0:  # an update: apply it exactly as the primary did, then acknowledge
                in_order &= header.item() == step
                comm.recv(weights.grad, PRIMARY, op="replicate")
                optimizer.step()
                comm.send(header, PRIMARY, op="ack")
                continue
            took_over = step  # the primary is gone: serve from now on, starting with this step
            reply(weights, cfg.workers, op="failover")  # "ask me; here is every acknowledged step"
        receive_pushes(weights.grad, cfg.workers)
        optimizer.step()
        reply(weights, cfg.workers)
    return {"role": "backup", "took_over": took_over, "in_order": in_order,
            "params": weights.detach().clone()}


def work(cfg: Config, w: int) -> dict:
    model = mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed)
    flat, grads = flat_views(model)
    x_all, y_all = teacher_classification(cfg.samples, cfg.d_in, cfg.classes)
    server, incoming, losses, switched = PRIMARY, torch.empty_like(flat), [], None
    for step in range(cfg.steps):
        idx = shard(batch_indices(cfg.samples, cfg.global_batch, step, cfg.seed), w, cfg.workers)
        grads.zero_()
        loss = F.cross_entropy(model(x_all[idx]), y_all[idx])
        loss.backward()
        comm.send(grads, server, op="push")
        src = comm.recv_any(incoming, op="pull")  # from the server it pushed to, or from the backup
        if src != server:  # the backup took over: what it holds is what this worker already has
            switched = {"step": step, "same_params": torch.equal(incoming, flat)}
            server = src
            comm.send(grads, server, op="push")  # the unacknowledged push, again
            comm.recv(incoming, server, op="pull")
        with torch.no_grad():
            flat.copy_(incoming)
        losses.append(loss.item())
    return {"role": "worker", "worker": w, "losses": losses, "switched": switched,
            "params": flat.detach().clone()}


def worker(cfg: Config) -> dict:
    rank = context().rank
    counters().reset()
    if rank == PRIMARY:
        out = primary(cfg)
    elif rank == BACKUP:
        out = backup(cfg)
    else:
        out = work(cfg, rank - FIRST_WORKER)
    out["ops"] = counters().as_dict()
    counters().reset()
    return out


def replication_bytes(cfg: Config) -> int:
    """Bytes replication adds: per acknowledged step, the averaged gradient (S), its step number and
    the ack (4 bytes each)."""
    acknowledged = cfg.fail_at if cfg.fail_at >= 0 else cfg.steps
    return acknowledged * (4 * param_count(cfg) + 2 * HEADER_BYTES)


def _bytes(ops: dict, op: str, key: str) -> int:
    return ops.get(op, {}).get(key, 0)


def summarize(cfg: Config, outs: list[dict]) -> dict:
    p, b, workers = outs[PRIMARY], outs[BACKUP], outs[FIRST_WORKER:]
    s = 4 * param_count(cfg)
    counted = _bytes(p["ops"], "replicate", "bytes_sent") + _bytes(p["ops"], "ack", "bytes_recv")
    served = sum(_bytes(o["ops"], "push", "bytes_recv") + _bytes(o["ops"], "pull", "bytes_sent")
                 for o in (p, b))
    failed = cfg.fail_at >= 0  # then the pushes of that step went twice: to the primary, then again
    return {"param_bytes": s, "losses": [sum(v) / len(v) for v in zip(*(o["losses"] for o in workers))],
            "acknowledged_by_primary": p["acknowledged"], "took_over": b["took_over"],
            "in_order": b["in_order"], "switched": [o["switched"] for o in workers],
            "replication_bytes": counted, "replication_formula": replication_bytes(cfg),
            "serving_bytes": served, "serving_formula": (2 * cfg.steps + failed) * cfg.workers * s,
            "recovery_bytes": _bytes(p["ops"], "farewell", "bytes_sent")
            + _bytes(b["ops"], "failover", "bytes_sent"),
            "recovery_formula": failed * (HEADER_BYTES + cfg.workers * s),
            "params": workers[0]["params"], "backup_params": b["params"],
            "workers_agree": all(torch.equal(o["params"], workers[0]["params"]) for o in workers)}


def run(cfg: Config, cluster) -> dict:
    """``cfg`` on ``cluster`` (``cfg.world_size`` ranks): the summary of the ranks' results."""
    cfg.validate()
    return summarize(cfg, cluster.run(worker, cfg, timeout_s=max(30.0, cfg.timeout_s)))


def reference(cfg: Config) -> list[float]:
    """Single-process SGD (momentum 0.9) on the combined batch: what the replicated run reproduces."""
    from ..data_parallel import reference as single_process

    return single_process(cfg, optimizer="sgd")
