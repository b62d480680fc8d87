"""What notebooks/10_resilience.ipynb calls: each function runs one section's replicas or ranks,
prints what it found, draws it, and returns the data the notebook asserts on. The algorithms are in
:mod:`lesson_lib.milestones.resilience` and in the notebook's cells; no presets here."""

from __future__ import annotations

import torch
from IPython.display import display

from .. import plots
from ..milestones.resilience import ft_diloco, ft_step, torchft_glue
from ..milestones.resilience import task as T
from ..runtime import replicas, warm_cluster
from .ch10_failures import calculator, failure_cost  # noqa: F401  (the notebook calls them here)
from .ch10_link import bytes_and_quality, slow_link  # noqa: F401


def _steps_figure(res: list[dict], kill: tuple[int, int], title: str, unit: str = "step") -> None:
    """Each replica's step times on one clock, the killed one labelled, and marked: the step the
    survivors discarded, and the step the returner was healed at (§2's two demonstrations)."""
    name = {r["replica"]: f"replica {r['replica']}" + (" (killed, then healed)" if r["replica"] == kill[0]
                                                        else "") for r in res}
    marks = []
    for r in res:
        for e in r["log"]:
            if "discarded" in e and r["replica"] != kill[0]:
                marks.append((name[r["replica"]], e["discarded"], f"{unit} {e['discarded']} discarded: "
                              f"replica {kill[0]} SIGKILLed"))
            if "healed_at" in e and r["replica"] == kill[0]:
                source = f"replica {e['from']}" if "from" in e else "a live replica"
                marks.append((name[r["replica"]], e["healed_at"], f"healed from {source}"))
    display(plots.resilience.replica_steps({name[r["replica"]]: r["times"] for r in res}, title,
                                           marks=tuple(dict.fromkeys(marks))))


def _kill(kill, n: int, steps: int, what: str = "step") -> tuple[int, int]:
    """``kill`` as one (replica, step) pair in range, or a ValueError naming the argument (one
    replica dies per run; the last step waits for every replica, so nobody can die in it)."""
    if not (isinstance(kill, (tuple, list)) and len(kill) == 2
            and all(isinstance(k, int) and not isinstance(k, bool) for k in kill)):
        raise ValueError(f"kill={kill!r}: give one (replica, {what}) pair, e.g. kill=(1, 3); "
                         "one replica is killed per run")
    r, s = kill
    if not 0 <= r < n:
        raise ValueError(f"kill={kill!r}: there is no replica {r}; the replicas are 0 … {n - 1}")
    if not 1 <= s <= steps - 2:
        raise ValueError(f"kill={kill!r}: kill in {what} 1 … {steps - 2} of this run's {steps} "
                         f"({what} {steps - 1}, the last, waits for every replica)")
    return r, s


def survive(task: T.Task, n: int = 2, kill: tuple[int, int] = (1, 5), job=None,
            restart_after_s: float = 0.4) -> dict:
    """§2: our replicas (``job``, default :func:`ft_step.replica`), one SIGKILLed mid-exchange and
    restarted from a hot spare; the survivors' stall, the returner's weights."""
    job, kill = job or ft_step.replica, _kill(kill, n, task.steps)
    out = replicas.run(job, n, task, kill, restart=(kill[0],), restart_after_s=restart_after_s,
                       watch=lambda s, a, st: ft_step.lighthouse(s, a, st, n, task.steps - 1))
    res = out["results"]
    survivor = res[0] if kill[0] != 0 else res[1]
    times = [t["s"] for t in survivor["times"]]
    stall = max(t["s"] for t in survivor["times"] if t["discarded"])
    usual = sorted(times)[len(times) // 2]
    hold = survivor["times"][-1]["s"]
    equal = all(torch.equal(r["params"], survivor["params"]) for r in res)
    replay = torch.equal(ft_step.replay(task, survivor["log"]), survivor["params"])
    healed = next(e for e in res[kill[0]]["log"] if "healed_at" in e)
    alone = sum(1 for e in survivor["log"] if "step" in e and len(e["members"]) < n)
    discarded = [e["discarded"] for e in survivor["log"] if "discarded" in e]
    print(f"replica {kill[0]} SIGKILLed in step {kill[1]} (exit code {out['deaths'][0]['exitcode']}), "
          f"its spare started {out['restarts'][0]['at_s'] - out['deaths'][0]['at_s']:.2f} s later\n"
          f"the survivors: step {kill[1]} discarded after {stall * 1e3:.0f} ms (a median step: "
          f"{usual * 1e3:.0f} ms), then {alone} steps without it\n"
          f"the last step waited {hold:.2f} s for every replica (this chapter's rule, so that the run ends "
          f"with all of them)\n"
          f"replica {kill[0]} healed from replica {healed['from']} at step {healed['healed_at']}; at the end "
          f"every replica's weights bit-equal: {equal}; equal to one process replaying the quorums: {replay}")
    _steps_figure(res, kill, f"{n} replica groups, replica {kill[0]} SIGKILLed in step {kill[1]}: the "
                             "survivor's step waits for the lighthouse to notice, then goes on alone")
    return {"out": out, "equal": equal, "replay": replay, "stall_s": stall, "median_s": usual, "hold_s": hold,
            "healed": healed, "alone": alone, "discarded": discarded}


def quorum_batch(task: T.Task, survived: dict, n: int = 2) -> list[dict]:
    """§2: each committed step of the survivor's log, its quorum's size, the samples its averaged
    gradient covered, the learning rate applied, and the one the linear scaling rule (Goyal et al.,
    2017: lr proportional to the batch) would give that batch."""
    res = survived["out"]["results"]
    log = (res[0] if survived["out"]["deaths"][0]["replica"] != 0 else res[1])["log"]
    rows = [{"step": e["step"], "members": len(e["members"]), "batch": len(e["members"]) * task.batch,
             "lr": task.lr, "linear_rule_lr": task.lr * len(e["members"]) / n} for e in log if "step" in e]
    short = [r for r in rows if r["members"] < n]
    print(f"steps with all {n} replicas: {len(rows) - len(short)}, global batch {n * task.batch:,} samples, "
          f"lr {task.lr}")
    for r in short:
        print(f"step {r['step']}: {r['members']} of {n} replicas, global batch {r['batch']:,} samples, "
              f"the same lr {r['lr']}; the linear scaling rule would take {r['linear_rule_lr']:g}")
    return rows


def with_torchft(task: T.Task, n: int = 2, job=None) -> dict:
    """§2: the same replicas without failure, ours and torchft's (Manager.allreduce): final weights."""
    ours = replicas.run(job or ft_step.replica, n, task,
                        watch=lambda s, a, st: ft_step.lighthouse(s, a, st, n))
    with torchft_glue.lighthouse(n) as addr:
        ft = replicas.run(torchft_glue.replica, n, task, addr)
    a, b = ours["results"][0]["params"], ft["results"][0]["params"]
    equal = torch.equal(a, b) and all(torch.equal(r["params"], b) for r in ft["results"])
    print(f"{task.steps} steps on {n} replica groups: ours {ours['wall_s']:.1f} s, torchft "
          f"{ft['wall_s']:.1f} s (both mostly starting processes); weights bit-equal: {equal}")
    return {"ours": ours, "torchft": ft, "equal": equal}


def torchft_survives(task: T.Task, kill: tuple[int, int] = (1, 4), heartbeat_ms: int = 2000) -> dict:
    """§2: torchft's ``Manager.allreduce`` with replica ``kill[0]`` SIGKILLed in step ``kill[1]``, after
    its gradient and before the exchange; a spare restarts it. The survivor's stall, the discarded step,
    the heal, and the weights at the end."""
    with torchft_glue.lighthouse(2, heartbeat_timeout_ms=heartbeat_ms) as addr:
        out = replicas.run(torchft_glue.replica, 2, task, addr, kill, restart=(kill[0],), restart_after_s=0.3,
                           timeout_s=120)
    res = out["results"]
    survivor, returner = res[1 - kill[0]], res[kill[0]]
    steps = sorted(t["s"] for t in survivor["times"])
    stall, usual = steps[-1], steps[len(steps) // 2]
    equal = torch.equal(survivor["params"], returner["params"])
    healed = next((e["healed_at"] for e in returner["log"] if "healed_at" in e), None)
    discarded = [e["discarded"] for e in survivor["log"] if "discarded" in e]
    code = out["deaths"][0]["exitcode"]
    print(f"torchft: replica {kill[0]} SIGKILLed in step {kill[1]} (exit code {code}); the survivor "
          f"discarded step(s) {discarded} (should_commit() was False)\n"
          f"its longest step {stall:.2f} s against a median {usual * 1e3:.0f} ms: the new quorum without the "
          f"dead peer (heartbeat timeout {heartbeat_ms / 1e3:g} s)\n"
          f"the spare healed from the live replica at step {healed}; at the end the weights bit-equal: "
          f"{equal}")
    caught = survivor.get("torchft_errors", [])
    if caught:
        print(f"what torchft's Manager on the survivor caught and reported (report_error), not raised "
              f"({len(caught)}; the first): {caught[0]}")
    _steps_figure(res, kill, f"torchft, 2 replica groups, replica {kill[0]} SIGKILLed in step {kill[1]}: "
                             "the survivor waits for a quorum without it")
    return {"out": out, "equal": equal, "stall_s": stall, "median_s": usual, "healed_at": healed,
            "discarded": discarded}


def diloco_against_torchft(fn, task: T.Task, h: int, outer_lr: float, outer_momentum: float) -> dict:
    """§3: the notebook's DiLoCo on 2 ranks against ``torchft.local_sgd.DiLoCo`` on 2 replicas."""
    ours = warm_cluster(2).run(fn, task, h, outer_lr, outer_momentum)
    with torchft_glue.lighthouse(2) as addr:
        ft = replicas.run(torchft_glue.diloco, 2, task, addr, h, outer_lr, outer_momentum)["results"]
    equal = all(torch.equal(o["params"], f["params"]) for o, f in zip(ours, ft))
    print(f"{task.steps} inner steps, H = {h}, outer Nesterov (lr {outer_lr}, momentum {outer_momentum}): "
          f"ours and torchft's weights bit-equal on both replicas: {equal}\n"
          f"floats each replica sent: ours {ours[0]['floats_sent']:,}, torchft {ft[0]['floats_sent']:,}")
    return {"ours": ours, "torchft": ft, "equal": equal}


def streaming_against_torchft(fn, task: T.Task, h: int, fragments: int, delay: int, alpha: float,
                              outer_lr: float, outer_momentum: float) -> dict:
    """§3: the notebook's Streaming DiLoCo on 2 ranks against torchft 0.2.0's ``DiLoCo`` with
    ``fragments``, ``fragment_sync_delay`` and ``fragment_update_alpha``, on 2 replica groups."""
    ours = warm_cluster(2).run(fn, task, h, fragments, delay, alpha, outer_lr, outer_momentum)
    with torchft_glue.lighthouse(2) as addr:
        ft = replicas.run(torchft_glue.diloco, 2, task, addr, h, outer_lr, outer_momentum, fragments, delay,
                          alpha)["results"]
    equal = all(torch.equal(o["params"], f["params"]) for o, f in zip(ours, ft))
    per = ours[0]["per_sync"]
    print(f"{task.steps} inner steps, H = {h}, {fragments} fragments (one synced every {h // fragments} "
          f"steps, its all-reduce started {delay} step(s) before it is applied), alpha {alpha}: ours and "
          f"torchft's weights bit-equal on both replicas: {equal}\n"
          f"floats each replica sent: ours {ours[0]['floats_sent']:,}, torchft {ft[0]['floats_sent']:,}; "
          f"per sync {', '.join(f'{x:,}' for x in per[:fragments])} (plain DiLoCo: "
          f"{sum(per[:fragments]):,} at once, every {h} steps)")
    return {"ours": ours, "torchft": ft, "equal": equal}


def sweep(fn, task: T.Task, hs=(None, 4, 16, 64), outer_lr: float = 0.5, outer_momentum: float = 0.5) -> dict:
    """§3: held-out loss against floats sent, DDP (H = None) and DiLoCo at each H, same tokens."""
    rows = []
    for h in hs:
        out = warm_cluster(2).run(fn, task, h, outer_lr, outer_momentum)[0]
        rows.append({"label": "DDP" if h is None else f"H = {h}", "h": h, **out})
    ddp = rows[0]
    print(f"{'':>8} {'floats sent':>12} {'× fewer':>8} {'held-out loss':>14}")
    for r in rows:
        print(f"{r['label']:>8} {r['floats_sent']:>12,} {ddp['floats_sent'] / r['floats_sent']:>8.1f} "
              f"{r['held_out']:>14.4f}")
    display(plots.resilience.diloco_quality(
        rows, f"2 replicas, {task.steps} steps of {task.batch} samples each: DDP and DiLoCo at several H "
              f"(outer lr {outer_lr}, momentum {outer_momentum})"))
    return {"rows": rows}


def diloco_survives(task: T.Task, h: int, kill: tuple[int, int], outer_lr: float = 0.5,
                    outer_momentum: float = 0.5) -> dict:
    """§3: DiLoCo on 2 replica groups (:mod:`~lesson_lib.milestones.resilience.ft_diloco`), replica
    ``kill[0]`` SIGKILLed in outer step ``kill[1]`` mid-exchange and restarted from a spare; beside the
    same run without a failure. Rounds and who took part, the heal, the weights and held-out loss."""
    rounds = task.steps // h
    kill = _kill(kill, 2, rounds, "outer step")
    watch = lambda s, a, st: ft_step.lighthouse(s, a, st, 2, rounds - 1)
    out = replicas.run(ft_diloco.replica, 2, task, h, outer_lr, outer_momentum, kill, restart=(kill[0],),
                       restart_after_s=0.3, watch=watch, timeout_s=120)
    clean = replicas.run(ft_diloco.replica, 2, task, h, outer_lr, outer_momentum, watch=watch, timeout_s=120)
    res = out["results"]
    survivor, returner = res[1 - kill[0]], res[kill[0]]
    alone = [e["outer_step"] for e in survivor["log"] if "outer_step" in e and len(e["members"]) < 2]
    discarded = [e["discarded"] for e in survivor["log"] if "discarded" in e]
    healed = next(e for e in returner["log"] if "healed_at" in e)
    equal = torch.equal(survivor["params"], returner["params"])
    loss, base = survivor["held_out"], clean["results"][0]["held_out"]
    print(f"DiLoCo, H = {h}, {rounds} outer steps on 2 replica groups; replica {kill[0]} SIGKILLed in outer "
          f"step {kill[1]} (exit code {out['deaths'][0]['exitcode']})\n"
          f"the survivor discarded outer step(s) {discarded}, redid them and went on alone for "
          + (f"outer steps {alone[0]}–{alone[-1]}" if alone else "no outer step") + "; the spare"
          f" healed from replica {healed['from']} at outer step "
          f"{healed['healed_at']} and took part from then on\n"
          f"at the end both replicas' weights bit-equal: {equal}; held-out loss {loss:.4f}, against "
          f"{base:.4f} for the same run without a failure ({loss / base - 1:+.1%})")
    return {"out": out, "clean": clean, "alone": alone, "discarded": discarded, "healed": healed,
            "equal": equal, "loss": loss, "clean_loss": base}


INTERNET = [  # as reported; see the notebook's §4 for the sources
    {"label": "DiLoCo, H = 500 (Douillard et al., 2023)", "factor": 500},
    {"label": "INTELLECT-1: H = 100, int8 (2024)", "factor": 400},
    {"label": "Streaming DiLoCo: fragments, 4-bit (2025)", "factor": 100},
]


def internet_scale() -> None:
    """§4: the reported reductions in bytes, one bar each, with what a CPU run here cannot show."""
    display(plots.resilience.internet_scale(
        INTERNET, "Training across the internet: times fewer bytes than data parallelism, as reported",
        "Reported figures, not measured here. A CPU run here cannot show: the quality gap at billions of "
        "parameters and trillions of tokens, real wide-area latency and jitter, stragglers, or overlapping "
        "the outer step with compute (Streaming DiLoCo)."))


def elastic_restart(steps: int = 6, crash_at: int = 3) -> dict:
    """§2, in practice: ``torchrun --max-restarts=1 --nnodes=1:2`` with 2 workers on 127.0.0.1, worker 1
    crashing at step ``crash_at`` of the first attempt; every worker restarted, resumed from the
    checkpoint. Its weights against the uninterrupted run's, worked out: each step w −= 0.1 · mean(1, 2)."""
    from ..milestones.resilience import elastic

    out = elastic.run(steps, crash_at)
    want = -0.1 * 1.5 * steps
    final = [r for r in out["runs"] if r["attempt"] == max(x["attempt"] for x in out["runs"])]
    equal = bool(final) and all(abs(v - want) < 1e-6 for r in final for v in r["w"])
    print(f"{out['command']}\n(torchrun exited {out['returncode']} after {out['wall_s']:.1f} s)")
    for r in out["runs"]:
        print(f"attempt {r['attempt']}, rank {r['rank']}: ran steps {r['ran']}")
    print(f"the restarted workers resumed at step {final[0]['ran'][0] if final else '?'}; final weights "
          f"equal to an uninterrupted run's ({want:g} each): {equal}")
    return {**out, "equal": equal}
