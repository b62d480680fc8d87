"""The impact experiment's results (chapter 7): per milestone, time and steps to the target loss, bytes
moved, memory, and the cost model's prediction beside the measurement.
"""

from __future__ import annotations

from ...experiments import Result, load
from ...metrics import MEMORY_CATEGORIES
from ...models import mlp_param_count
from .milestone import LABELS, OPTIMIZER, Config, plans
from .predict import predict, predict_compression


def smoothed(losses: list[float], window: int) -> list[float]:
    """Mean of the last ``window`` losses at each step (fewer at the start)."""
    return [sum(losses[max(0, i + 1 - window):i + 1]) / (i + 1 - max(0, i + 1 - window))
            for i in range(len(losses))]


def reached_at(losses: list[float], target: float, window: int) -> int | None:
    """The first step (counted from 1) whose mean over the last ``window`` steps is ≤ target;
    at least ``window`` steps must have run."""
    for i, v in enumerate(smoothed(losses, window)):
        if i + 1 >= window and v <= target:
            return i + 1
    return None


def slowest(r: Result, key: str) -> float:
    """The largest per-rank median of ``key`` over the ranks that record steps (not a server)."""
    return max(v for v, p in zip(r.median_step(key), r.per_rank) if p.steps)


def record(name: str, experiment: str, sub, outs: list[dict], cfg: Config) -> dict:
    """One milestone's line of the dashboard, from its own ``summarize`` and per-rank records."""
    mod = load(experiment)
    extra = mod.summarize(sub, outs)
    r = Result(experiment=mod.NAME, world_size=sub.world_size, backend="", config=sub.as_dict(),
               losses=extra.pop("losses", outs[0]["losses"]), per_rank=[o["per_rank"] for o in outs])
    steps_run = len(r.losses)
    walls = r.step_times()
    at = reached_at(r.losses, cfg.target_loss, cfg.window)
    moved = [sum(v["bytes_sent"] + v["bytes_recv"] for op, v in p.ops.items()
                 if not op.startswith("final")) / steps_run for p in r.per_rank]
    return {
        "milestone": name, "label": LABELS[name], "experiment": experiment, "optimizer": OPTIMIZER[name],
        "global_batch": sub.global_batch, "world_size": sub.world_size, "steps_run": steps_run,
        "reached_target": at is not None, "steps": at if at is not None else steps_run,
        # step 0 pays one-off costs (first connections, allocations): it counts as a median step
        "time_to_target_s": r.median_step_time() + sum(walls[1:at]) if at is not None else None,
        "time_run_s": sum(walls), "median_step_s": r.median_step_time(),
        "median_comm_s": slowest(r, "comm_s"), "median_busy_s": slowest(r, "busy_s"),
        "bytes_per_step_busiest": max(moved), "bytes_per_step_per_rank": moved,
        "peak_memory_per_rank": [{k: p.memory[k] for k in MEMORY_CATEGORIES} for p in r.per_rank],
        "losses": r.losses, "step_times": walls,
        "param_count": mlp_param_count(sub.d_in, sub.hidden, sub.depth, sub.classes),
        # None: the real link (here, memory copies between processes); a number: EMULATED Gbit/s
        "link_gbps": getattr(sub, "link_gbps", 0.0) or None,
        "compression_ratio": extra.get("compression_ratio"),
    }


def summarize(cfg: Config, outs: list[dict]) -> dict:
    probe = outs[0]["probe"]
    records = []
    for name, (experiment, sub) in plans(cfg).items():
        rec = record(name, experiment, sub, [o["milestones"][name] for o in outs], cfg)
        p = predict(name, sub, probe)
        rec.update(predicted_step_s=p["step"], predicted_compute_s=p["compute"], predicted_comm_s=p["comm"])
        if rec["link_gbps"]:  # what compression saves there: the uncompressed ring on the same link
            rec["predicted_uncompressed_step_s"] = predict_compression(sub.replace(compressor="none"),
                                                                       probe)["step"]
        records.append(rec)
    return {"milestones": records, "target_loss": cfg.target_loss, "window": cfg.window,
            "probe": probe, "losses": records[0]["losses"]}
