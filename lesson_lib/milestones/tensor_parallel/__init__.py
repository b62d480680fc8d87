"""Chapter 8 — what the talk left out: tensor, sequence, context and expert parallelism, on one grid.

* :mod:`.mappings` — f and g, the conjugate operators (Shoeybi et al., 2019), and sequence
  parallelism's all-gather / reduce-scatter pair (Korthikanti et al., 2022), as autograd Functions
* :mod:`.layers` — column- and row-parallel linear layers, attention and MLP, the parallel transformer
* :mod:`.model` — the unsharded transformer (the single-process reference), its data and Config
* :mod:`.grid` — the rank grid ``arange(world).view(dp, pp, tp)`` and its groups; Layout checks
* :mod:`.train` — training on a grid, and the single process it must equal; :mod:`.memory`
* :mod:`.three_d` — data × pipeline × tensor on one grid: GPipe stages, each tensor-parallel
* :mod:`.moe` — a top-1 or top-2 mixture of experts with experts on different ranks (GShard, Switch)
* :mod:`.ring_attention` — context parallelism: key/value blocks round a ring (Liu et al., 2023)
* :mod:`.dtensor` — the same model under ``parallelize_module`` and ``fully_shard`` (PyTorch's stack)
* :mod:`.tolerances` — how far each comparison may sit from its reference, from float32 rounding
"""

from . import formulas, three_d
from .grid import Grid, Layout
from .layers import ColumnParallelLinear, ParallelTransformer, RowParallelLinear
from .mappings import CopyToTensorRegion, ReduceFromTensorRegion, f, g
from .model import Config, Transformer
from .moe import MoEConfig

__all__ = ["ColumnParallelLinear", "Config", "CopyToTensorRegion", "Grid", "Layout", "MoEConfig",
           "ParallelTransformer", "ReduceFromTensorRegion", "RowParallelLinear", "Transformer", "f",
           "formulas", "g", "three_d"]
