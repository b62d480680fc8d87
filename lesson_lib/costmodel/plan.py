"""The inputs of chapter 7's cost model: :class:`Plan`, one training job (a model, a cluster and a
milestone's choices, each field checked by ``validate``), and what each milestone of the talk changes
in it. :mod:`.planner` turns a Plan into memory, step time and days.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from .compute import RECOMPUTE
from .terms import devices, links, published

# Every number of a Plan is an input that ``planner.assumptions()`` prints; the devices and links
# come from data/devices.csv and data/links.csv (a source per row).

MILESTONES = ("parameter-server", "ps-sharded", "ring", "pipeline", "zero-1", "zero-2", "zero-3", "lamb",
              "compression")
# What each milestone of the talk changes, on top of plain data parallelism with a ring.
MILESTONE_PLANS = {
    "parameter-server": {"comm": "ps"},                       # one server: the hotspot (chapter 1)
    "ps-sharded": {"comm": "ps", "servers": "workers"},      # K = N shards, as deployed (Li et al. 2014)
    "ring": {},
    "pipeline": {"pipeline": "auto"},
    # ZeRO-3 gathers the parameters once per micro-batch: these bars run each replica's share of the
    # batch as ONE micro-batch (micro_batch=0), so they gather once per step and hold that share's
    # activations (LAMB: 6 sequences). Micro-batches of 1 would gather 6 times (chapter 7 says so).
    "zero-1": {"zero": 1}, "zero-2": {"zero": 2}, "zero-3": {"zero": 3, "micro_batch": 0},
    "lamb": {"zero": 3, "batch_scale": 4, "micro_batch": 0},
    "compression": {"zero": 3, "batch_scale": 4, "compression": 4, "micro_batch": 0},
}
# The step's terms: compute, the pipeline's bubble, the data-parallel (and pipeline, offload) messages'
# bandwidth and latency, and the tensor-parallel collectives on the node's link (chapter 8).
# context and expert: chapter 8's context-parallel K/V exchange and expert-parallel all-to-alls.
# sync: the wait for the slowest device at each step (jitter; 0 unless a plan says otherwise).
TERMS = ("compute", "bubble", "bandwidth", "latency", "tensor", "context", "expert", "sync")


class _FP8Peaks(Mapping):
    """Dense FP8 tensor-core peak by device, where it has one (data/devices.csv's fp8_tflops: H100 and
    H200 1,979 TFLOP/s, B200 4,500, GB200 5,000, each from its datasheet); the A100 and V100 have none."""

    def _table(self) -> dict[str, float]:
        return {k: d["fp8_flops"] for k, d in devices().items() if d["fp8_flops"]}

    def __getitem__(self, key: str) -> float:
        return self._table()[key]

    def __iter__(self):
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


FP8_PEAK_FLOPS = _FP8Peaks()


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
    servers: int = 1                   # K parameter-server shards (ps only), machines besides the n
    pipeline: int = 1                  # P stages (1F1B)
    tensor: int = 1                    # t, tensor-parallel ranks (Shoeybi et al., 2019)
    sequence_parallel: bool = False    # between the blocks, activations split over t (Korthikanti 2022)
    zero: int = 0                      # ZeRO stage over the data-parallel ranks
    batch_tokens: float = 1536 * 2048  # tokens per step (Narayanan et al.'s GPT-3 batch)
    batch_scale: float = 1.0           # a large-batch optimizer's multiple of that batch (LAMB)
    compression: float = 1.0           # gradient bytes divided by this (chapter 6)
    extra_steps: float = 0.0           # share of extra steps a compressed run needs (0: a bound)
    seq_len: int = 2048
    micro_batch: int = 1               # sequences per micro-batch; 0: the replica's whole share, at once
    layers: int = 0                    # 0: from Ψ ≈ 12·L·h² with h = 128·L (GPT-3's shape)
    hidden: int = 0
    heads: int = 0                     # 0: h / 128
    efficiency: float | str = "gemm"   # share of peak reached: "gemm", e(x) from the GEMM shapes (gemm.py,
    #                                    fitted on SC21 Table 1), or a constant (CALIBRATED_EFFICIENCY: 0.549)
    recompute: bool | str = True       # none | selective | full (True: full, False: none)
    overlap: float = 0.0               # share of data-parallel communication hidden behind compute
    offload: bool = False              # ZeRO-Offload: gradients, Adam and its step on the host (Ren 2021)
    host_link: str = "pcie4-x16"       # device ↔ host, for offload (data/links.csv)
    host_gb: float = 256.0             # host memory per device (assumed; DGX A100: 2 TB for 8 GPUs)
    chunks: int = 1                    # v, model chunks per pipeline rank (interleaved 1F1B; SC21)
    flash_attention: bool = False      # attention's s×s scores never stored (Dao et al., 2022)
    attention_flops: bool = True       # count attention's 12·L·h·s FLOPs per token (SC21 Eq. 3)
    vocab: int = 0                     # V, for SC21 Eq. 3's logit layer (0: inside Ψ, not split out)
    tied_embeddings: bool = True       # input embedding = output head (GPT); False: Llama, Nemotron-4
    dropout: bool = True               # its masks saved (GPT-3, Korthikanti); False: Llama, Nemotron-4
    tp_overlap: float = 0.0            # share of tensor-parallel communication hidden behind compute
    context: int = 1                   # c, context-parallel ranks: each holds s/c of every sequence
    context_algorithm: str = "all-gather"  # all-gather (Llama 3) | ring (ring attention)
    kv_heads: int = 0                  # grouped-query attention's K/V heads (0: = heads)
    experts: int = 0                   # E experts per MoE layer (0: dense)
    expert_parallel: int = 1           # experts spread over this many ranks (taken from d·c)
    top_k: int = 1                     # experts each token goes to
    active_params: float = 0.0         # parameters each token meets (0: = params, dense)
    precision: str = "bf16"            # bf16 | fp8 (the linear layers at the FP8 peak; gemm.py)
    bucket_params: float = 0.0         # gradients per data-parallel bucket (0: Megatron's max(4e7, 1e6·d·c))
    jitter: float = 0.0                # σ of each device's compute, as a share of it (stragglers; 0: none)

    def shape(self) -> tuple[int, int, int]:
        """(layers, hidden, heads): given, or GPT-3's aspect (h = 128·L) from Ψ = 12·L·h². Given the
        layers and not h, h comes from Ψ = (10 + 2·a_kv/a)·L·h²: grouped-query attention's K and V
        projections hold a_kv/a of h² each (Ainslie et al., 2023), so fewer K/V heads mean a wider h
        for the same Ψ, and more attention FLOPs (12·L·h·s) and activations per token."""
        layers = self.layers or max(1, round((self.params / (12 * 128**2)) ** (1 / 3)))
        if self.hidden:
            hidden = self.hidden
        elif self.layers:
            per_layer = 12.0
            if self.kv_heads:  # a = given heads, or h/128 at the 12·L·h² width
                heads = self.heads or max(1, round((self.params / (12 * layers)) ** 0.5) // 128)
                per_layer = 10 + 2 * min(self.kv_heads, heads) / heads
            hidden = max(1, round((self.params / (per_layer * layers)) ** 0.5))
        else:
            hidden = 128 * layers
        return layers, hidden, self.heads or max(1, hidden // 128)

    @property
    def data_parallel(self) -> int:
        return self.devices // (self.pipeline * self.tensor * self.context)

    @property
    def sequences_per_microbatch(self) -> float:
        """b: ``micro_batch``, or with 0 the replica's whole share of the step's sequences."""
        share = self.batch_tokens * self.batch_scale / self.seq_len / self.data_parallel
        return self.micro_batch or share

    @property
    def microbatches(self) -> float:
        """Micro-batches each pipeline runs per step: the step's sequences over d replicas and b."""
        return self.batch_tokens * self.batch_scale / self.seq_len / (self.data_parallel
                                                                     * self.sequences_per_microbatch)

    @property
    def recompute_policy(self) -> str:
        """none | selective | full (Korthikanti et al., 2022); True is full, False none."""
        if isinstance(self.recompute, bool):
            return "full" if self.recompute else "none"
        return self.recompute

    @property
    def active(self) -> float:
        """Parameters each token meets: ``active_params``, or all of them for a dense model."""
        return self.active_params or self.params

    @property
    def matmul_params(self) -> float:
        """The parameters a token meets in a matmul: :attr:`active` less the input embedding when it is
        a table of its own (untied, V·h): a lookup, not a matmul, so PaLM's MFU leaves it out of 6·N
        (Chowdhery et al., 2022, App. B). Tied, the one V·h matrix is the head's matmul and stays."""
        _, hidden, _ = self.shape()
        return self.active - (0 if self.tied_embeddings else self.vocab * hidden)

    def validate(self) -> "Plan":
        if self.efficiency != "gemm" and (isinstance(self.efficiency, (bool, str))
                                          or not isinstance(self.efficiency, (int, float))
                                          or not 0 < self.efficiency <= 1):
            raise ValueError(f"efficiency must be 'gemm' (from the GEMM shapes) or a share of peak in "
                             f"(0, 1], got {self.efficiency!r}")
        for name in ("params", "tokens", "batch_tokens", "batch_scale", "compression", "host_gb"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be a positive number, got {v!r}")
        for name in ("devices", "servers", "pipeline", "tensor", "seq_len", "chunks", "context",
                     "expert_parallel", "top_k"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        for name in ("micro_batch", "vocab", "kv_heads", "experts"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an int ≥ 0, got {v!r}")
        self._validate_new()
        for name in ("layers", "hidden", "heads"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be a positive int (0: derived from params), got {v!r}")
        if self.device not in devices():
            raise ValueError(f"device must be one of {', '.join(devices())}, got {self.device!r}")
        for name in ("link", "intra_link", "host_link"):
            if getattr(self, name) not in links():
                raise ValueError(f"{name} must be one of {', '.join(links())}, got {getattr(self, name)!r}")
        if self.comm not in ("ring", "ps"):
            raise ValueError(f"comm must be 'ring' or 'ps', got {self.comm!r}")
        if self.zero not in (0, 1, 2, 3) or isinstance(self.zero, bool):
            raise ValueError(f"zero must be 0, 1, 2 or 3, got {self.zero!r}")
        if self.comm == "ps" and (self.zero or self.pipeline > 1):
            raise ValueError("comm='ps' models chapter 1's parameter server: use it with zero=0, pipeline=1")
        for flag in ("tied_embeddings", "dropout"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag} must be True or False, got {getattr(self, flag)!r}")
        if not self.tied_embeddings and not self.vocab:
            raise ValueError("tied_embeddings=False needs vocab (the input embedding's V·h is left out of "
                             "the matmul FLOPs)")
        if not isinstance(self.sequence_parallel, bool):
            raise ValueError(f"sequence_parallel must be True or False, got {self.sequence_parallel!r}")
        if isinstance(self.extra_steps, bool) or not isinstance(self.extra_steps, (int, float)) \
                or not math.isfinite(self.extra_steps) or self.extra_steps < 0:
            raise ValueError(f"extra_steps must be a number ≥ 0 (a share: 0.1 = 10 % more steps), "
                             f"got {self.extra_steps!r}")
        if not isinstance(self.offload, bool):
            raise ValueError(f"offload must be True or False, got {self.offload!r}")
        if self.offload and self.zero != 2:
            raise ValueError("offload models ZeRO-Offload, built on ZeRO-2's partitioned gradients and "
                             f"optimizer: use it with zero=2, got zero={self.zero}")
        for name in ("bucket_params", "jitter"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be a number ≥ 0, got {v!r}")
        if not 0 <= self.overlap <= 1:
            raise ValueError(f"overlap must be between 0 and 1, got {self.overlap!r}")
        ways = self.pipeline * self.tensor * self.context
        if self.devices % ways:
            raise ValueError(f"devices={self.devices} must be a multiple of pipeline × tensor × context = "
                             f"{ways}")
        layers = self.shape()[0]
        if self.pipeline > layers:
            raise ValueError(f"pipeline={self.pipeline} stages is more than the model's {layers} layers")
        if self.chunks > 1 and (self.pipeline == 1 or self.pipeline * self.chunks > layers):
            raise ValueError(f"chunks={self.chunks} needs a pipeline and at least pipeline × chunks = "
                             f"{self.pipeline * self.chunks} layers (the model has {layers})")
        if self.experts and (self.experts % self.expert_parallel
                             or (self.data_parallel * self.context) % self.expert_parallel):
            raise ValueError(f"expert_parallel={self.expert_parallel} must divide the experts "
                             f"({self.experts}) and d × context = {self.data_parallel * self.context}")
        if self.microbatches < 1:
            raise ValueError(f"batch_tokens={self.batch_tokens:g} gives each of the {self.data_parallel} "
                             f"replicas less than one micro-batch of {self.micro_batch} × {self.seq_len}")
        return self

    def _validate_new(self) -> None:
        if self.recompute_policy not in RECOMPUTE:
            raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)} (or True/False), "
                             f"got {self.recompute!r}")
        for name in ("flash_attention", "attention_flops"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if isinstance(self.tp_overlap, bool) or not 0 <= self.tp_overlap <= 1:
            raise ValueError(f"tp_overlap must be between 0 and 1, got {self.tp_overlap!r}")
        if self.context_algorithm not in ("all-gather", "ring"):
            raise ValueError(f"context_algorithm must be 'all-gather' or 'ring', "
                             f"got {self.context_algorithm!r}")
        if self.seq_len % self.context:
            raise ValueError(f"context={self.context} must divide seq_len={self.seq_len}")
        if isinstance(self.active_params, bool) or not 0 <= self.active_params <= self.params:
            raise ValueError(f"active_params must be between 0 (dense) and params, "
                             f"got {self.active_params!r}")
        if self.expert_parallel > 1 and not self.experts:
            raise ValueError("expert_parallel needs experts (a mixture-of-experts model)")
        if self.experts and self.top_k > self.experts:
            raise ValueError(f"top_k={self.top_k} is more than the {self.experts} experts")
        if self.kv_heads > self.shape()[2]:
            raise ValueError(f"kv_heads={self.kv_heads} is more than the {self.shape()[2]} attention heads")
        if self.precision not in ("bf16", "fp8"):
            raise ValueError(f"precision must be 'bf16' or 'fp8', got {self.precision!r}")
        if self.precision == "fp8" and self.device not in FP8_PEAK_FLOPS:
            raise ValueError(f"precision='fp8' needs a device with FP8 ({', '.join(FP8_PEAK_FLOPS)}), "
                             f"got {self.device!r}")


def published_plan(case: str, **options) -> Plan:
    """The Plan of a published run (data/published.csv): its devices, links, layout (t, p, context,
    chunks, micro-batch, ZeRO), batch, shape, recomputation and attention, experts and precision;
    ``options`` override them.
    Its efficiency is e(x) from its GEMM shapes, calibrated on the in-sample set (:mod:`.gemm`), FLOPs
    on SC21's Eq. 3 basis (attention counted); a run with no tokens is modelled for one step."""
    p = published()[case]
    num = lambda k, default: default if p.get(k, "") == "" else p[k]
    recompute = "full" if num("recompute", 0) else "selective" if num("selective", 0) else "none"
    batch = p["global_batch"] * p["seq_len"]
    chosen = dict(device=p["device"], link=p.get("link") or "ib-hdr",
                  intra_link=p.get("intra_link") or "nvlink3",
                  tensor=int(p["tensor"]), pipeline=int(p["pipeline"]), context=int(num("context", 1)),
                  chunks=int(num("chunks", 1)), micro_batch=int(num("micro_batch", 1)),
                  zero=int(num("zero", 0)), overlap=num("overlap", 0.0), tp_overlap=num("tp_overlap", 0.0),
                  batch_tokens=batch, seq_len=int(p["seq_len"]), layers=int(p["layers"]),
                  hidden=int(p["hidden"]), heads=int(p["heads"]), kv_heads=int(num("kv_heads", 0)),
                  vocab=int(num("vocab", 0)), tied_embeddings=bool(num("tied_embeddings", 1)),
                  recompute=recompute, dropout=bool(num("dropout", 1)),
                  sequence_parallel=bool(num("sequence_parallel", 0)),
                  flash_attention=bool(num("flash_attention", 0)), attention_flops=True,
                  experts=int(num("experts", 0)), expert_parallel=int(num("expert_parallel", 1)),
                  top_k=int(num("top_k", 1)), active_params=num("active_params", 0.0),
                  precision=p.get("precision") or "bf16")
    tokens = num("tokens", batch)
    return Plan(p["params"], tokens, int(p["devices"]), **{**chosen, **options}).validate()
