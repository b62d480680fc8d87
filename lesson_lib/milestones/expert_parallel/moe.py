"""Top-1 (Switch, Fedus et al., 2021) or top-2 (GShard, Lepikhin et al., 2020) mixture of experts
with experts on different ranks (expert parallelism), and the single process it must equal (chapter 8).

Each rank routes its own tokens; an expert takes at most ``ceil(capacity_factor · k · tokens /
experts)`` assignments per group, the rest are dropped. Tokens are packed into ``[experts, capacity,
d]`` and one ``all_to_all_single`` sends each expert's slots to its rank; a second brings them back.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ...metrics import counters
from ..tensor_parallel import ops as op_names


@dataclass(kw_only=True)
class MoEConfig:
    """One MoE layer, its tokens and its experts."""

    d_model: int = 16
    """Token width."""
    ffn: int = 32
    """Each expert's hidden width."""
    experts: int = 4
    """Experts in all; expert parallelism gives each rank experts / ranks of them."""
    tokens: int = 32
    """Tokens per rank (one routing group per rank)."""
    top_k: int = 1
    """Experts per token: 1 (Switch) or 2 (GShard, its two gates renormalized to sum to 1)."""
    capacity_factor: float = 1.0
    """Slots per expert, as a multiple of an even share (tokens / experts)."""
    aux_weight: float = 0.01
    """Weight of the load-balancing loss (Fedus et al., 2021, use 0.01)."""
    seed: int = 0
    """Weights and tokens."""

    @property
    def capacity(self) -> int:
        return math.ceil(self.capacity_factor * self.top_k * self.tokens / self.experts)

    def check(self, world_size: int) -> "MoEConfig":
        """ValueError naming the parameter, before any rank starts."""
        if self.experts % world_size:
            raise ValueError(f"experts = {self.experts} does not divide among {world_size} ranks")
        if self.top_k not in (1, 2) or self.top_k > self.experts:
            raise ValueError(f"top_k must be 1 or 2 (and ≤ experts = {self.experts}), got {self.top_k!r}")
        if not self.capacity_factor > 0:
            raise ValueError(f"capacity_factor must be > 0, got {self.capacity_factor!r}")
        return self


def weights(cfg: MoEConfig) -> dict[str, torch.Tensor]:
    """Router and every expert's two matrices (the same on every rank for one seed)."""
    g = torch.Generator().manual_seed(cfg.seed)
    return {"router": torch.randn(cfg.d_model, cfg.experts, generator=g) / cfg.d_model ** 0.5,
            "w1": torch.randn(cfg.experts, cfg.d_model, cfg.ffn, generator=g) / cfg.d_model ** 0.5,
            "w2": torch.randn(cfg.experts, cfg.ffn, cfg.d_model, generator=g) / cfg.ffn ** 0.5}


def tokens(cfg: MoEConfig, world_size: int) -> torch.Tensor:
    """``[ranks, tokens, d]``: every rank's tokens."""
    g = torch.Generator().manual_seed(cfg.seed + 1)
    return torch.randn(world_size, cfg.tokens, cfg.d_model, generator=g)


def route(x: torch.Tensor, router: torch.Tensor, capacity: int, top_k: int = 1) -> dict:
    """Top-k routing of one group's tokens ``[T, d]``, as k·T assignments: each one's token, expert,
    gate, slot in that expert's buffer and whether it fits; and the load-balancing loss
    E · Σ_e f_e · P_e (f_e: share of tokens whose first choice is e, P_e: mean probability of e)."""
    probs = (x @ router).softmax(-1)
    T, experts = probs.shape
    gate, expert = probs.topk(top_k, dim=-1)  # [T, k]
    if top_k > 1:
        gate = gate / gate.sum(-1, keepdim=True)  # GShard: the two gates sum to 1
    # every token's first choice before any second choice: those take the slots first (GShard)
    expert, gate, token = expert.t().reshape(-1), gate.t().reshape(-1), torch.arange(T).repeat(top_k)
    onehot = F.one_hot(expert, experts)
    slot = (onehot.cumsum(0) * onehot).sum(-1) - 1  # how many went to the same expert before me
    aux = experts * (onehot[:T].float().mean(0) * probs.mean(0)).sum()
    return {"tokens": T, "token": token, "expert": expert, "gate": gate, "slot": slot,
            "keep": slot < capacity, "aux": aux, "load": onehot.sum(0)}


def dispatch(x: torch.Tensor, r: dict, experts: int, capacity: int) -> torch.Tensor:
    """Pack the kept assignments' tokens into ``[experts, capacity, d]`` (empty slots stay zero)."""
    buf = x.new_zeros(experts * capacity, x.shape[-1])
    keep = r["keep"]
    return buf.index_copy(0, (r["expert"] * capacity + r["slot"])[keep],
                          x[r["token"][keep]]).view(experts, capacity, -1)


def combine(out: torch.Tensor, r: dict) -> torch.Tensor:
    """Each token's kept assignments' expert outputs, times their gates, summed; dropped ones add zero."""
    flat = out.reshape(-1, out.shape[-1])
    idx = (r["expert"] * out.shape[1] + r["slot"].clamp(max=out.shape[1] - 1))
    part = flat[idx] * (r["gate"] * r["keep"])[:, None]
    return part.new_zeros(r["tokens"], part.shape[-1]).index_add(0, r["token"], part)


def experts_forward(slots: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """``[E_local, n, d]`` slots through each local expert's MLP."""
    return torch.bmm(F.gelu(torch.bmm(slots, w1)), w2)


class AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with equal splits (chunk j to rank j); the backward is the same
    exchange. Counted under ``ep_all_to_all``: (N−1)/N of the buffer."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_to_all(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_to_all(grad, ctx.group), None


def _all_to_all(x: torch.Tensor, group) -> torch.Tensor:
    n = dist.get_world_size(group)
    x = x.contiguous()
    out = torch.empty_like(x)
    t0 = time.perf_counter()
    dist.all_to_all_single(out, x, group=group)
    moved = x.numel() * x.element_size() * (n - 1) // n
    counters().record(op_names.EP_ALL_TO_ALL, moved, moved, time.perf_counter() - t0)
    return out


def moe_expert_parallel(x, router, w1, w2, cfg: MoEConfig, group=None,
                        exchange=None) -> tuple[torch.Tensor, dict]:
    """On a rank: its tokens ``[T, d]`` through the layer, with ``w1``, ``w2`` this rank's experts;
    ``exchange(buffer)`` (a learner's, chapter 8's exercise) in place of :class:`AllToAll`."""
    n, local = dist.get_world_size(group), w1.shape[0]
    exchange = exchange or (lambda t: AllToAll.apply(t, group))
    r = route(x, router, cfg.capacity, cfg.top_k)
    buf = dispatch(x, r, cfg.experts, cfg.capacity)           # [E, C, d], experts in rank order
    got = exchange(buf).view(n, local, cfg.capacity, -1)  # [source rank, my experts, C, d]
    slots = got.transpose(0, 1).reshape(local, n * cfg.capacity, -1)   # my experts' tokens, all ranks
    out = experts_forward(slots, w1, w2).view(local, n, cfg.capacity, -1).transpose(0, 1)
    back = exchange(out.reshape(n * local, cfg.capacity, -1))  # [E, C, d] for my tokens
    return combine(back, r), r


def moe_reference(xs, router, w1, w2, cfg: MoEConfig) -> tuple[torch.Tensor, list[dict]]:
    """One process, every group ``xs[g]`` routed on its own, every expert here."""
    routes = [route(x, router, cfg.capacity, cfg.top_k) for x in xs]
    bufs = torch.stack([dispatch(x, r, cfg.experts, cfg.capacity) for x, r in zip(xs, routes)])
    n = len(xs)
    slots = bufs.transpose(0, 1).reshape(cfg.experts, n * cfg.capacity, -1)
    out = experts_forward(slots, w1, w2).view(cfg.experts, n, cfg.capacity, -1).transpose(0, 1)
    return torch.stack([combine(o, r) for o, r in zip(out, routes)]), routes


def loss_of(y: torch.Tensor, x: torch.Tensor, aux: torch.Tensor, cfg: MoEConfig, total: int) -> torch.Tensor:
    """A task for the gradients: the residual stream's squared norm over all tokens, plus the
    groups' mean load-balancing loss."""
    return ((x + y) ** 2).sum() / total + cfg.aux_weight * aux / (total // x.shape[0])


def moe_job(cfg: MoEConfig) -> dict:
    """On every rank: the layer forward and backward with this rank's experts; what it computed,
    routed, dropped and sent."""
    rank, n = dist.get_rank(), dist.get_world_size()
    w = weights(cfg)
    local = slice(rank * cfg.experts // n, (rank + 1) * cfg.experts // n)
    router = w["router"].requires_grad_()
    w1, w2 = (w[k][local].clone().requires_grad_() for k in ("w1", "w2"))
    x = tokens(cfg, n)[rank].requires_grad_()  # an activation in a real model: its gradient flows back
    counters().reset()
    y, r = moe_expert_parallel(x, router, w1, w2, cfg)
    forward = counters().as_dict()
    loss_of(y, x, r["aux"], cfg, n * cfg.tokens).backward()
    router_grad = router.grad.clone()
    dist.all_reduce(router_grad)  # the router is replicated: its gradient sums every group's part
    return {"y": y.detach(), "aux": float(r["aux"].detach()), "load": r["load"].tolist(),
            "dropped": int((~r["keep"]).sum()), "x_grad": x.grad, "w1_grad": w1.grad, "w2_grad": w2.grad,
            "router_grad": router_grad, "forward": forward, "step": counters().as_dict(),
            "buffer_bytes": cfg.experts * cfg.capacity * cfg.d_model * 4}


def reference_moe(cfg: MoEConfig, world_size: int) -> dict:
    """The same layer, tokens and loss in one process."""
    w = {k: v.requires_grad_() for k, v in weights(cfg).items()}
    xs = tokens(cfg, world_size).requires_grad_()
    y, routes = moe_reference(xs, w["router"], w["w1"], w["w2"], cfg)
    total = world_size * cfg.tokens
    sum(loss_of(y[g], xs[g], routes[g]["aux"], cfg, total) for g in range(world_size)).backward()
    return {"y": y.detach(), "aux": [float(r["aux"].detach()) for r in routes], "x_grad": xs.grad,
            "dropped": [int((~r["keep"]).sum()) for r in routes],
            "load": [r["load"].tolist() for r in routes],
            "w1_grad": w["w1"].grad, "w2_grad": w["w2"].grad, "router_grad": w["router"].grad}
