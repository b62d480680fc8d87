"""One rank of ZB-H1 (chapter 3 §5; Qi et al., 2024), trained in the order of
:func:`.zero_bubble.zb_h1_actions`, equal to single-process training.

**F** keeps each ``Linear``'s output. **B** (:func:`backward_input`) asks ``torch.autograd.grad``
only for the input's and those outputs' gradients, so no weight gradient is computed and the graph
is kept. **W** (:func:`backward_weight`) later turns the output gradients into weight and bias
gradients, added in micro-batch order as 1F1B does.
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
from .loop import run_steps, stage_record
from .zero_bubble import zb_h1_actions


def forward_keeping(stage: nn.Sequential, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """F: the stage's forward, keeping each ``Linear``'s output (W starts from their gradients)."""
    outs, h = [], x
    for layer in stage:
        h = layer(h)
        if isinstance(layer, nn.Linear):
            outs.append(h)
    return h, outs


def backward_input(root, x, outs, g=None):
    """B: the gradient of ``root`` (the stage's output, or the last stage's loss) w.r.t. the stage's
    input ``x`` (None on stage 0, whose input is the data) and w.r.t. each ``Linear``'s output."""
    wanted = ([x] if x.requires_grad else []) + outs
    # only the tensors asked for: the weights' gradients are not computed; the graph is kept for W
    grads = torch.autograd.grad(root, wanted, g, retain_graph=True)
    return (grads[0] if x.requires_grad else None), list(grads[-len(outs):])


def backward_weight(linears, outs, douts) -> None:
    """W: each ``Linear``'s weight and bias gradients from its output's gradient, added into ``.grad``."""
    for layer, y, dy in zip(linears, outs, douts, strict=True):
        dw, db = torch.autograd.grad(y, (layer.weight, layer.bias), dy)  # frees this layer's graph
        layer.weight.grad.add_(dw)
        layer.bias.grad.add_(db)


def train_zero_bubble(cfg: Config, k: int, device: torch.device, emit=None) -> dict:
    """Stage ``k``'s training loop under ZB-H1: F, B and W in schedule order, every step."""
    P, M = cfg.stages, cfg.m
    bounds, costs = choose_partition(cfg, k, device)
    stage = build_stage(cfg, *bounds[k]).to(device)
    flat, grads = flat_views(stage)  # every .grad exists (a view of one buffer): W adds into it
    optimizer = torch.optim.SGD(stage.parameters(), lr=cfg.lr, momentum=0.9)
    first, last = k == 0, k == P - 1
    linears = [m for m in stage if isinstance(m, nn.Linear)]
    rows = cfg.global_batch // M
    x_all, y_all = teacher_classification(cfg.samples, cfg.d_in, cfg.classes)
    x_all, y_all = x_all.to(device), y_all.to(device)
    actions = zb_h1_actions(P, M, k)
    tl = Timeline(k, device)
    link = StageLink(k, P, M, (rows, linears[0].in_features), (rows, linears[-1].out_features), tl, ahead=2)
    rec = StepRecorder(device, emit)
    in_flight = 0

    def step_actions(mbs) -> float:
        nonlocal in_flight
        held, waiting, loss_sum = {}, {}, 0.0  # held: F done, B not; waiting: B done, W not
        for kind, i in actions:
            if kind == "F":
                x = x_all[mbs[i]] if first else link.recv_activation(i).requires_grad_()
                with tl.event("forward", i):
                    out, outs = forward_keeping(stage, x)
                    if last:
                        out = F.cross_entropy(out, y_all[mbs[i]])
                if last:
                    loss_sum += out.item()
                else:
                    link.send_activation(out.detach(), i)
                held[i] = (x, out, outs)
                in_flight = max(in_flight, len(held) + len(waiting))
            elif kind == "B":
                x, out, outs = held.pop(i)
                g = None if last else link.recv_grad(i)
                with tl.event("backward", i):
                    # the last stage: mean over micro-batches = whole-batch mean
                    dx, douts = backward_input(out / M if last else out, x, outs, g)
                if not first:
                    link.send_grad(dx, i)  # stage k−1 waits for this, not for W
                waiting[i] = (outs, douts)
                x = out = g = dx = None
            else:
                outs, douts = waiting.pop(i)
                with tl.event("weight", i):
                    backward_weight(linears, outs, douts)
                outs = douts = None
        return loss_sum

    losses = run_steps(cfg, k, link, tl, rec, optimizer, grads, emit, step_actions)
    kept = {"params": flat.detach().clone(), "grads": grads.clone()} if cfg.return_params else {}
    return stage_record(k, stage, optimizer, rec, tl, losses, bounds, costs, kept, in_flight, device=device)
