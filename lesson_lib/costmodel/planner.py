"""Chapter 7's planner: one training step of a transformer on n devices under each milestone —
memory per device, seconds per step term by term, days to train — and ``python -m lesson_lib estimate``.
Formulas are in :mod:`.terms`; the :class:`~.plan.Plan` and each milestone's changes in :mod:`.plan`.
"""

from __future__ import annotations

import math
from dataclasses import replace

from .alphabeta import allreduce_terms
from .compute import (
    layer_activation_bytes,
    model_flops_per_token,
    pipeline_layers_held,
    recompute_flops_per_token,
    utilisation,
)
from .gemm import compute_terms
from .parallel import context_parallel_terms, expert_parallel_terms, moe_params_per_rank, zero3_terms
from .plan import FP8_PEAK_FLOPS, MILESTONE_PLANS, MILESTONES, TERMS, Plan
from .tensor import tensor_parallel_terms
from .terms import bubble_formula, devices, links, ps_terms, server_memory, zero_memory


def plan_for(milestone: str, params: float, tokens: float, devices: int, **options) -> Plan:
    """The Plan of one milestone (:data:`MILESTONE_PLANS`); ``options`` override it. The pipeline
    takes the fewest stages at which the model fits; the sharded parameter server K = N servers."""
    if milestone not in MILESTONE_PLANS:
        raise ValueError(f"milestone must be one of {', '.join(MILESTONES)}, got {milestone!r}")
    chosen = {**MILESTONE_PLANS[milestone], **options}
    if MILESTONE_PLANS[milestone].get("comm") == "ps":  # chapter 1's server: plain data parallelism
        chosen.update(comm="ps", zero=0, pipeline=1)
    if chosen.get("servers") == "workers":
        chosen["servers"] = devices // chosen.get("tensor", 1)
    if chosen.get("pipeline") == "auto":
        base = Plan(params, tokens, devices, **{**chosen, "pipeline": 1}).validate()
        ok = [p for p in range(1, base.shape()[0] + 1) if devices % (p * base.tensor) == 0
              and base.batch_tokens * base.batch_scale / base.seq_len / (devices // (p * base.tensor))
              / (base.micro_batch or 1) >= 1]
        fitting = [p for p in ok if memory(replace(base, pipeline=p))["fits"]]
        chosen["pipeline"] = fitting[0] if fitting else ok[-1]
    return Plan(params, tokens, devices, **chosen).validate()


def memory(plan: Plan) -> dict:
    """Bytes per device: model states (16 bytes per parameter) split over P·t (a MoE's experts also
    over e) and sharded over d, plus activations at the plan's micro-batch size and recomputation
    (:func:`~.compute.layer_activation_bytes`; context parallelism holds s/c of each sequence).
    ``server``: bytes per parameter-server machine (12Ψ/K), not in ``total``."""
    layers, hidden, heads = plan.shape()
    psi = moe_params_per_rank(plan.params, plan.active, plan.experts, plan.top_k, plan.pipeline * plan.tensor,
                              plan.expert_parallel)
    if plan.comm == "ps":  # workers keep parameters and gradients; the servers keep Adam
        states = {"params": 2 * psi, "grads": 2 * psi, "optimizer": 0.0}
    else:
        # sharded over d·c: context ranks hold the same weights (Megatron's distributed optimizer shards
        # over the data-and-context-parallel group, as the gradient ring below runs over d·c)
        ranks = plan.data_parallel * plan.context
        states = {k: v for k, v in zero_memory(psi, ranks, plan.zero, "mixed").items() if k != "total"}
    t, sp, policy = plan.tensor, plan.sequence_parallel, plan.recompute_policy
    seq, micro = plan.seq_len // plan.context, plan.sequences_per_microbatch
    kv = plan.kv_heads  # grouped-query attention: K and V at kv_heads/heads of the queries' size
    full = layer_activation_bytes(seq, micro, hidden, heads, t, sp, "none", plan.flash_attention, kv,
                                  plan.dropout)
    held = pipeline_layers_held(layers, plan.pipeline, plan.microbatches, plan.chunks)
    if policy == "full":  # keep each layer's input (÷ t only with sequence parallelism), rebuild one
        act = held * layer_activation_bytes(seq, micro, hidden, heads, t, sp, "full") + full
    else:
        act = held * layer_activation_bytes(seq, micro, hidden, heads, t, sp, policy, plan.flash_attention,
                                            kv, plan.dropout)
    # ZeRO-Offload (on ZeRO-2; Ren et al., 2021): gradient and Adam shards on the host
    host = states["grads"] + states["optimizer"] if plan.offload else 0.0
    if plan.offload:
        states["grads"] = states["optimizer"] = 0.0
    out = {**states, "activations": act}
    out["total"] = sum(out.values())
    out["device"] = devices()[plan.device]["memory"]
    out["host"], out["host_memory"] = host, plan.host_gb * 1e9
    out["fits"] = out["total"] <= out["device"] and host <= out["host_memory"]
    out["server"] = server_memory(plan.params, plan.servers) if plan.comm == "ps" else 0.0
    return out


def flops(plan: Plan) -> dict:
    """FLOPs of one step on three bases: ``flops`` k·Ψ per token (6, 8 under full recomputation;
    chapter 7's first model), ``model_flops`` PaLM's 6·N + 12·L·h·s (N: the matmuls' parameters, an
    untied input embedding left out), and ``hardware_flops``, what the
    compute term executes: model FLOPs plus recomputation, attention counted only with
    ``attention_flops`` (SC21 Eq. 3's basis; without it the k·Ψ count)."""
    layers, hidden, _ = plan.shape()
    # Ψ of the matmuls: an untied input embedding is a lookup (PaLM's MFU, Chowdhery et al. 2022, App. B)
    tokens, psi, policy = plan.batch_tokens * plan.batch_scale, plan.matmul_params, plan.recompute_policy
    attention = plan.attention_flops
    base = model_flops_per_token(psi, layers, hidden, plan.seq_len) if attention else 6 * psi
    extra = recompute_flops_per_token(policy, psi, layers, hidden, plan.seq_len, plan.vocab, attention)
    return {"flops": (8 if policy == "full" else 6) * psi * tokens,
            "model_flops": model_flops_per_token(psi, layers, hidden, plan.seq_len) * tokens,
            "hardware_flops": (base + extra) * tokens}


def bucket_params(plan: Plan) -> float:
    """Gradients per data-parallel bucket: ``plan.bucket_params``, or Megatron-Core's default,
    max(40,000,000, 1,000,000 × d·c) parameters ("larger DP sizes need larger buckets to ensure
    collectives do not become latency-bound": ``DistributedDataParallelConfig.bucket_size``,
    megatron/core/distributed/distributed_data_parallel_config.py)."""
    return plan.bucket_params or max(40e6, 1e6 * plan.data_parallel * plan.context)


def last_bucket_s(plan: Plan, grad_bytes: float, net: dict) -> float:
    """Seconds of the data-parallel collective no overlap can hide: the last bucket's, reduced after
    the backward's last gradient (and, sharded, the first gather before the forward): a ring over
    N = d·c of min(bucket, all gradients) bf16 bytes, 2(N−1)·α + 2(N−1)/N·B·β. It grows with N twice:
    the ring's 2(N−1) steps of α, and Megatron's bucket, which grows as N past 40 ranks."""
    n = plan.data_parallel * plan.context
    if n <= 1:
        return 0.0
    nbytes = min(2 * bucket_params(plan) / plan.compression, grad_bytes)
    return 2 * (n - 1) * net["alpha"] + 2 * (n - 1) / n * nbytes * net["beta"]


def hideable_share(overlap: float, compute: float, dp_s: float, last_s: float = 0.0) -> float:
    """The share of ``dp_s`` seconds of data-parallel traffic hidden: ``overlap`` of it, never more than
    the compute covers, and never the last bucket's ``last_s``."""
    if dp_s <= 0:
        return 0.0
    return max(0.0, min(overlap, compute / dp_s, 1 - last_s / dp_s))


def straggler_s(plan: Plan, compute: float) -> float:
    """The wait for the slowest of the n devices at each step's synchronisation when each device's
    compute varies independently with standard deviation ``jitter`` × compute: the expected maximum of
    n normal variables exceeds their mean by about σ·√(2·ln n) (the Gaussian extreme-value bound; why
    fan-out magnifies tails: Dean & Barroso, The Tail at Scale, CACM 2013). ``jitter`` = 0 (the default)
    is a machine with no variation."""
    return plan.jitter * compute * (2 * math.log(plan.devices)) ** 0.5 if plan.devices > 1 else 0.0


def _hide(share: float, seconds: float, room: float) -> float:
    """What ``share`` of ``seconds`` of communication compute can hide: never more than ``room``."""
    return min(share * seconds, max(room, 0.0))


def step_time(plan: Plan) -> dict:
    """Seconds of one training step, term by term (chapter 7 shows this function).

    compute: hardware FLOPs over the devices' delivered rate, the GEMMs at E of peak plus the
    memory-bound work around them (``efficiency`` e(x) from the GEMM shapes, :mod:`.gemm`; under FP8
    the linear layers at the FP8 peak and the casts' bytes); bubble: the pipeline's idle
    (P−1)/(v·M) of it; bandwidth and latency: the α-β cost of the data-parallel (and pipeline, offload)
    messages, of which ``overlap`` is hidden; tensor, context, expert: chapter 8's collectives,
    ``tp_overlap`` of the tensor-parallel ones hidden (the band between 0 and 1 is the model's
    uncertainty; Megatron overlaps them with ``--tp-comm-overlap``, Wang et al., 2023).
    """
    dev, net, node = devices()[plan.device], links()[plan.link], links()[plan.intra_link]
    layers, hidden, heads = plan.shape()
    d, P, t, m, v, c = (plan.data_parallel, plan.pipeline, plan.tensor, plan.microbatches, plan.chunks,
                        plan.context)
    f = flops(plan)
    # the GEMMs at E of peak (FP8's linear layers at the FP8 peak) plus memory-bound work: e(x) (gemm.py)
    split = compute_terms(plan, dev, f["hardware_flops"], dev["fp8_flops"])
    compute = split["compute"]
    idle = bubble_formula(P, m, v)  # the idle share of the pipeline's time
    bubble = compute * idle / (1 - idle)  # = compute · (P−1)/(v·M)
    psi = moe_params_per_rank(plan.params, plan.active, plan.experts, plan.top_k, P * t, plan.expert_parallel)
    grads = 2 * psi / plan.compression  # bf16 gradients of my part of the model
    full = plan.recompute_policy == "full"
    if plan.comm == "ps":  # the busiest endpoint: a server (2N messages, 2·N·S/K) or a worker (2K, 2S)
        lat, bw = ps_terms(d, plan.servers, grads)
    elif plan.zero == 3:  # per micro-batch: parameters gathered twice, gradients scattered once
        lat, bw = zero3_terms(d, 2 * psi, grads, layers / P, m)
    else:  # a ring all-reduce over d·c (context ranks hold the same weights), or ZeRO-1/2's pair
        lat, bw = allreduce_terms("ring", d * c, grads)
    dp_s = lat * net["alpha"] + bw * net["beta"]
    last = last_bucket_s(plan, grads, net) if plan.comm != "ps" else 0.0
    hidden_share = hideable_share(plan.overlap, compute, dp_s, last)
    lat, bw = (1 - hidden_share) * lat * net["alpha"], (1 - hidden_share) * bw * net["beta"]
    seq = plan.seq_len // c
    micro = plan.sequences_per_microbatch
    if P > 1:  # each micro-batch crosses v·P − 1 boundaries each way; a rank sends v of them (chapter 3)
        boundary = 2 * seq * micro * hidden / t  # bf16 bytes, scattered over t (Megatron)
        lat, bw = lat + 2 * v * m * net["alpha"], bw + 2 * v * m * boundary * net["beta"]
    if plan.offload:  # my gradient shard to the host, my updated bf16 parameter shard back (full duplex)
        pcie = links()[plan.host_link]
        lat, bw = lat + 2 * pcie["alpha"], bw + 2 * plan.params / (P * t * d) * pcie["beta"]
    # Megatron: 2 all-reduces of one bf16 activation per block forward, 2 backward (chapter 8)
    a, b = tensor_parallel_terms(t, 2 * seq * micro * hidden, layers / P, m, full, plan.sequence_parallel)
    tensor = a * node["alpha"] + b * node["beta"]
    tensor -= _hide(plan.tp_overlap, tensor, compute - hidden_share * dp_s)
    kv = 2 * 2 * plan.seq_len * micro * hidden * (plan.kv_heads or heads) / heads / t  # bf16 K and V
    a, b = context_parallel_terms(c, kv, layers / P, m, plan.context_algorithm, full)
    cp_link = node if t * c <= dev["domain"] else net  # one NVLink domain: 8 in a DGX, 72 in an NVL72
    context = a * cp_link["alpha"] + b * cp_link["beta"]
    a, b = expert_parallel_terms(plan.expert_parallel if plan.experts else 1, 2 * seq * micro * hidden,
                                 plan.top_k, layers / P, m, full)
    ep_link = node if t * plan.expert_parallel <= dev["domain"] else net
    expert = a * ep_link["alpha"] + b * ep_link["beta"]
    out = {"compute": compute, "bubble": bubble, "bandwidth": bw, "latency": lat, "tensor": tensor,
           "context": context, "expert": expert, "sync": straggler_s(plan, compute), **f,
           "efficiency": split["efficiency"],
           **{f"{k}_s": split[k] for k in ("gemm", "memory_bound", "casts")}}
    out["step"] = sum(out[k] for k in TERMS)
    return out


def estimate(plan: Plan) -> dict:
    """Does it fit, seconds per step, days to train on ``tokens``, memory, the dominating term, and
    the FLOP rates: ``tflops_per_device`` (hardware FLOPs), ``mfu`` (PaLM's model FLOPs
    utilisation) and ``hfu`` (hardware FLOPs utilisation), both against the bf16 (or fp8) peak.
    ``tp_band``: the step with tensor-parallel traffic all exposed and all hidden."""
    plan = plan.validate()
    terms = step_time(plan)
    # a compressed run's extra steps (chapter 6 measures them): the same tokens take more steps
    steps = plan.tokens / (plan.batch_tokens * plan.batch_scale) * (1 + plan.extra_steps)
    mem = memory(plan)
    layers, hidden, heads = plan.shape()
    servers = plan.servers if plan.comm == "ps" else 0
    peak = FP8_PEAK_FLOPS[plan.device] if plan.precision == "fp8" else devices()[plan.device]["peak_flops"]
    band = {k: step_time(replace(plan, tp_overlap=k))["step"] for k in (0.0, 1.0)} if plan.tensor > 1 \
        else {0.0: terms["step"], 1.0: terms["step"]}
    return {"plan": plan, "fits": mem["fits"], "memory": mem, "terms": terms,
            "servers": servers, "machines": plan.devices + servers,
            "machine_days": (plan.devices + servers) * steps * terms["step"] / 86400,
            "step_s": terms["step"], "steps": steps, "train_s": steps * terms["step"],
            "days": steps * terms["step"] / 86400, "dominant": max(TERMS, key=terms.get),
            "tflops_per_device": terms["hardware_flops"] / terms["step"] / plan.devices / 1e12,
            "mfu": utilisation(terms["model_flops"], terms["step"], plan.devices, peak),
            "hfu": utilisation(terms["hardware_flops"], terms["step"], plan.devices, peak),
            "tp_band": {"exposed": band[0.0], "hidden": band[1.0]},
            "shape": {"layers": layers, "hidden": hidden, "heads": heads},
            "data_parallel": plan.data_parallel}


def milestones(params: float, tokens: float, devices: int, names=MILESTONES, **options) -> list[dict]:
    """The talk's chart: one estimate per milestone, in the talk's order, same model and cluster."""
    return [{"milestone": m, **estimate(plan_for(m, params, tokens, devices, **options))} for m in names]


