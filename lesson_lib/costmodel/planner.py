"""Chapter 7's planner: one training step of a transformer on n devices under each milestone —
memory per device, seconds per step term by term, days to train — and ``python -m lesson_lib estimate``.
Formulas are in :mod:`.terms`; the :class:`~.plan.Plan` and each milestone's changes in :mod:`.plan`.
"""

from __future__ import annotations

from dataclasses import replace

from .alphabeta import allreduce_terms
from .plan import MILESTONE_PLANS, MILESTONES, TERMS, Plan
from .tensor import tensor_parallel_terms
from .terms import (
    activation_bytes,
    bubble_formula,
    devices,
    links,
    ps_terms,
    recompute_activation_bytes,
    server_memory,
    zero_memory,
)


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
              / base.micro_batch >= 1]
        fitting = [p for p in ok if memory(replace(base, pipeline=p))["fits"]]
        chosen["pipeline"] = fitting[0] if fitting else ok[-1]
    return Plan(params, tokens, devices, **chosen).validate()


def memory(plan: Plan) -> dict:
    """Bytes per device: model states (16 bytes per parameter) split over P·t and sharded over d,
    plus activations. ``server``: bytes per parameter-server machine (12Ψ/K), not in ``total``."""
    layers, hidden, heads = plan.shape()
    psi = plan.params / (plan.pipeline * plan.tensor)
    if plan.comm == "ps":  # workers keep parameters and gradients; the servers keep Adam
        states = {"params": 2 * psi, "grads": 2 * psi, "optimizer": 0.0}
    else:
        states = {k: v for k, v in zero_memory(psi, plan.data_parallel, plan.zero, "mixed").items()
                  if k != "total"}
    t, sp = plan.tensor, plan.sequence_parallel
    full = activation_bytes(plan.seq_len, plan.micro_batch, hidden, heads, t, sp)
    # 1F1B: the first stage holds P micro-batches of its L/P layers, so L layer-micro-batches
    # (Narayanan et al., 2021); without a pipeline, one micro-batch of all L layers.
    held = layers / plan.pipeline * min(plan.pipeline, plan.microbatches)
    if plan.recompute:  # keep each layer's input (÷ t only with sequence parallelism), rebuild one
        act = recompute_activation_bytes(plan.seq_len, plan.micro_batch, hidden, held, t, sp) + full
    else:
        act = held * full
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


def step_time(plan: Plan) -> dict:
    """Seconds of one training step, term by term (chapter 7 shows this function).

    compute: FLOPs over the devices' delivered rate; bubble: the pipeline's idle (P−1)/M of it;
    bandwidth and latency: the α-β cost of the messages, of which ``overlap`` is hidden; tensor:
    the tensor-parallel collectives on the node's link, never hidden (chapter 8).
    """
    dev, net, node = devices()[plan.device], links()[plan.link], links()[plan.intra_link]
    layers, hidden, _ = plan.shape()
    d, P, t, m = plan.data_parallel, plan.pipeline, plan.tensor, plan.microbatches
    flops = (8 if plan.recompute else 6) * plan.params * plan.batch_tokens * plan.batch_scale
    compute = flops / (plan.devices * dev["peak_flops"] * plan.efficiency)  # Kaplan et al., 2020
    idle = bubble_formula(P, m)  # the idle share of the pipeline's time
    bubble = compute * idle / (1 - idle)  # = compute · (P−1)/M
    grads = 2 * plan.params / (P * t) / plan.compression  # bf16 gradients of my part of the model
    if plan.comm == "ps":  # the busiest endpoint: a server (2N messages, 2·N·S/K) or a worker (2K, 2S)
        lat, bw = ps_terms(d, plan.servers, grads)
    elif plan.zero == 3:  # per layer: parameters gathered twice, gradients scattered once: 1.5×
        lat = 3 * layers / P * (d - 1)
        bw = (d - 1) / d * (4 * plan.params / (P * t) + grads)
    else:  # a ring all-reduce, or ZeRO-1/2's reduce-scatter + all-gather (chapters 2 and 4)
        lat, bw = allreduce_terms("ring", d, grads)
    hidden_share = min(plan.overlap, compute / max(lat * net["alpha"] + bw * net["beta"], 1e-30))
    lat, bw = (1 - hidden_share) * lat * net["alpha"], (1 - hidden_share) * bw * net["beta"]
    if P > 1:  # each micro-batch sends its activation forward and its gradient back (chapter 3)
        boundary = 2 * plan.seq_len * plan.micro_batch * hidden / t  # bf16 bytes
        lat, bw = lat + 2 * m * net["alpha"], bw + 2 * m * boundary * net["beta"]
    if plan.offload:  # my gradient shard to the host, my updated bf16 parameter shard back (full duplex)
        pcie = links()[plan.host_link]
        lat, bw = lat + 2 * pcie["alpha"], bw + 2 * plan.params / (P * t * d) * pcie["beta"]
    # Megatron: 2 all-reduces of one bf16 activation per block forward, 2 backward (chapter 8)
    a, b = tensor_parallel_terms(t, 2 * plan.seq_len * plan.micro_batch * hidden, layers / P, m,
                                 plan.recompute, plan.sequence_parallel)
    tensor = a * node["alpha"] + b * node["beta"]
    return {"compute": compute, "bubble": bubble, "bandwidth": bw, "latency": lat, "tensor": tensor,
            "step": compute + bubble + bw + lat + tensor, "flops": flops}


def estimate(plan: Plan) -> dict:
    """Does it fit, seconds per step, days to train on ``tokens``, memory, the dominating term."""
    plan = plan.validate()
    terms = step_time(plan)
    # a compressed run's extra steps (chapter 6 measures them): the same tokens take more steps
    steps = plan.tokens / (plan.batch_tokens * plan.batch_scale) * (1 + plan.extra_steps)
    mem = memory(plan)
    layers, hidden, heads = plan.shape()
    servers = plan.servers if plan.comm == "ps" else 0
    return {"plan": plan, "fits": mem["fits"], "memory": mem, "terms": terms,
            "servers": servers, "machines": plan.devices + servers,
            "machine_days": (plan.devices + servers) * steps * terms["step"] / 86400,
            "step_s": terms["step"], "steps": steps, "train_s": steps * terms["step"],
            "days": steps * terms["step"] / 86400, "dominant": max(TERMS, key=terms.get),
            "tflops_per_device": terms["flops"] / terms["step"] / plan.devices / 1e12,
            "shape": {"layers": layers, "hidden": hidden, "heads": heads},
            "data_parallel": plan.data_parallel}


def milestones(params: float, tokens: float, devices: int, names=MILESTONES, **options) -> list[dict]:
    """The talk's chart: one estimate per milestone, in the talk's order, same model and cluster."""
    return [{"milestone": m, **estimate(plan_for(m, params, tokens, devices, **options))} for m in names]


def assumptions(plan: Plan) -> list[str]:
    """Every input of an estimate, in words, with its source (printed under the figure)."""
    dev, net, node = devices()[plan.device], links()[plan.link], links()[plan.intra_link]
    layers, hidden, heads = plan.shape()
    lines = [
        f"{plan.params:.3g} parameters, {layers} layers, hidden {hidden}, {heads} heads"
        + ("" if plan.layers else " (shape from Ψ ≈ 12·L·h² with h = 128·L, GPT-3's aspect)"),
        f"{plan.tokens:.3g} tokens, {plan.batch_tokens * plan.batch_scale:.3g} tokens per step "
        f"(sequences of {plan.seq_len}, micro-batches of {plan.micro_batch})",
        f"{plan.devices} × {dev['name']}: {dev['peak_flops'] / 1e12:g} TFLOP/s peak, "
        f"{dev['memory'] / 1e9:g} GB — {dev['source']}",
        f"the math runs at {plan.efficiency:.0%} of peak (assumed); "
        f"{8 if plan.recompute else 6}·Ψ FLOPs per token ("
        + ("6·Ψ forward and backward, Kaplan et al. 2020, + 2·Ψ recomputing the forward, "
           "Narayanan et al. 2021)" if plan.recompute else "Kaplan et al. 2020)"),
        f"between nodes: {net['name']}, {1e-9 / net['beta']:g} GB/s each way per device, "
        f"α = {net['alpha'] * 1e6:g} µs — {net['source']}",
        f"{plan.overlap:.0%} of the data-parallel communication hidden behind compute (assumed; chapters "
        "0 and 4 measure buckets and prefetch hiding it); pipeline and tensor-parallel messages never hidden",
        "memory: 2 + 2 + 12 bytes per parameter (bf16 weights and gradients, fp32 Adam; "
        "Rajbhandari et al. 2020), activations s·b·h·(10 + 24/t + 5as/(ht)) per layer "
        "(Korthikanti et al. 2022)" + ("; recomputing, only each layer's input, 2·s·b·h bytes"
                                       + (" over t" if plan.sequence_parallel else ", not divided by t "
                                          "(no sequence parallelism)") if plan.recompute else ""),
    ]
    if plan.comm == "ps":
        lines.append(
            f"parameter server: K = {plan.servers} server machine(s) besides the {plan.devices} workers, "
            f"one {net['name']} link each, holding Adam's 12 bytes per parameter over K: "
            f"{server_memory(plan.params, plan.servers) / 1e9:,.4g} GB per server; per step each worker "
            "sends 2K messages of S/K and each server 2N (Dean et al. 2012, Li et al. 2014)")
    if plan.offload:
        pcie = links()[plan.host_link]
        lines.append(f"offload (ZeRO-Offload on ZeRO-2, Ren et al. 2021): each device's shard of the bf16 "
                     f"gradients and of Adam's fp32 state (2 + 12 bytes per parameter) on the host, "
                     f"{plan.host_gb:g} GB of host memory per device (assumed; a DGX A100 has 2 TB for 8 "
                     "GPUs, NVIDIA DGX A100 datasheet); per step the "
                     f"gradient shard goes down and the bf16 parameter shard comes back over {pcie['name']}, "
                     f"{1e-9 / pcie['beta']:g} GB/s each way — {pcie['source']}; the host's Adam step is "
                     "not modelled (assumed hidden, as Ren et al. overlap it)")
    if plan.tensor > 1:
        sp = plan.sequence_parallel
        lines.append(f"tensor parallel over {plan.tensor} devices of a node (the 'tensor' term; chapter 8, "
                     f"Shoeybi et al. 2019): per block and micro-batch {6 if plan.recompute else 4} ring "
                     f"all-reduces of one bf16 activation (2 forward, 2 backward"
                     + (", 2 recomputing" if plan.recompute else "") + ")"
                     + ("; sequence parallel (Korthikanti et al. 2022): each a reduce-scatter + all-gather, "
                        "the same bytes, + 2 all-gathers in the backward, activations between the blocks "
                        "÷ t" if sp else "; no sequence parallelism")
                     + f"; on {node['name']}, {1e-9 / node['beta']:g} GB/s — {node['source']}")
    if plan.batch_scale != 1:
        lines.append(f"a large-batch optimizer (LAMB, You et al. 2020) trains at {plan.batch_scale:g}× "
                     "the batch in the same tokens (assumed: it holds up to a critical batch size, "
                     "McCandlish et al. 2018)")
    if plan.compression != 1:
        lines.append(f"gradients compressed {plan.compression:g}× (assumed; chapter 6 measures ratios) and "
                     + (f"{plan.extra_steps:.0%} more steps for the same tokens (assumed)" if plan.extra_steps
                        else "no extra steps: a bound (chapter 6 measured compressed runs needing more "
                             "steps; all-gathered schemes stop saving bytes long before N = 1,024)"))
    return lines


def table(rows: list[dict]) -> str:
    """The estimates as text, one line per milestone (t, P, d: tensor, pipeline, data-parallel ways;
    K: servers; GB per device and per server; tp s: the tensor-parallel term; mach.: machines)."""
    lines = [f"{'milestone':<16} {'t':>2} {'P':>3} {'d':>5} {'K':>5} {'fits':>4} {'GB':>6} {'GB/srv':>6} "
             f"{'tp s':>6} {'step s':>8} {'days':>8} {'mach.':>6} {'TFLOP/s':>7} dominant"]
    for r in rows:
        ps = r["servers"] > 0
        lines.append(f"{r.get('milestone', '-'):<16} {r['plan'].tensor:>2} {r['plan'].pipeline:>3} "
                     f"{r['data_parallel']:>5} {r['servers'] if ps else '-':>5} "
                     f"{'yes' if r['fits'] else 'NO':>4} {r['memory']['total'] / 1e9:>6.1f} "
                     f"{format(r['memory']['server'] / 1e9, '.1f') if ps else '-':>6} "
                     f"{r['terms']['tensor']:>6.2g} {r['step_s']:>8.3g} {r['days']:>8.3g} "
                     f"{r['machines']:>6,} {r['tflops_per_device']:>7.1f} {r['dominant']}")
    return "\n".join(lines)


def to_json(rows: list[dict]) -> list[dict]:
    """The estimates as plain data (the ``estimate --json`` file)."""
    out = []
    for r in rows:
        plan = vars(r["plan"]).copy()
        out.append({**{k: v for k, v in r.items() if k != "plan"}, "plan": plan,
                    "assumptions": assumptions(r["plan"])})
    return out


def cli_estimate(argv: list[str]) -> int:
    """``python -m lesson_lib estimate``: the modelled table, its assumptions, and ``--json``."""
    import argparse
    import json

    p = argparse.ArgumentParser(prog="python -m lesson_lib estimate", description=(
        "Model one training job under each milestone: fits or not, step time, days, memory per device."))
    p.add_argument("--params", type=float, required=True, help="parameters Ψ (e.g. 175e9)")
    p.add_argument("--tokens", type=float, required=True, help="tokens to train on (e.g. 300e9)")
    p.add_argument("--devices", type=int, required=True, help="number of devices n")
    p.add_argument("--device", default="a100-80gb", help=f"one of: {', '.join(devices())}")
    p.add_argument("--link", default="ib-hdr", help=f"one of: {', '.join(links())}")
    p.add_argument("--milestone", action="append", help=f"one of {', '.join(MILESTONES)} "
                   "(repeatable; default: all, in the talk's order)")
    for name, kind in (("pipeline", int), ("tensor", int), ("servers", int), ("batch-tokens", float),
                       ("efficiency", float), ("overlap", float), ("compression", float),
                       ("extra-steps", float),
                       ("layers", int), ("hidden", int)):
        p.add_argument(f"--{name}", type=kind, help=f"overrides the plan's {name.replace('-', '_')}")
    p.add_argument("--sequence-parallel", action="store_true", default=None,
                   help="sequence parallelism over the tensor-parallel ranks (Korthikanti et al. 2022)")
    p.add_argument("--json", metavar="FILE", help="write the estimates as JSON")
    args = p.parse_args(argv)
    options = {k: v for k, v in vars(args).items() if v is not None and k not in (
        "params", "tokens", "devices", "milestone", "json")}
    try:
        rows = milestones(args.params, args.tokens, args.devices, args.milestone or MILESTONES, **options)
    except ValueError as e:  # names the parameter; no traceback for a typo
        p.error(str(e))
    print(table(rows))
    print("\nassumptions (" + rows[0]["milestone"] + "):\n  " + "\n  ".join(assumptions(rows[0]["plan"])))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(to_json(rows), f, indent=1)
        print(f"wrote {args.json}")
    return 0
