"""The pipeline milestone's options (chapter 3): :class:`Config`, the balancing choices and the
compute-dominated preset that ``bench bubble`` and the chapter measure the bubble on.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...config import TrainConfig, opt, positive_int
from .schedules import SCHEDULES, microbatches_run
from .zero_bubble import SCHEDULE as ZB

NAME = "pipeline"
BALANCES = ("params", "time")
# A compute-dominated model for ``bench bubble``: 16 hidden layers of width 1024 between a thin first
# layer and a thin head (a full-width first layer would make stage 0 lighter: unequal stages).
# The more work per micro-batch, the closer the wall-clock bubble comes to the formula.

@dataclass
class Config(TrainConfig):
    # laptop: chapter 3's 10-layer MLP; tiny: the smallest with a layer per stage to spare; bubble:
    # compute-dominated (``bench bubble``); memory: activations dominate a step's allocations (§6).
    # The timed presets (laptop, bubble) do not return their parameters.
    PRESETS = {"laptop": {"steps": 5, "global_batch": 128, "hidden": 1024, "d_in": 32, "depth": 9,
                          "samples": 1024, "return_params": False},
               "tiny": {"steps": 4, "global_batch": 24, "hidden": 32, "d_in": 16, "depth": 7, "samples": 512},
               "bubble": {"steps": 6, "global_batch": 1024, "hidden": 1024, "d_in": 32, "depth": 17,
                          "samples": 4096, "return_params": False},
               "memory": {"steps": 2, "global_batch": 1024, "hidden": 256, "d_in": 32, "depth": 15,
                          "samples": 1024, "peak_memory": True}}

    world_size: int = opt(0, "derived: = stages, one rank per stage (leave unset)")
    stages: int = opt(2, "pipeline stages P, one rank each (1: the unsplit model on one rank)")
    microbatches: int = opt(4, "micro-batches M per step; must divide global_batch (naive ignores it)")
    schedule: str = opt("1f1b", "naive (whole batch, one stage busy at a time) | gpipe | 1f1b | interleaved "
                                "(Narayanan et al., 2021: ``chunks`` model chunks per rank) | zb-h1 (Qi et "
                                "al., 2024: each backward split into B, the input's gradient, and W, the "
                                "weights')")
    chunks: int = opt(1, "model chunks per rank v (interleaved only): the model cut in v·P virtual stages")
    balance: str = opt("params", "params | time: equal parameter counts or equal measured time per stage")
    depth: int = opt(3, "hidden layers; the model has depth + 1 layers (Linear + ReLU) to cut into stages")
    lr: float = opt(0.3, "SGD learning rate (momentum 0.9)")
    recompute: bool = opt(False, "activation recomputation (Chen et al., 2016): each stage keeps only its "
                                 "input per micro-batch and reruns its forward during the backward")
    return_params: bool = opt(True, "send each stage's trained parameters and last gradients back, for the "
                                    "checks against one process (pp.state); the timed presets turn it off")
    peak_memory: bool = opt(False, "measure each stage's peak of allocated bytes (lesson_lib.peakmem), the "
                                   "last step's above what was alive at its start; on CPU its profiler "
                                   "slows each step")

    def __post_init__(self):
        if self.world_size == 0 and isinstance(self.stages, int) and not isinstance(self.stages, bool):
            self.world_size = self.stages

    def validate(self) -> "Config":
        positive_int(self, "stages")
        if self.world_size != self.stages:
            raise ValueError(f"world_size={self.world_size} must equal stages={self.stages} "
                             "(one rank per stage; leave world_size unset)")
        super().validate()
        positive_int(self, "microbatches")
        if self.global_batch % self.microbatches:
            raise ValueError(f"microbatches={self.microbatches} must divide global_batch="
                             f"{self.global_batch} into equal micro-batches")
        if self.schedule not in (*SCHEDULES, "interleaved", ZB):
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, interleaved, {ZB}, "
                             f"got {self.schedule!r}")
        positive_int(self, "chunks")
        if self.chunks > 1 and self.schedule != "interleaved":
            raise ValueError(f"chunks={self.chunks} needs schedule='interleaved', got {self.schedule!r}")
        if self.balance not in BALANCES:
            raise ValueError(f"balance must be one of {', '.join(BALANCES)}, got {self.balance!r}")
        for name in ("recompute", "peak_memory", "return_params"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.schedule == "interleaved":
            self._validate_interleaved()
        for name in ("recompute", "peak_memory"):
            if self.schedule == ZB and getattr(self, name):
                raise ValueError(f"{name} is not supported with schedule={ZB!r}")
        if self.stages > self.layers:
            raise ValueError(f"stages={self.stages} is more than the {self.layers} layers of the model "
                             f"(depth + 1); use at most {self.layers} stages or a deeper model")
        return self

    def _validate_interleaved(self) -> None:
        if self.stages < 2:
            raise ValueError(f"stages={self.stages}: the interleaved schedule needs at least 2 stages")
        if self.microbatches % self.stages:
            raise ValueError(f"microbatches={self.microbatches} must be a multiple of stages={self.stages} "
                             "for the interleaved schedule (micro-batches run in groups of P)")
        if self.chunks * self.stages > self.layers:
            raise ValueError(f"chunks={self.chunks} × stages={self.stages} virtual stages are more than the "
                             f"{self.layers} layers of the model (depth + 1)")
        for name in ("recompute", "peak_memory"):
            if getattr(self, name):
                raise ValueError(f"{name} is not supported with schedule='interleaved'")

    def replace(self, **changes) -> "Config":
        if "stages" in changes and "world_size" not in changes:
            changes["world_size"] = changes["stages"]
        return super().replace(**changes)

    @property
    def layers(self) -> int:
        return self.depth + 1

    @property
    def m(self) -> int:
        """Micro-batches the schedule really runs (naive: 1, the whole batch)."""
        return microbatches_run(self.schedule, self.microbatches)
