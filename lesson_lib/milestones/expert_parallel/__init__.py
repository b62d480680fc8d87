"""Expert parallelism (chapter 8): a mixture of experts whose experts live on different ranks, tokens
routed to them and back with all-to-all (Lepikhin et al., 2020; Fedus et al., 2021).

* :mod:`.moe` — routing, capacity, the load-balancing loss, the two all-to-alls, the single process
"""

from . import moe
from .moe import MoEConfig

__all__ = ["MoEConfig", "moe"]
