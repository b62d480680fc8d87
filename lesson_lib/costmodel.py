"""Formulas used to reason beyond this laptop: the memory bill of training, and (from chapter 2 on)
the alpha-beta model of communication. Formulas live here; measurements live in ``metrics``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .data import read_csv

# Bytes per parameter for each part of the model state (Rajbhandari et al., ZeRO, 2020, §3.1):
# mixed-precision Adam keeps fp16 params and grads (2 + 2 bytes) plus an fp32 master copy,
# momentum and variance (4 + 4 + 4 bytes): K = 12 bytes of optimizer state, 16 bytes in all.
PRECISIONS = {
    "fp32 Adam": {"params": 4, "grads": 4, "optimizer": 8},
    "mixed-precision Adam": {"params": 2, "grads": 2, "optimizer": 12},
    "fp32 SGD + momentum": {"params": 4, "grads": 4, "optimizer": 4},
}


def memory_bill(params: float, precision: str = "mixed-precision Adam") -> dict:
    """Bytes of model state (params, grads, optimizer) to train ``params`` parameters on one device.

    Activations come on top and depend on batch and sequence length, so they are not included.
    Used by chapter 0 (the memory calculator) and chapter 4 (ZeRO divides these by N).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if not params >= 0:
        raise ValueError(f"params must be a non-negative number, got {params!r}")
    per = PRECISIONS[precision]
    bill = {k: v * params for k, v in per.items()}
    bill["total"] = sum(bill.values())
    bill["bytes_per_param"] = sum(per.values())
    return bill


def accelerators() -> list[dict]:
    """Devices from data/accelerators.csv (checksum-verified) with their memory in bytes."""
    return [{"device": r["device"], "bytes": float(r["memory_gb"]) * 1e9, "source": r["source"]}
            for r in read_csv("accelerators.csv")]


def fits(total_bytes: float) -> dict[str, bool]:
    """Which devices hold ``total_bytes`` of model state (ignoring activations and fragmentation)."""
    return {d["device"]: total_bytes <= d["bytes"] for d in accelerators()}


def devices_needed(total_bytes: float, device_bytes: float) -> int:
    """How many devices of ``device_bytes`` the state needs if it could be split perfectly."""
    return max(1, -(-int(total_bytes) // int(device_bytes)))


# --------------------------------------------------------------------------- alpha-beta (chapter 2)
# A message of m bytes costs α + m·β: a fixed latency plus the bytes over the link's bandwidth
# (Hockney, 1994). An all-reduce is a sequence of such messages (Thakur, Rabenseifner & Gropp, 2005).


def allreduce_terms(algorithm: str, world_size: int, nbytes: float) -> tuple[float, float]:
    """(a, b) such that an all-reduce of ``nbytes`` on ``world_size`` ranks takes a·α + b·β.

    ring (and the library's): 2(N−1) steps of S/N → 2(N−1)α + 2(N−1)/N·S·β;
    halving-doubling: 2·log₂N steps, same bytes; naive: the root's link carries N−1 messages in
    and N−1 out, one after another → 2(N−1)α + 2(N−1)·S·β.
    """
    n = world_size
    if n < 1:
        raise ValueError(f"world_size must be at least 1, got {n}")
    if nbytes < 0:
        raise ValueError(f"nbytes must be non-negative, got {nbytes}")
    if algorithm in ("ring", "library"):
        return 2.0 * (n - 1), 2.0 * (n - 1) / n * nbytes
    if algorithm == "halving-doubling":
        return 2.0 * (n.bit_length() - 1), 2.0 * (n - 1) / n * nbytes
    if algorithm == "naive":
        return 2.0 * (n - 1), 2.0 * (n - 1) * nbytes
    raise ValueError(f"algorithm must be ring, library, halving-doubling or naive, got {algorithm!r}")


def allreduce_time(algorithm: str, world_size: int, nbytes: float, alpha: float, beta: float) -> float:
    a, b = allreduce_terms(algorithm, world_size, nbytes)
    return a * alpha + b * beta


def fit_alpha_beta(rows: list[dict], algorithm: str = "ring") -> dict:
    """Least-squares α (s) and β (s/byte) from measured ``rows`` ({world_size, size_bytes, time_s}).

    Errors are weighed relative to each time, so 4 KB messages (latency) count as much as 64 MB
    ones (bandwidth); α and β are kept non-negative. Returns α, β, the bandwidth 1/β and the
    root-mean-square relative error of the fit.
    """
    import numpy as np

    rows = [r for r in rows if r["time_s"] > 0 and r["world_size"] > 1]
    if len(rows) < 2:
        raise ValueError("need at least two measurements on two or more ranks to fit α and β")
    a = np.array([allreduce_terms(algorithm, r["world_size"], r["size_bytes"]) for r in rows])
    t = np.array([r["time_s"] for r in rows])
    w = a / t[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(w, np.ones(len(t)), rcond=None)
    one = lambda col: float(np.linalg.lstsq(w[:, col:col + 1], np.ones(len(t)), rcond=None)[0][0])
    if alpha < 0:  # the data say "no latency": keep α at zero and fit β alone
        alpha, beta = 0.0, one(1)
    elif beta <= 0:
        alpha, beta = one(0), 1e-15
    model = a @ np.array([alpha, beta])
    return {"alpha_s": float(alpha), "beta_s_per_byte": float(beta), "bandwidth_GBps": 1e-9 / beta,
            "rms_rel_error": float(np.sqrt(np.mean((model / t - 1) ** 2))), "points": len(rows),
            "algorithm": algorithm}


def latency_crossover_bytes(world_size: int, alpha: float, beta: float) -> float:
    """Message size S* at which a ring all-reduce's latency term equals its bandwidth term:
    2(N−1)α = 2(N−1)/N·S*·β, so S* = N·α/β. Below S*, latency dominates."""
    if beta <= 0:
        raise ValueError(f"beta must be positive, got {beta}")
    return world_size * alpha / beta


# Bytes per parameter of model states by ZeRO stage (Rajbhandari et al., 2020, §5, Figure 1):
# params / grads / optimizer, each either replicated (×1) or sharded over N ranks (×1/N).
_ZERO_SHARDED = {0: (), 1: ("optimizer",), 2: ("optimizer", "grads"), 3: ("optimizer", "grads", "params")}
_ZERO_BYTES = {"fp32": {"params": 4, "grads": 4, "optimizer": 8},     # Adam: momentum + variance
               "mixed": {"params": 2, "grads": 2, "optimizer": 12}}   # + fp32 master: K = 12


def zero_memory(params: float, world_size: int, stage: int, precision: str = "mixed") -> dict:
    """Model-state bytes per rank under ZeRO ``stage`` (the paper's formulas; chapter 4).

    fp32 Adam: 16Ψ, 8Ψ+8Ψ/N, 4Ψ+12Ψ/N, 16Ψ/N. Mixed precision (K=12): 16Ψ, 4Ψ+12Ψ/N,
    2Ψ+14Ψ/N, 16Ψ/N. Activations and transient buffers come on top.
    """
    if stage not in _ZERO_SHARDED:
        raise ValueError(f"stage must be 0, 1, 2 or 3, got {stage!r}")
    if precision not in _ZERO_BYTES:
        raise ValueError(f"precision must be 'fp32' or 'mixed', got {precision!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if not params >= 0:
        raise ValueError(f"params must be a non-negative number, got {params!r}")
    out = {k: b * params / (world_size if k in _ZERO_SHARDED[stage] else 1)
           for k, b in _ZERO_BYTES[precision].items()}
    out["total"] = sum(out.values())
    return out


def zero_traffic(params: float, world_size: int, stage: int, element_size: int = 4) -> float:
    """Bytes each rank sends per step with ring collectives: 2(N−1)/N·Ψ elements for stages
    0–2 (reduce-scatter + all-gather), 3(N−1)/N·Ψ for stage 3 (one more all-gather)."""
    factor = 3 if stage == 3 else 2
    return factor * (world_size - 1) / world_size * params * element_size


# =========================================================================== one training step at scale
# Chapter 7: the formulas above, combined into one step of a transformer on n devices, per milestone.
# Inputs come from data/devices.csv and data/links.csv (a source per row); every other number is an
# assumption of the Plan, printed by ``assumptions()``.

MILESTONES = ("parameter-server", "ring", "pipeline", "zero-1", "zero-2", "zero-3", "lamb", "compression")
# What each milestone of the talk changes, on top of plain data parallelism with a ring.
MILESTONE_PLANS = {
    "parameter-server": {"comm": "ps"},
    "ring": {},
    "pipeline": {"pipeline": "auto"},
    "zero-1": {"zero": 1}, "zero-2": {"zero": 2}, "zero-3": {"zero": 3},
    "lamb": {"zero": 3, "batch_scale": 4},
    "compression": {"zero": 3, "batch_scale": 4, "compression": 4},
}
TERMS = ("compute", "bubble", "bandwidth", "latency")


def devices() -> dict[str, dict]:
    """Accelerators by id (data/devices.csv): peak dense bf16 FLOP/s, memory bytes, source."""
    return {r["id"]: {"name": r["name"], "peak_flops": float(r["peak_tflops"]) * 1e12,
                      "memory": float(r["memory_gb"]) * 1e9, "source": r["source"]}
            for r in read_csv("devices.csv")}


def links() -> dict[str, dict]:
    """Interconnects by id (data/links.csv): β = 1/bandwidth (s/byte) each way, α (s), source."""
    return {r["id"]: {"name": r["name"], "beta": 1 / (float(r["bandwidth_gbps"]) * 1e9),
                      "alpha": float(r["latency_us"]) * 1e-6, "source": r["source"]}
            for r in read_csv("links.csv")}


def published() -> dict[str, dict]:
    """End-to-end figures a paper reports (data/published.csv), to check the model against."""
    return {r["case"]: {k: (v if k in ("case", "device", "source") or v == "" else float(v))
                        for k, v in r.items()} for r in read_csv("published.csv")}


def days_from_throughput(tokens: float, params: float, devices: int, flops_per_device: float,
                         flops_per_token_per_param: float = 8.0) -> float:
    """End-to-end days ≈ 8·T·Ψ / (n·X) (Narayanan et al., SC21, §5.1; 8 = 6 plus recomputation)."""
    return flops_per_token_per_param * tokens * params / (devices * flops_per_device) / 86400


def bubble_fraction(stages: int, microbatches: int) -> float:
    """Idle share of a pipeline step with equal stages: (P−1)/(M+P−1) (GPipe and 1F1B; chapter 3)."""
    return (stages - 1) / (microbatches + stages - 1)


def ring_time(nbytes: float, n: int, alpha: float, beta: float) -> float:
    """A ring all-reduce of ``nbytes`` on n ranks: 2(N−1)α + 2(N−1)/N·S·β (chapter 2)."""
    return allreduce_time("ring", n, nbytes, alpha, beta)


def ps_time(nbytes: float, workers: int, servers: int, alpha: float, beta: float) -> float:
    """The busiest server's link per synchronous step: 2·N·S/K bytes in and out (chapter 1)."""
    return 2 * workers / servers * (alpha + nbytes * beta)


def activation_bytes(seq: int, micro: int, hidden: int, heads: int, tensor: int = 1) -> float:
    """One transformer layer's saved activations for one micro-batch, 16-bit, no sequence
    parallelism: s·b·h·(10 + 24/t + 5·a·s/(h·t)) bytes (Korthikanti et al., 2022, Eq. 2)."""
    return seq * micro * hidden * (10 + 24 / tensor + 5 * heads * seq / (hidden * tensor))


@dataclass(frozen=True)
class Plan:
    """One training job: a model, a cluster and a milestone's choices. Every field is an input the
    printed assumptions name; ``validate`` names the parameter when one is wrong (chapter 7)."""

    params: float                      # Ψ, parameters
    tokens: float                      # T, tokens to train on
    devices: int                       # n
    device: str = "a100-80gb"          # a row of data/devices.csv
    link: str = "ib-hdr"               # between nodes, per device (data/links.csv)
    intra_link: str = "nvlink3"        # within a node: tensor parallelism only
    comm: str = "ring"                 # ring | ps (data-parallel gradient exchange)
    servers: int = 1                   # K parameter-server shards (ps only)
    pipeline: int = 1                  # P stages (1F1B)
    tensor: int = 1                    # t, tensor-parallel ranks (Shoeybi et al., 2019)
    zero: int = 0                      # ZeRO stage over the data-parallel ranks
    batch_tokens: float = 1536 * 2048  # tokens per step (Narayanan et al.'s GPT-3 batch)
    batch_scale: float = 1.0           # a large-batch optimizer's multiple of that batch (LAMB)
    compression: float = 1.0           # gradient bytes divided by this (chapter 6)
    seq_len: int = 2048
    micro_batch: int = 1               # sequences per micro-batch
    layers: int = 0                    # 0: from Ψ ≈ 12·L·h² with h = 128·L (GPT-3's shape)
    hidden: int = 0
    heads: int = 0                     # 0: h / 128
    efficiency: float = 0.5            # share of peak FLOP/s the math reaches (assumed)
    recompute: bool = True             # 8Ψ FLOPs per token instead of 6Ψ, less activation memory
    overlap: float = 0.0               # share of data-parallel communication hidden behind compute

    def shape(self) -> tuple[int, int, int]:
        """(layers, hidden, heads): given, or GPT-3's aspect (h = 128·L) from Ψ = 12·L·h²."""
        layers = self.layers or max(1, round((self.params / (12 * 128**2)) ** (1 / 3)))
        if self.hidden:
            hidden = self.hidden
        elif self.layers:
            hidden = max(1, round((self.params / (12 * layers)) ** 0.5))
        else:
            hidden = 128 * layers
        return layers, hidden, self.heads or max(1, hidden // 128)

    @property
    def data_parallel(self) -> int:
        return self.devices // (self.pipeline * self.tensor)

    @property
    def microbatches(self) -> float:
        """Micro-batches each pipeline runs per step: the step's sequences over d replicas and b."""
        return self.batch_tokens * self.batch_scale / self.seq_len / (self.data_parallel * self.micro_batch)

    def validate(self) -> "Plan":
        for name in ("params", "tokens", "batch_tokens", "batch_scale", "compression", "efficiency"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be a positive number, got {v!r}")
        for name in ("devices", "servers", "pipeline", "tensor", "seq_len", "micro_batch"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        for name in ("layers", "hidden", "heads"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be a positive int (0: derived from params), got {v!r}")
        if self.device not in devices():
            raise ValueError(f"device must be one of {', '.join(devices())}, got {self.device!r}")
        for name in ("link", "intra_link"):
            if getattr(self, name) not in links():
                raise ValueError(f"{name} must be one of {', '.join(links())}, got {getattr(self, name)!r}")
        if self.comm not in ("ring", "ps"):
            raise ValueError(f"comm must be 'ring' or 'ps', got {self.comm!r}")
        if self.zero not in (0, 1, 2, 3) or isinstance(self.zero, bool):
            raise ValueError(f"zero must be 0, 1, 2 or 3, got {self.zero!r}")
        if self.comm == "ps" and (self.zero or self.pipeline > 1):
            raise ValueError("comm='ps' models chapter 1's parameter server: use it with zero=0, pipeline=1")
        if not 0 <= self.overlap <= 1:
            raise ValueError(f"overlap must be between 0 and 1, got {self.overlap!r}")
        if self.devices % (self.pipeline * self.tensor):
            raise ValueError(f"devices={self.devices} must be a multiple of pipeline × tensor = "
                             f"{self.pipeline * self.tensor}")
        layers = self.shape()[0]
        if self.pipeline > layers:
            raise ValueError(f"pipeline={self.pipeline} stages is more than the model's {layers} layers")
        if self.microbatches < 1:
            raise ValueError(f"batch_tokens={self.batch_tokens:g} gives each of the {self.data_parallel} "
                             f"replicas less than one micro-batch of {self.micro_batch} × {self.seq_len}")
        return self


def plan_for(milestone: str, params: float, tokens: float, devices: int, **options) -> Plan:
    """The Plan of one milestone of the talk (:data:`MILESTONE_PLANS`); ``options`` override it.

    The pipeline milestone takes the fewest stages (a divisor of n, at most the layers) at which
    the model fits, or the most stages allowed when it fits at none.
    """
    if milestone not in MILESTONE_PLANS:
        raise ValueError(f"milestone must be one of {', '.join(MILESTONES)}, got {milestone!r}")
    chosen = {**MILESTONE_PLANS[milestone], **options}
    if milestone == "parameter-server":  # chapter 1's server is plain data parallelism
        chosen.update(comm="ps", zero=0, pipeline=1)
    if chosen.get("pipeline") == "auto":
        base = Plan(params, tokens, devices, **{**chosen, "pipeline": 1}).validate()
        ok = [p for p in range(1, base.shape()[0] + 1) if devices % (p * base.tensor) == 0
              and base.batch_tokens * base.batch_scale / base.seq_len / (devices // (p * base.tensor))
              / base.micro_batch >= 1]
        fitting = [p for p in ok if memory(replace(base, pipeline=p))["fits"]]
        chosen["pipeline"] = fitting[0] if fitting else ok[-1]
    return Plan(params, tokens, devices, **chosen).validate()


def memory(plan: Plan) -> dict:
    """Bytes per device: model states (chapter 4's formulas, 16-bit with fp32 Adam: 16 bytes per
    parameter) split over P·t and sharded over the d data-parallel ranks, plus activations."""
    layers, hidden, heads = plan.shape()
    psi = plan.params / (plan.pipeline * plan.tensor)
    if plan.comm == "ps":  # workers keep parameters and gradients; the servers keep Adam
        states = {"params": 2 * psi, "grads": 2 * psi, "optimizer": 0.0}
    else:
        states = {k: v for k, v in zero_memory(psi, plan.data_parallel, plan.zero, "mixed").items()
                  if k != "total"}
    full = activation_bytes(plan.seq_len, plan.micro_batch, hidden, heads, plan.tensor)
    # 1F1B: the first stage holds P micro-batches of its L/P layers, so L layer-micro-batches
    # (Narayanan et al., 2021); without a pipeline, one micro-batch of all L layers.
    held = layers / plan.pipeline * min(plan.pipeline, plan.microbatches)
    if plan.recompute:  # keep each layer's input, rebuild one layer's activations at a time
        act = held * 2 * plan.seq_len * plan.micro_batch * hidden / plan.tensor + full
    else:
        act = held * full
    out = {**states, "activations": act}
    out["total"] = sum(out.values())
    out["device"] = devices()[plan.device]["memory"]
    out["fits"] = out["total"] <= out["device"]
    return out


def step_time(plan: Plan) -> dict:
    """Seconds of one training step, term by term (chapter 7 shows this function).

    compute: FLOPs over the devices' delivered rate; bubble: the pipeline's idle (P−1)/M of it;
    bandwidth and latency: the α-β cost of the messages, of which ``overlap`` is hidden.
    """
    dev, net, node = devices()[plan.device], links()[plan.link], links()[plan.intra_link]
    layers, hidden, _ = plan.shape()
    d, P, t, m = plan.data_parallel, plan.pipeline, plan.tensor, plan.microbatches
    flops = (8 if plan.recompute else 6) * plan.params * plan.batch_tokens * plan.batch_scale
    compute = flops / (plan.devices * dev["peak_flops"] * plan.efficiency)  # Kaplan et al., 2020
    bubble = compute * (P - 1) / m  # the idle (P−1)/(M+P−1) of the pipeline's time
    grads = 2 * plan.params / (P * t) / plan.compression  # bf16 gradients of my part of the model
    if plan.comm == "ps":  # the busiest server: 2·N·S/K (chapter 1)
        lat, bw = 2 * d / plan.servers, 2 * d / plan.servers * grads
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
    if t > 1:  # Megatron: 2 all-reduces per layer forward, 2 backward, 2 more when recomputing
        a, b = allreduce_terms("ring", t, 2 * plan.seq_len * plan.micro_batch * hidden)
        count = layers / P * m * (6 if plan.recompute else 4)
        lat, bw = lat + count * a * node["alpha"], bw + count * b * node["beta"]
    return {"compute": compute, "bubble": bubble, "bandwidth": bw, "latency": lat,
            "step": compute + bubble + bw + lat, "flops": flops}


def estimate(plan: Plan) -> dict:
    """Does it fit, seconds per step, days to train on ``tokens``, memory, the dominating term."""
    plan = plan.validate()
    terms = step_time(plan)
    steps = plan.tokens / (plan.batch_tokens * plan.batch_scale)
    mem = memory(plan)
    layers, hidden, heads = plan.shape()
    return {"plan": plan, "fits": mem["fits"], "memory": mem, "terms": terms,
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
        f"{plan.overlap:.0%} of the data-parallel communication hidden behind compute (assumed); "
        "pipeline and tensor-parallel messages never hidden",
        "memory: 2 + 2 + 12 bytes per parameter (bf16 weights and gradients, fp32 Adam; "
        "Rajbhandari et al. 2020), activations s·b·h·(10 + 24/t + 5as/(ht)) per layer "
        "(Korthikanti et al. 2022)" + (", only each layer's input kept when recomputing"
                                       if plan.recompute else ""),
    ]
    if plan.tensor > 1:
        lines.append(f"tensor parallel over {plan.tensor} devices of a node: {node['name']}, "
                     f"{1e-9 / node['beta']:g} GB/s — {node['source']}")
    if plan.batch_scale != 1:
        lines.append(f"a large-batch optimizer (LAMB, You et al. 2020) trains at {plan.batch_scale:g}× "
                     "the batch in the same tokens (assumed: it holds up to a critical batch size, "
                     "McCandlish et al. 2018)")
    if plan.compression != 1:
        lines.append(f"gradients compressed {plan.compression:g}× (assumed; chapter 6 measures ratios)")
    return lines


def table(rows: list[dict]) -> str:
    """The estimates as text: one line per milestone."""
    lines = [f"{'milestone':<17} {'P':>4} {'d':>5} {'fits':>5} {'GB/device':>10} {'step s':>9} "
             f"{'days':>9} {'TFLOP/s':>8}  dominant"]
    for r in rows:
        lines.append(f"{r.get('milestone', '-'):<17} {r['plan'].pipeline:>4} {r['data_parallel']:>5} "
                     f"{'yes' if r['fits'] else 'NO':>5} {r['memory']['total'] / 1e9:>10.1f} "
                     f"{r['step_s']:>9.3g} {r['days']:>9.3g} {r['tflops_per_device']:>8.1f}  {r['dominant']}")
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
                       ("layers", int), ("hidden", int)):
        p.add_argument(f"--{name}", type=kind, help=f"overrides the plan's {name.replace('-', '_')}")
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


def fit_point_to_point(sizes: list[float], times: list[float]) -> dict:
    """α (s) and β (s/byte) of t = α + m·β from one-way message times (a ping-pong; chapter 7).

    Errors weigh relative to each time, as :func:`fit_alpha_beta` does; α and β stay ≥ 0.
    """
    import numpy as np

    if len(sizes) != len(times) or len(sizes) < 2 or min(times) <= 0:
        raise ValueError("need at least two (size, positive time) pairs to fit α and β")
    t = np.array(times, dtype=float)
    w = np.stack([np.ones_like(t), np.array(sizes, dtype=float)], axis=1) / t[:, None]
    alpha, beta = np.linalg.lstsq(w, np.ones(len(t)), rcond=None)[0]
    if alpha < 0:
        alpha, beta = 0.0, float(np.linalg.lstsq(w[:, 1:], np.ones(len(t)), rcond=None)[0][0])
    elif beta <= 0:
        alpha, beta = float(np.linalg.lstsq(w[:, :1], np.ones(len(t)), rcond=None)[0][0]), 1e-15
    return {"alpha_s": float(alpha), "beta_s_per_byte": float(beta), "bandwidth_GBps": 1e-9 / beta}
