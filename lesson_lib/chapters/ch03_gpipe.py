"""Chapter 3's write-it-yourself GPipe stage, judged on real ranks (notebooks/03_pipeline_parallelism.ipynb),
and the rank-side helpers the notebook's cells use.

Nothing here imports IPython: ``stage_setup`` and ``gpipe_job`` run inside the workers.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..data import batch_indices, teacher_classification
from ..exercises import Property, Verdict, judge, observe, on_ranks, summary
from ..milestones import pipeline as pp
from ..milestones.pipeline.schedules import partition
from ..models import mlp

# For exact checks: a small model (8 layers), any number of stages up to 8.


def stage_setup(cfg: pp.Config, k: int):
    """On stage ``k``: its layers (the same cut on every rank), the data set, and the activation
    width entering the stage (what a receive buffer needs)."""
    bounds = partition(pp.param_costs(cfg), cfg.stages)
    stage = pp.build_stage(cfg, *bounds[k])
    x_all, y_all = teacher_classification(cfg.samples, cfg.d_in, cfg.classes)
    return stage, x_all, y_all, stage[0].in_features


def microbatch_indices(cfg: pp.Config, step: int) -> list[torch.Tensor]:
    """The indices of step ``step``'s M micro-batches (the whole batch, cut in order)."""
    idx = batch_indices(cfg.samples, cfg.global_batch, step, cfg.seed)
    rows = cfg.global_batch // cfg.microbatches
    return [idx[i * rows:(i + 1) * rows] for i in range(cfg.microbatches)]


# --------------------------------------------------------------------------- write it yourself


def gpipe_job(fn: Callable, cfg: pp.Config) -> dict:
    """On every rank: the learner's ``fn(stage, xs, ys)`` for one step, in float64; its gradients."""
    k, P = dist.get_rank(), dist.get_world_size()
    stage, x_all, y_all, width = stage_setup(cfg, k)
    stage = stage.double()
    mbs = microbatch_indices(cfg, 0)
    rows = len(mbs[0])
    xs = [x_all[i].double() if k == 0 else torch.empty(rows, width, dtype=torch.float64) for i in mbs]
    ys = [y_all[i] for i in mbs] if k == P - 1 else None
    with observe() as log:
        fn(stage, xs, ys)
    grads = [p.grad for p in stage.parameters()]
    calls = [{k_: c[k_] for k_ in ("op", "api", "peer", "bytes")} for c in log.as_data()["calls"]]
    if any(g is None for g in grads):
        return {"grads": None, "calls": calls}
    return {"grads": torch.cat([g.reshape(-1) for g in grads]).tolist(), "calls": calls}


def reference_grads(cfg: pp.Config) -> list[torch.Tensor]:
    """Single-process backprop of the unsplit model on the whole batch (float64), cut per stage."""
    model = mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed).double()
    x_all, y_all = teacher_classification(cfg.samples, cfg.d_in, cfg.classes)
    idx = batch_indices(cfg.samples, cfg.global_batch, 0, cfg.seed)
    F.cross_entropy(model(x_all[idx].double()), y_all[idx]).backward()
    units = pp.layer_units(model)
    return [torch.cat([p.grad.reshape(-1) for u in units[lo:hi] for m in u for p in m.parameters()])
            for lo, hi in partition(pp.param_costs(cfg), cfg.stages)]


# float64: unit roundoff 1.1e-16, and each gradient entry here sums fewer than 10^4 products, so
# pipelined and single-process backprop agree to ~1e-12 of the gradients' scale; wrong answers
# (a micro-batch missing, 1/M forgotten) are off by 1/M of it or more.
GRAD_RTOL = 1e-9


def check_gpipe(fn: Callable, stages: int = 4, timeout_s: float = 10) -> Verdict:
    """GPipe on real ranks: each micro-batch's activation goes forward once and its gradient back
    once, every stage runs all its forwards before any backward (seen in the messages it sent and
    received), and the gradients equal single-process backprop on the whole batch."""
    if not callable(fn):
        return Verdict(False, "submit your function, e.g. exercises['gpipe'].submit(my_gpipe_stage)")

    def advice(e) -> str:  # what a GPipe learner most likely did when a rank failed
        if "NoneType" in str(e) and "send" in str(e):
            return ("A stage sent None: x.grad stays None unless the activation it received was marked "
                    "with requires_grad_() before the stage ran on it, so autograd keeps its gradient.")
        return ""

    def case(m: int, p: int = stages):
        cfg = pp.Config.tiny(stages=p, microbatches=m, schedule="gpipe")
        return on_ranks(f"{p} stages, M = {m}", p, gpipe_job, fn, cfg, timeout_s=timeout_s, advice=advice,
                        then=lambda outs: {"m": m, "stages": outs, "ref": reference_grads(cfg)})

    # two world sizes: a schedule that only works for one number of stages does not pass
    return judge([case(4), case(3), case(3, 2 if stages != 2 else 3)], [
        Property("each micro-batch's activation goes forward once and its gradient back once",
                 _one_message_per_microbatch),
        Property("every stage runs all its forwards before any backward", _forwards_first),
        Property("the gradients equal single-process backprop on the whole batch", _same_gradients)])


def _flows(o: dict, k: int) -> tuple[list[int], list[int]]:
    """Positions, in stage ``k``'s calls, of its forward messages (activations from k−1 and to k+1)
    and of its backward ones (gradients from k+1 and to k−1)."""
    fwd, bwd = [], []
    for i, c in enumerate(o["calls"]):
        if (c["op"], c["peer"]) in (("recv", k - 1), ("send", k + 1)):
            fwd.append(i)
        elif (c["op"], c["peer"]) in (("recv", k + 1), ("send", k - 1)):
            bwd.append(i)
    return fwd, bwd


def _one_message_per_microbatch(o: dict) -> str | None:
    m, P = o["m"], len(o["stages"])
    for k, out in enumerate(o["stages"]):
        ahead = sum(c["op"] == "send" and c["peer"] == k + 1 for c in out["calls"])
        back = sum(c["op"] == "send" and c["peer"] == k - 1 for c in out["calls"])
        want = (m if k < P - 1 else 0, m if k > 0 else 0)
        if (ahead, back) != want:
            said = ([f"{ahead} activation(s) to stage {k + 1}"] if k < P - 1 else []) + \
                   ([f"{back} gradient(s) to stage {k - 1}"] if k > 0 else [])
            return (f"stage {k} sent {' and '.join(said)} ({summary(out['calls'])}); with M = {m} "
                    f"micro-batches it sends {m} of each")


def _forwards_first(o: dict) -> str | None:
    for k, out in enumerate(o["stages"]):
        fwd, bwd = _flows(out, k)
        if fwd and bwd and max(fwd) > min(bwd):
            return (f"stage {k} exchanged a gradient before its last activation: that is not GPipe's "
                    "schedule (all M forwards, then all M backwards)")


def _same_gradients(o: dict) -> str | None:
    """Every stage's parameter gradients against single-process backprop; the verdict says what was
    compared on each stage, and points at the latest stage that differs (gradients flow backwards:
    a wrong stage k makes every stage before it wrong too)."""
    m, n = o["m"], len(o["stages"])
    said, wrong, scaled = [], [], True
    for k, (out, want) in enumerate(zip(o["stages"], o["ref"])):
        name = f"stage {k}" + (" (last)" if k == n - 1 else "")
        if out["grads"] is None:
            return f"{name}'s parameters have no gradient: did its backward run?"
        got, tol = torch.tensor(out["grads"], dtype=torch.float64), GRAD_RTOL * want.abs().max().item()
        gap = (got - want).abs().max().item()
        scaled &= (got - m * want).abs().max().item() <= m * tol
        if gap <= tol:
            said.append(f"{name} agrees")
        else:
            wrong.append(k)
            said.append(f"{name} differs by up to {gap:.2g} (largest gradient {want.abs().max():.2g})")
    if not wrong:
        return None
    if scaled:
        return ("the gradients are M times too large: the batch's loss is the mean over all its "
                "samples, so each micro-batch's loss counts 1/M")
    k = wrong[-1]
    where = ("the last stage: its loss (a mean over the micro-batch, counted 1/M) and its backward"
             if k == n - 1 else f"stage {k}'s backward: what it received from stage {k + 1}, and what it "
             "sends back")
    return (f"compared with single-process backprop, parameter by parameter: {'; '.join(said)}. "
            f"Look first at {where} — gradients flow backwards, so a mistake there reaches every "
            "stage before it")


def my_gpipe_stage(stage, xs, ys):
    """The write-it-yourself answer (used by the tests): one GPipe step of this rank's stage."""
    k, P = dist.get_rank(), dist.get_world_size()
    M, outs = len(xs), []
    for i in range(M):  # all forwards
        if k > 0:
            dist.recv(xs[i], k - 1)
            xs[i].requires_grad_()
        out = stage(xs[i])
        if k < P - 1:
            dist.send(out.detach(), k + 1)
        outs.append(out)
    for i in range(M):  # then all backwards
        if k == P - 1:
            (F.cross_entropy(outs[i], ys[i]) / M).backward()
        else:
            g = torch.empty_like(outs[i])
            dist.recv(g, k + 1)
            outs[i].backward(g)
        if k > 0:
            dist.send(xs[i].grad, k - 1)
