"""The model cut into pipeline stages (chapter 3): its layers, their costs (parameters or measured
time) and the balanced partition every stage agrees on — for one stage per rank, or for interleaved
1F1B's v·P virtual stages.
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from ... import comm
from ...metrics import sync
from ...models import mlp
from .config import Config
from .schedules import partition


def layer_units(model: nn.Sequential) -> list[list[nn.Module]]:
    """The model's layers as the pipeline counts them: each ``Linear`` with the ``ReLU`` after it."""
    units: list[list[nn.Module]] = []
    for m in model:
        if isinstance(m, nn.Linear):
            units.append([m])
        else:
            units[-1].append(m)
    return units


def model_layers(cfg: Config) -> list[list[nn.Module]]:
    """Every rank builds the whole model from the seed, so all agree on the initial weights."""
    return layer_units(mlp(cfg.d_in, cfg.hidden, cfg.depth, cfg.classes, cfg.seed))


def build_stage(cfg: Config, lo: int, hi: int) -> nn.Sequential:
    """Layers [lo, hi) of the model; the others are freed on return."""
    return nn.Sequential(*[m for u in model_layers(cfg)[lo:hi] for m in u])


def param_costs(cfg: Config) -> list[float]:
    return [float(sum(p.numel() for m in u for p in m.parameters())) for u in model_layers(cfg)]


def time_costs(cfg: Config, device: torch.device, repeats: int = 5) -> list[float]:
    """Median seconds of one forward+backward of each layer on one micro-batch: busy (CPU) time,
    or synchronized wall time on a GPU."""
    clock = time.perf_counter if device.type == "cuda" else time.thread_time
    x = torch.randn(cfg.global_batch // cfg.m, cfg.d_in, generator=torch.Generator().manual_seed(0))
    x = x.to(device)
    costs = []
    for u in model_layers(cfg):
        layer, samples = nn.Sequential(*u).to(device), []
        for _ in range(repeats + 1):  # the first run pays one-off allocation costs
            xin = x.detach().requires_grad_(bool(costs))  # the first layer needs no input gradient
            sync(device)
            t0 = clock()
            out = layer(xin)
            out.sum().backward()
            sync(device)
            samples.append(clock() - t0)
        costs.append(statistics.median(samples[1:]))
        x = out.detach()
    return costs


def choose_partition(cfg: Config, rank: int, device: torch.device, pieces: int | None = None
                     ) -> tuple[list, list[float]]:
    """Layer bounds per stage (or per one of ``pieces``: interleaved 1F1B's virtual stages) and the
    per-layer costs they balance. By time: rank 0 measures and sends its costs to every stage, so
    that all stages cut the model the same way."""
    pieces = pieces or cfg.stages
    if cfg.balance == "params":
        return partition(param_costs(cfg), pieces), param_costs(cfg)
    costs = torch.tensor(time_costs(cfg, device) if rank == 0 else [0.0] * cfg.layers, dtype=torch.float64,
                         device=device)
    for r in range(1, cfg.stages):
        if rank == 0:
            comm.send(costs, r, op="balance")
    if rank > 0:
        comm.recv(costs, 0, op="balance")
    return partition(costs.tolist(), pieces), costs.tolist()
