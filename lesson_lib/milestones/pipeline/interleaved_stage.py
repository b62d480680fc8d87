"""One rank of interleaved 1F1B (chapter 3 §5): v model chunks per rank, trained in the order of
:func:`.interleaved.interleaved_actions`, equal to single-process training.

Rank r holds virtual stages r, r + P, …; the ranks form a ring (:class:`.comm.StageLink` with
``wrap``). Every rank runs (chunk, micro-batch) in the same order, so each link needs only a count
of messages per step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...data import teacher_classification
from ...metrics import StepRecorder
from ...models import flat_views
from .comm import StageLink, Timeline
from .config import Config
from .cut import build_stage, choose_partition
from .interleaved import interleaved_actions, virtual_stage
from .loop import run_steps, stage_record


def train_interleaved(cfg: Config, k: int, device: torch.device, emit=None) -> dict:
    """Rank ``k``'s training loop under interleaved 1F1B with ``cfg.chunks`` chunks."""
    P, M, v = cfg.stages, cfg.m, cfg.chunks
    last_stage = v * P - 1
    bounds, costs = choose_partition(cfg, k, device, pieces=v * P)
    chunks = [build_stage(cfg, *bounds[virtual_stage(P, k, c)]).to(device) for c in range(v)]
    whole = nn.ModuleList(chunks)  # the rank's parameters, chunk 0 first
    _, grads = flat_views(whole)  # the gradients in one buffer, zeroed at once
    optimizer = torch.optim.SGD(whole.parameters(), lr=cfg.lr, momentum=0.9)
    rows, width = cfg.global_batch // M, cfg.hidden
    x_all, y_all = teacher_classification(cfg.samples, cfg.d_in, cfg.classes)
    x_all, y_all = x_all.to(device), y_all.to(device)
    actions = interleaved_actions(P, M, v, k)
    stage_of = {c: virtual_stage(P, k, c) for c in range(v)}
    counts = {"recv_activation": sum(1 for x, c, _ in actions if x == "F" and stage_of[c] > 0),
              "recv_grad": sum(1 for x, c, _ in actions if x == "B" and stage_of[c] < last_stage)}
    tl = Timeline(k, device)
    # every interior boundary carries (rows, hidden) both ways: one buffer shape for every chunk
    link = StageLink(k, P, M, (rows, width), (rows, width), tl, wrap=counts)
    rec = StepRecorder(device, emit)
    in_flight = 0

    def step_actions(mbs) -> float:
        nonlocal in_flight
        held, loss_sum, seq = {}, 0.0, {"F": 0, "B": 0}  # seq: the link's message order
        for kind, c, i in actions:
            s = stage_of[c]
            if kind == "F":
                if s == 0:
                    x = x_all[mbs[i]]
                else:
                    x = link.recv_activation(seq["F"]).requires_grad_()
                    seq["F"] += 1
                with tl.event("forward", i, chunk=c):
                    out = chunks[c](x)
                    if s == last_stage:
                        out = F.cross_entropy(out, y_all[mbs[i]])
                if s == last_stage:
                    loss_sum += out.item()
                else:
                    link.send_activation(out.detach(), i)
                held[c, i] = (x, out)
                in_flight = max(in_flight, len(held))
            else:
                x, out = held.pop((c, i))
                g = None
                if s < last_stage:
                    g = link.recv_grad(seq["B"])
                    seq["B"] += 1
                with tl.event("backward", i, chunk=c):
                    if g is None:
                        (out / M).backward()  # mean over micro-batches = whole-batch mean
                    else:
                        out.backward(g)
                if s > 0:
                    link.send_grad(x.grad, i)
                x = out = g = None
        return loss_sum

    losses = run_steps(cfg, k, link, tl, rec, optimizer, grads, emit, step_actions)
    kept = {} if not cfg.return_params else {  # per chunk: pp.state joins them in layer order
        "chunk_params": [torch.cat([p.detach().reshape(-1) for p in m.parameters()]) for m in chunks],
        "chunk_grads": [torch.cat([p.grad.reshape(-1) for p in m.parameters()]) for m in chunks]}
    return stage_record(k, whole, optimizer, rec, tl, losses, bounds, costs, kept, in_flight, device=device)

