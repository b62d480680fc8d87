"""Choosing a (dp, pp, tp) layout with the cost model (chapter 8's layout exercise): every layout of
``world`` ranks the model can be cut into and that fits a memory budget, with its bytes per step and
its modelled step time on a wider model of the same depth (:func:`.formulas.step_time`)."""

from __future__ import annotations

from . import formulas, three_d
from .grid import Layout
from .model import Config


def feasible(cfg: Config, world: int, budget: int, micro: int,
             timed: Config | None = None) -> dict[tuple[int, int, int], dict]:
    """Every (dp, pp, tp) of ``world`` ranks that runs ``cfg`` and holds at most ``budget``
    parameters per rank: its step bytes for ``cfg`` and, under ``"time"``, its modelled step time
    for ``timed`` (default ``cfg``)."""
    out = {}
    for dp in range(1, world + 1):
        for pp in range(1, world + 1):
            tp, rest = divmod(world, dp * pp)
            if rest:
                continue
            try:
                three_d.check(cfg, Layout(dp=dp, pp=pp, tp=tp), micro)
            except ValueError:
                continue
            if max(formulas.stage_params(cfg, tp, pp, s) for s in range(pp)) <= budget:
                out[dp, pp, tp] = {**formulas.step_bytes(cfg, dp, pp, tp, micro),
                                   "time": formulas.step_time(timed or cfg, dp, pp, tp, micro)}
    return out


def fastest(options: dict[tuple[int, int, int], dict]) -> tuple[int, int, int]:
    """The layout with the shortest modelled step."""
    return min(options, key=lambda k: options[k]["time"]["step"])


def fewest_bytes(options: dict[tuple[int, int, int], dict]) -> tuple[int, int, int]:
    """The layout whose groups' busiest ranks send the fewest bytes per step."""
    return min(options, key=lambda k: options[k]["total"])
