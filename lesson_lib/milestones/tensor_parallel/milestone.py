"""Tensor parallelism on a rank grid (chapter 8): the small transformer trained over dp × pp × tp
ranks (data, GPipe pipeline and tensor parallelism, optionally sequence parallel), equal to one process.

The layout is the config's (``dp``, ``pp``, ``tp``, ``microbatches``, ``sequence_parallel``); the
worker is :func:`~.three_d.train_3d_job` with its steps timed; :func:`summarize` types each rank's
record (:class:`~.results.GridRankResult`) and sets each group's counted bytes beside the cost
model's (:func:`~.formulas.step_bytes`). :func:`reference` trains the unsharded
:class:`~.model.Transformer` in this process, no process group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ...config import CommonConfig, opt, positive_int
from ...metrics import StepRecorder, counters, device_memory, per_rank_summary
from ...runtime import context
from . import formulas, three_d, train
from .grid import Layout
from .model import Config as ModelConfig
from .results import GROUPS, GridRankResult

NAME = "tensor-parallel"


@dataclass
class Config(CommonConfig):
    # tiny: tests and quick checks (tp = 2, the rest data parallel); laptop: every axis but dp on 4
    # ranks of 2 cores, the chapter's transformer as it is (a few seconds)
    PRESETS = {"laptop": {"world_size": 4, "pp": 2, "tp": 2, "steps": 3},
               "tiny": {"world_size": 2, "tp": 2, "steps": 2}}

    world_size: int = opt(2, "number of ranks: dp × pp × tp")
    backend: str = opt("gloo", "gloo | auto (chapter 8's transformer trains on CPU tensors: nccl is refused)")
    steps: int = opt(3, "SGD steps")
    global_batch: int = opt(8, "sequences per step, summed over the dp replicas")
    lr: float = opt(0.1, "SGD learning rate (no momentum)")
    dp: int = opt(0, "data-parallel replicas (0: the rest of the grid, world_size / (pp · tp))")
    pp: int = opt(1, "pipeline stages (GPipe), each layers / pp blocks; at most layers")
    tp: int = opt(2, "tensor-parallel ranks per stage, each heads / tp heads and ffn / tp hidden units")
    microbatches: int = opt(2, "GPipe micro-batches per step; must divide each replica's global_batch / dp")
    sequence_parallel: bool = opt(False, "norms and residuals hold seq / tp tokens per rank "
                                         "(Korthikanti et al., 2022)")
    vocab: int = opt(32, "tokens in the vocabulary")
    d_model: int = opt(32, "width of the residual stream")
    heads: int = opt(4, "attention heads (tp must divide them)")
    layers: int = opt(2, "transformer blocks (pp must divide them)")
    ffn: int = opt(128, "width of the MLP's hidden layer (tp must divide it)")
    seq: int = opt(16, "tokens per sequence (tp must divide it with sequence parallelism)")

    def replicas(self) -> int:
        """dp as set, or (``dp = 0``) the rest of the grid: world_size / (pp · tp)."""
        return self.dp or self.world_size // (self.pp * self.tp)

    def layout(self) -> Layout:
        return Layout(dp=self.replicas(), pp=self.pp, tp=self.tp, sequence_parallel=self.sequence_parallel)

    def model(self) -> ModelConfig:
        """The transformer, its data and training, as :mod:`.model` and the jobs take them."""
        return ModelConfig(vocab=self.vocab, d_model=self.d_model, heads=self.heads, layers=self.layers,
                           ffn=self.ffn, seq=self.seq, batch=self.global_batch, steps=self.steps, lr=self.lr,
                           seed=self.seed)

    def validate(self) -> "Config":
        super().validate()
        if self.backend == "nccl":
            raise ValueError("backend nccl: chapter 8's transformer trains on CPU tensors; use gloo")
        for name in ("vocab", "d_model", "heads", "layers", "ffn", "seq", "pp", "tp", "microbatches"):
            positive_int(self, name)
        if isinstance(self.dp, bool) or not isinstance(self.dp, int) or self.dp < 0:
            raise ValueError(f"dp must be a whole number ≥ 0 (0: the rest of the grid), got {self.dp!r}")
        if not isinstance(self.sequence_parallel, bool):
            raise ValueError(f"sequence_parallel must be True or False, got {self.sequence_parallel!r}")
        if self.d_model % self.heads:
            raise ValueError(f"heads = {self.heads} does not divide d_model = {self.d_model}")
        if self.pp > self.layers:
            raise ValueError(f"pp = {self.pp} stages but layers = {self.layers}: each stage needs a block")
        if self.layers % self.pp:
            raise ValueError(f"pp = {self.pp} does not divide layers = {self.layers} into equal stages")
        need = {"heads": self.heads, "ffn": self.ffn, **({"seq": self.seq} if self.sequence_parallel else {})}
        for name, value in need.items():
            if value % self.tp:
                raise ValueError(f"tp = {self.tp} does not divide {name} = {value}")
        if self.dp == 0 and self.world_size % (self.pp * self.tp):
            raise ValueError(f"world_size = {self.world_size} is not a multiple of pp × tp = {self.pp} × "
                             f"{self.tp}: no whole number of dp replicas fills the grid")
        dp = self.replicas()
        if dp * self.pp * self.tp != self.world_size:
            raise ValueError(f"dp × pp × tp = {dp} × {self.pp} × {self.tp} = {dp * self.pp * self.tp}, but "
                             f"world_size is {self.world_size}: every rank needs one place in the grid")
        if self.global_batch % dp:
            raise ValueError(f"global_batch = {self.global_batch} does not divide among dp = {dp} replicas")
        if (self.global_batch // dp) % self.microbatches:
            raise ValueError(f"microbatches = {self.microbatches} must divide each replica's "
                             f"{self.global_batch // dp} sequences (global_batch / dp)")
        three_d.check(self.model(), self.layout().check(self.world_size), self.microbatches)  # a backstop
        return self


def worker(cfg: Config) -> dict:
    """Every rank: :func:`~.three_d.train_3d_job` on the config's grid, each step timed."""
    ctx = context()
    if dist.get_backend() == "nccl":
        raise RuntimeError("chapter 8's transformer trains on CPU tensors: run it with backend='gloo'")
    rec = StepRecorder(torch.device("cpu"), ctx.emit)
    out = three_d.train_3d_job(cfg.model(), cfg.layout(), cfg.microbatches, recorder=rec)
    held = 4 * out["param_numel"]  # float32
    # plain SGD: no optimizer state; each parameter has its gradient until its update; the activations
    # are not inventoried here, the allocator's measured peak of the training counts them
    memory = {"params": held, "grads": held, "optimizer": 0, "activations": 0,
              "buffers": counters().scratch_peak, "measured_peak": out["peak"], **device_memory(None)}
    return {**out, "losses": out["losses"] or [], "per_rank": per_rank_summary(ctx.rank, rec, memory)}


def summarize(cfg: Config, outs: list[dict]) -> dict:
    """Each rank typed (``grid``), the last stage's losses, and per group the busiest rank's counted
    bytes per step beside the cost model's."""
    ranks = [GridRankResult.of(o, cfg.steps) for o in outs]
    m, lay = cfg.model(), cfg.layout()
    return {
        "losses": next(r.losses for r in ranks if r.losses is not None),
        "grid": ranks,
        "layout": {"dp": lay.dp, "pp": lay.pp, "tp": lay.tp, "microbatches": cfg.microbatches,
                   "sequence_parallel": lay.sequence_parallel},
        "bytes_per_step": {g: max(r.bytes_per_group[g] for r in ranks) for g in (*GROUPS, "unmodelled")},
        "bytes_per_step_formula": formulas.step_bytes(m, lay.dp, lay.pp, lay.tp, cfg.microbatches,
                                                      lay.sequence_parallel),
        "stage_params_formula": [formulas.stage_params(m, lay.tp, lay.pp, s) for s in range(lay.pp)],
        "unsharded_params": formulas.stage_params(m, 1, 1, 0),
    }


def reference(cfg: Config) -> dict:
    """One process, no process group: the unsharded :class:`~.model.Transformer` on the whole batch,
    the same SGD steps (``train.reference``, which runs none of the parallel code): ``losses``, the
    first step's ``logits`` and ``grads``, the final ``params``."""
    return train.reference(cfg.model())
