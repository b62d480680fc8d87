"""Chapter 8: tensor, sequence, context and expert parallelism, on one rank grid.

* :mod:`.mappings` — f and g (Shoeybi et al., 2019) and sequence parallelism's pair (Korthikanti et al., 2022)
* :mod:`.layers` — column- and row-parallel layers, the parallel transformer
* :mod:`.model` — the unsharded reference transformer, its data and Config
* :mod:`.grid` — the rank grid ``arange(world).view(dp, pp, tp)`` and its groups
* :mod:`.train`, :mod:`.memory` — training on a grid; :mod:`.three_d` — data × pipeline × tensor
* expert and context parallelism have packages of their own, beside this one: :mod:`..expert_parallel`
  (mixture of experts) and :mod:`..context_parallel` (ring attention)
* :mod:`.dtensor` — PyTorch's ``parallelize_module`` and ``fully_shard``
* :mod:`.tolerances` — comparison tolerances from float32 rounding
* :mod:`.results` — each rank's record typed (:class:`GridRankResult`); :mod:`.milestone` — the
  registered experiment ``tensor-parallel`` (its own ``Config``: the layout and the model as options)
"""

from . import formulas, milestone, three_d
from .grid import Grid, Layout
from .layers import ColumnParallelLinear, ParallelTransformer, RowParallelLinear
from .mappings import CopyToTensorRegion, ReduceFromTensorRegion, f, g
from .model import Config, Transformer
from .results import GridRankResult

__all__ = ["ColumnParallelLinear", "Config", "CopyToTensorRegion", "Grid", "GridRankResult", "Layout",
           "ParallelTransformer", "ReduceFromTensorRegion", "RowParallelLinear", "Transformer",
           "f", "formulas", "g", "milestone", "three_d"]
