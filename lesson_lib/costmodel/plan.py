"""The inputs of chapter 7's cost model: :class:`Plan`, one training job (a model, a cluster and a
milestone's choices, each field checked by ``validate``), and what each milestone of the talk changes
in it. :mod:`.planner` turns a Plan into memory, step time and days.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
    "zero-1": {"zero": 1}, "zero-2": {"zero": 2}, "zero-3": {"zero": 3},
    "lamb": {"zero": 3, "batch_scale": 4},
    "compression": {"zero": 3, "batch_scale": 4, "compression": 4},
}
# The step's terms: compute, the pipeline's bubble, the data-parallel (and pipeline, offload) messages'
# bandwidth and latency, and the tensor-parallel collectives on the node's link (chapter 8).
TERMS = ("compute", "bubble", "bandwidth", "latency", "tensor")


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
    micro_batch: int = 1               # sequences per micro-batch
    layers: int = 0                    # 0: from Ψ ≈ 12·L·h² with h = 128·L (GPT-3's shape)
    hidden: int = 0
    heads: int = 0                     # 0: h / 128
    efficiency: float = 0.5            # share of peak FLOP/s the math reaches (assumed)
    recompute: bool = True             # 8Ψ FLOPs per token instead of 6Ψ, less activation memory
    overlap: float = 0.0               # share of data-parallel communication hidden behind compute
    offload: bool = False              # ZeRO-Offload: gradients, Adam and its step on the host (Ren 2021)
    host_link: str = "pcie4-x16"       # device ↔ host, for offload (data/links.csv)
    host_gb: float = 256.0             # host memory per device (assumed; DGX A100: 2 TB for 8 GPUs)

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
        for name in ("params", "tokens", "batch_tokens", "batch_scale", "compression", "efficiency",
                     "host_gb"):
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
        for name in ("link", "intra_link", "host_link"):
            if getattr(self, name) not in links():
                raise ValueError(f"{name} must be one of {', '.join(links())}, got {getattr(self, name)!r}")
        if self.comm not in ("ring", "ps"):
            raise ValueError(f"comm must be 'ring' or 'ps', got {self.comm!r}")
        if self.zero not in (0, 1, 2, 3) or isinstance(self.zero, bool):
            raise ValueError(f"zero must be 0, 1, 2 or 3, got {self.zero!r}")
        if self.comm == "ps" and (self.zero or self.pipeline > 1):
            raise ValueError("comm='ps' models chapter 1's parameter server: use it with zero=0, pipeline=1")
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


def published_plan(case: str, **options) -> Plan:
    """The Plan of a published run (data/published.csv): its devices, layout, batch, shape and
    recomputation; ``options`` override them (chapter 7 checks the model against these)."""
    p = published()[case]
    chosen = dict(device=p["device"], tensor=int(p["tensor"]), pipeline=int(p["pipeline"]),
                  batch_tokens=p["global_batch"] * p["seq_len"], seq_len=int(p["seq_len"]),
                  layers=int(p["layers"]), hidden=int(p["hidden"]), heads=int(p["heads"]),
                  recompute=bool(p["recompute"]), sequence_parallel=bool(p.get("sequence_parallel") or 0))
    return Plan(p["params"], p["tokens"], int(p["devices"]), **{**chosen, **options}).validate()
