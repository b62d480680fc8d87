"""Chapter 7's estimates in words: every input of a :class:`~.plan.Plan` with its source
(:func:`assumptions`), the estimates as a table and as JSON."""

from __future__ import annotations

from .gemm import GEMM_FIT, gemm_efficiency, plan_intensity, ridge
from .plan import FP8_PEAK_FLOPS, Plan
from .terms import CALIBRATED_EFFICIENCY, GIB, devices, links, server_memory


def _flops_words(plan: Plan) -> str:
    policy = plan.recompute_policy
    if plan.attention_flops:
        return ("hardware FLOPs: 6·Ψ + 12·L·h·s per token (model FLOPs, PaLM's MFU, Chowdhery et al. 2022)"
                + {"full": " + the recomputed forward (SC21 Eq. 3)", "selective": " + the recomputed "
                   "attention (Korthikanti et al. 2022)", "none": ""}[policy])
    return (f"{8 if policy == 'full' else 6}·Ψ FLOPs per token ("
            + ("6·Ψ forward and backward, Kaplan et al. 2020, + 2·Ψ recomputing the forward, "
               "Narayanan et al. 2021)" if policy == "full" else "Kaplan et al. 2020)")
            + "; attention's FLOPs not counted")


def _efficiency_words(plan: Plan, dev: dict) -> str:
    if plan.efficiency != "gemm":
        return (f"the math runs at {plan.efficiency:.1%} of peak ("
                + ("the constant calibrated once on SC21 Table 1" if plan.efficiency == CALIBRATED_EFFICIENCY
                   else "assumed") + ")")
    e_max, k = GEMM_FIT
    x, r = plan_intensity(plan), ridge(dev)
    words = (f"the math runs at {gemm_efficiency(x, r):.1%} of peak: e(x) = {e_max:g}·x/(x + {k:g}·R) at "
             f"GEMM intensity x = {x:.0f} FLOPs/byte (b·s/c × h × h/t) and R = {r:.0f} FLOPs/byte (peak / "
             "HBM bandwidth), E and k fitted once on SC21 Table 1 (A100s; on another device only R moves: "
             "assumed)")
    if plan.precision == "fp8":
        words += ("; FP8: the linear layers at the FP8 peak, attention's core and the head in bf16, the "
                  "memory-bound work unchanged, the casts' HBM bytes added")
    return words


def assumptions(plan: Plan) -> list[str]:
    """Every input of an estimate, in words, with its source (printed under the figure)."""
    dev, net, node = devices()[plan.device], links()[plan.link], links()[plan.intra_link]
    layers, hidden, heads = plan.shape()
    lines = [
        f"{plan.params:.3g} parameters, {layers} layers, hidden {hidden}, {heads} heads"
        + ("" if plan.layers else " (shape from Ψ ≈ 12·L·h² with h = 128·L, GPT-3's aspect)"),
        f"{plan.tokens:.3g} tokens, {plan.batch_tokens * plan.batch_scale:.3g} tokens per step "
        f"(sequences of {plan.seq_len}, micro-batches of {plan.micro_batch})",
        f"{plan.devices} × {dev['name']}: "
        + (f"{FP8_PEAK_FLOPS[plan.device] / 1e12:g} TFLOP/s FP8 peak (dense) for the linear layers, "
           if plan.precision == "fp8" else f"{dev['peak_flops'] / 1e12:g} TFLOP/s peak, ")
        + f"{dev['memory'] / GIB:g} GB, binary ({dev['memory'] / 1e9:.1f}e9 bytes) — {dev['source']}",
        _efficiency_words(plan, dev) + "; " + _flops_words(plan),
        f"between nodes: {net['name']}, {1e-9 / net['beta']:g} GB/s each way per device, "
        f"α = {net['alpha'] * 1e6:g} µs — {net['source']}",
        f"{plan.overlap:.0%} of the data-parallel communication hidden behind compute (assumed; chapters "
        "0 and 4 measure buckets and prefetch hiding it), never its last bucket of "
        + (f"{plan.bucket_params:.3g} gradients" if plan.bucket_params else
           "max(4e7, 1e6·d·c) gradients (Megatron-Core's default)")
        + (f"; stragglers: each device's compute varies by {plan.jitter:.0%}, the step waits "
           "σ·√(2·ln n) for the slowest" if plan.jitter else "; no stragglers (jitter 0)")
        + "; pipeline messages never hidden; "
        f"{plan.tp_overlap:.0%} of the tensor-parallel messages hidden (tp_overlap: 0 is the bound in which "
        "none is; Megatron-Core's tp_comm_overlap hides part of them, chapter 8)",
        "memory: 2 + 2 + 12 bytes per parameter (bf16 weights and gradients, fp32 Adam; "
        "Rajbhandari et al. 2020), activations s·b·h·(10 + 24/t + 5as/(ht)) per layer "
        "(Korthikanti et al. 2022)"
        + (f", with {plan.kv_heads} K/V heads of {heads}: 24/t → (20 + 4·{plan.kv_heads}/{heads})/t "
           "(grouped-query attention)" if plan.kv_heads and plan.kv_heads != heads else "")
        + {"full": "; recomputing, only each layer's input, 2·s·b·h bytes"
                                       + (" over t" if plan.sequence_parallel else ", not divided by t "
                                          "(no sequence parallelism)"),
                                       "selective": "; selective recomputation: without the 5as/(ht) of "
                                       "attention's scores (Korthikanti et al. 2022, Table 2)",
                                       "none": ""}[plan.recompute_policy]
        + ("; FlashAttention: no s×s scores stored (Dao et al. 2022)" if plan.flash_attention else "")
        + f"; micro-batches of {plan.sequences_per_microbatch:g} sequences, {plan.microbatches:g} per step",
    ]
    if plan.pipeline > 1:
        lines.append(f"pipeline: {plan.pipeline} stages, "
                     + (f"interleaved 1F1B with v = {plan.chunks} chunks per rank, bubble (P−1)/(v·M)"
                        if plan.chunks > 1 else "1F1B, bubble (P−1)/M") + " (Narayanan et al. 2021)")
    if plan.zero == 3:
        lines.append(f"ZeRO-3: parameters all-gathered twice and gradients reduce-scattered once per "
                     f"micro-batch, {plan.microbatches:g} per step (Rajbhandari et al. 2020)")
    if plan.context > 1:
        lines.append(f"context parallel over {plan.context} ({plan.context_algorithm}; Dubey et al. 2024, "
                     "Liu et al. 2023): K and V exchanged per block and micro-batch")
    if plan.experts:
        lines.append(f"mixture of {plan.experts} experts, top-{plan.top_k}, {plan.active:.3g} active of "
                     f"{plan.params:.3g} parameters, expert parallel over {plan.expert_parallel}: 4 "
                     "all-to-alls per block and micro-batch (Lepikhin et al. 2021)")
    if plan.tp_overlap:
        lines.append(f"{plan.tp_overlap:.0%} of the tensor-parallel communication hidden behind compute "
                     "(assumed; Wang et al. 2023)")
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
        sp, per = plan.sequence_parallel, 6 if plan.recompute_policy == "full" else 4
        lines.append(f"tensor parallel over {plan.tensor} devices of a node (the 'tensor' term; chapter 8, "
                     f"Shoeybi et al. 2019): per block and micro-batch {per} ring "
                     f"all-reduces of one bf16 activation (2 forward, 2 backward"
                     + (", 2 recomputing" if per == 6 else "") + ")"
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
             f"{'tp s':>6} {'step s':>7} {'days':>7} {'mach.':>6} {'TF/s':>5} {'MFU':>4} dominant"]
    for r in rows:
        ps = r["servers"] > 0
        lines.append(f"{r.get('milestone', '-'):<16} {r['plan'].tensor:>2} {r['plan'].pipeline:>3} "
                     f"{r['data_parallel']:>5} {r['servers'] if ps else '-':>5} "
                     f"{'yes' if r['fits'] else 'NO':>4} {r['memory']['total'] / 1e9:>6.1f} "
                     f"{format(r['memory']['server'] / 1e9, '.1f') if ps else '-':>6} "
                     f"{r['terms']['tensor']:>6.2g} {r['step_s']:>7.3g} {r['days']:>7.3g} "
                     f"{r['machines']:>6,} {r['tflops_per_device']:>5.0f} {r['mfu']:>4.0%} {r['dominant']}")
    return "\n".join(lines)


def to_json(rows: list[dict]) -> list[dict]:
    """The estimates as plain data (the ``estimate --json`` file)."""
    out = []
    for r in rows:
        plan = vars(r["plan"]).copy()
        out.append({**{k: v for k, v in r.items() if k != "plan"}, "plan": plan,
                    "assumptions": assumptions(r["plan"])})
    return out


