"""Surviving a failure (chapter 4 §9): FSDP2 training with sharded ``torch.distributed.checkpoint``
(DCP) checkpoints, a rank SIGKILLed mid-step, and a fresh world that resumes from the last one.

* :func:`save` / :func:`load`: each rank's DTensor shards of parameters and Adam's moments, the step
  and the data position. DCP writes ``.metadata`` last, so a folder without it is never loaded.
* :func:`train` (every rank): resume, train, save every ``Plan.every`` steps, optionally SIGKILL
  rank ``Plan.kill_rank`` between forward and backward at ``Plan.kill_step``.
* :func:`survive` (notebook): uninterrupted, killed and resumed runs, and the time lost.

The batch of step s is a function of (seed, s), so the step counter is the data position.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from ...config import opt
from ...data import batch_indices, shard, teacher_classification
from ...models import mlp
from ...runtime import WorkerError, context, folders, warm_cluster
from .milestone import Config

DONE = ".metadata"  # written by DCP's coordinator once every rank's shard is on disk


@dataclass
class Plan:
    """When to checkpoint, and which rank dies when (validated against the run's ``Config``)."""

    every: int = opt(4, "save a checkpoint after every this many steps")
    kill_step: int = opt(-1, "SIGKILL rank kill_rank in this step (0-based), after its forward; -1: no kill")
    kill_rank: int = opt(1, "the rank that is killed")

    def validate(self, cfg: Config) -> "Plan":
        if isinstance(self.every, bool) or not isinstance(self.every, int) \
                or not 1 <= self.every <= cfg.steps:
            raise ValueError(f"every must be a number of steps in 1..steps={cfg.steps}, got {self.every!r}")
        if isinstance(self.kill_step, bool) or not isinstance(self.kill_step, int) \
                or not -1 <= self.kill_step < cfg.steps:
            raise ValueError(f"kill_step must be -1 (no kill) or a step in 0..{cfg.steps - 1} "
                             f"(the run has steps={cfg.steps}), got {self.kill_step!r}")
        if isinstance(self.kill_rank, bool) or not isinstance(self.kill_rank, int) \
                or not 0 <= self.kill_rank < cfg.world_size:
            raise ValueError(f"kill_rank must be a rank in 0..{cfg.world_size - 1}, got {self.kill_rank!r}")
        return self


def save(folder: str, model, optimizer, step: int, cfg: Config) -> str:
    """Every rank writes its own shard of the model and optimizer state, plus where training stands."""
    model_state, optim_state = get_state_dict(model, optimizer)  # DTensors: this rank's shards
    per_epoch = max(1, cfg.samples // cfg.global_batch)
    state = {"model": model_state, "optim": optim_state,
             "train": {"step": step, "epoch": step // per_epoch, "batch_in_epoch": step % per_epoch}}
    path = os.path.join(folder, f"step-{step:05d}")
    dcp.save(state, checkpoint_id=path)  # a collective: returns once .metadata is written
    return path


def load(folder: str, model, optimizer) -> int:
    """Load the newest complete checkpoint under ``folder`` into ``model`` and ``optimizer`` (each rank
    reads its own shards); return the step to start from (0 without one)."""
    done = sorted(p.parent for p in Path(folder).glob(f"step-*/{DONE}"))
    newest = [str(done[-1]) if done else None]
    dist.broadcast_object_list(newest, src=0)  # rank 0 decides: on shared storage views can differ
    if newest[0] is None:
        return 0
    model_state, optim_state = get_state_dict(model, optimizer)  # the shapes to read into
    train = {"step": -1, "epoch": -1, "batch_in_epoch": -1}  # DCP fills these in
    state = {"model": model_state, "optim": optim_state, "train": train}
    dcp.load(state, checkpoint_id=newest[0])  # in place, each rank its own shards
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return state["train"]["step"]


def _fsdp2(cfg: Config):
    from torch.distributed.fsdp import fully_shard

    model = mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed).to(context().device)
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m)  # one unit per layer, as in section 8
    fully_shard(model)
    return model, torch.optim.Adam(model.parameters(), lr=cfg.lr)


def train(cfg: Config, plan: Plan, folder: str) -> dict:
    """On every rank: FSDP2 + Adam on ``cfg`` from the newest checkpoint in ``folder``, saving every
    ``plan.every`` steps. Rank 0 emits ``step`` and ``saved`` events (a killed run returns nothing).
    Returns the steps run, their losses and the time to load."""
    ctx = context()
    r, n = ctx.rank, ctx.world_size
    model, adam = _fsdp2(cfg)
    t0 = time.perf_counter()
    start = load(folder, model, adam)
    load_s = time.perf_counter() - t0
    x_all, y_all = (t.to(ctx.device) for t in teacher_classification(cfg.samples, cfg.d_in, cfg.classes))
    losses = []
    for step in range(start, cfg.steps):
        t0 = time.perf_counter()
        idx = shard(batch_indices(cfg.samples, cfg.global_batch, step, cfg.seed), r, n)
        loss = F.cross_entropy(model(x_all[idx]), y_all[idx])
        if step == plan.kill_step and r == plan.kill_rank:
            Path(folder, "killed.json").write_text(json.dumps({"step": step, "time": time.time()}))
            os.kill(os.getpid(), signal.SIGKILL)  # mid-step: its peers wait in the backward's collectives
        loss.backward()
        adam.step()
        adam.zero_grad()
        lt = loss.detach().reshape(1)
        dist.all_reduce(lt)
        losses.append(float(lt) / n)
        if r == 0:
            ctx.emit("step", step=step, loss=losses[-1], seconds=time.perf_counter() - t0)
        if (step + 1) % plan.every == 0:
            t0 = time.perf_counter()
            save(folder, model, adam, step + 1, cfg)
            if r == 0:
                ctx.emit("saved", step=step + 1, seconds=time.perf_counter() - t0, time=time.time())
    return {"start": start, "losses": losses, "load_s": load_s}


def shards(path: str) -> dict:
    """A checkpoint on disk: each file's bytes and, from DCP's metadata, which file stores which tensors."""
    meta = dcp.FileSystemReader(path).read_metadata()
    files: dict[str, list] = {}
    elements: dict[str, int] = {}
    for index, info in meta.storage_data.items():
        files.setdefault(info.relative_path, []).append(index.fqn)
        chunks = getattr(meta.state_dict_metadata[index.fqn], "chunks", ())  # a tensor's, by offset
        numel = [c.sizes.numel() for c in chunks if tuple(c.offsets) == tuple(index.offset or ())]
        elements[info.relative_path] = elements.get(info.relative_path, 0) + sum(numel)
    return {"bytes": {f.name: f.stat().st_size for f in sorted(Path(path).iterdir())},
            "keys": {f: sorted(set(k)) for f, k in sorted(files.items())},
            "elements": dict(sorted(elements.items()))}


def _scratch():
    # Named like the runtime's folders, so that one a dead kernel left is swept by the next cluster.
    return tempfile.TemporaryDirectory(prefix=f"{folders.PREFIX}{os.getpid()}_ckpt_")


def survive(cfg: Config, plan: Plan, cluster=None) -> dict:
    """Train ``cfg`` with FSDP2 uninterrupted, killed (``plan``), then resumed on fresh processes.
    Returns each run's losses by step, the kill's error and the measured time lost. Checkpoints live
    in a temporary folder removed before returning."""
    plan.validate(cfg)
    if plan.kill_step < 0:
        raise ValueError("kill_step must name the step in which a rank dies (got -1: no kill)")
    if cluster is not None and cluster.world_size != cfg.world_size:
        raise ValueError(f"cluster has {cluster.world_size} ranks, cfg.world_size={cfg.world_size}")
    cluster = cluster or warm_cluster(cfg.world_size)
    out: dict = {"every": plan.every, "kill_step": plan.kill_step, "kill_rank": plan.kill_rank,
                 "folders": []}
    cluster.run(_fsdp2_imported)  # the warm ranks import FSDP2 and DCP before anything is timed
    with _scratch() as folder:
        out["folders"].append(folder)
        t0 = time.perf_counter()
        base = cluster.run(train, cfg, Plan(plan.every, -1, plan.kill_rank), folder)
        out["uninterrupted_s"] = time.perf_counter() - t0
        out["uninterrupted"] = base[0]["losses"]
        out["shards"] = shards(os.path.join(folder, f"step-{plan.every:05d}"))
    with _scratch() as folder:
        out["folders"].append(folder)
        killed: dict = {"step": {}, "saved": {}}
        t0 = time.perf_counter()
        try:
            cluster.run(train, cfg, plan, folder,
                        on_event=lambda e: killed[e["kind"]].__setitem__(e["step"], e))
        except WorkerError as e:
            caught, out["error"], out["failed_rank"] = time.time(), str(e).splitlines()[0], e.rank
        else:
            raise RuntimeError(f"rank {plan.kill_rank} was to be killed in step {plan.kill_step}, "
                               "but the run finished")
        out["killed_run_s"] = time.perf_counter() - t0
        kill = json.loads(Path(folder, "killed.json").read_text())
        t0 = time.perf_counter()
        cluster.start()  # the failed run closed every worker: a fresh world, new processes
        out["restart_s"] = time.perf_counter() - t0
        resumed: dict = {"step": {}, "saved": {}}
        t0 = time.perf_counter()
        again = cluster.run(train, cfg, Plan(plan.every, -1, plan.kill_rank), folder,
                            on_event=lambda e: resumed[e["kind"]].__setitem__(e["step"], e))
        out["resumed_run_s"] = time.perf_counter() - t0
    restored = again[0]["start"]
    last_save = killed["saved"].get(restored)
    out.update(
        killed={s: e["loss"] for s, e in sorted(killed["step"].items())},
        resumed=dict(zip(range(restored, cfg.steps), again[0]["losses"])),
        restored_step=restored, load_s=max(a["load_s"] for a in again),
        save_s=[e["seconds"] for _, e in sorted(killed["saved"].items())],
        detect_s=caught - kill["time"],
        # the work the kill threw away: from the last checkpoint to the kill, redone after the restart
        lost_work_s=kill["time"] - last_save["time"] if last_save else float("nan"),
        redone_steps=plan.kill_step - restored,
        redone_s=sum(resumed["step"][s]["seconds"] for s in range(restored, plan.kill_step)),
    )
    # What the failure added to the uninterrupted wall time; beyond the parts above, the fresh
    # processes' first job (importing FSDP2 and DCP, sharding).
    out["time_lost_s"] = (out["killed_run_s"] + out["restart_s"] + out["resumed_run_s"]
                          - out["uninterrupted_s"])
    return out


def _fsdp2_imported() -> None:
    from torch.distributed.fsdp import fully_shard  # noqa: F401


def young_interval(write_s: float, mtbf_s: float) -> float:
    """Young's (1974) optimal time between checkpoints, sqrt(2·δ·MTBF)."""
    if not (write_s > 0 and mtbf_s > 0):
        raise ValueError(f"write_s and mtbf_s must be positive seconds, got {write_s!r}, {mtbf_s!r}")
    return (2 * write_s * mtbf_s) ** 0.5
