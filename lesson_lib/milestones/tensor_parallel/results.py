"""Chapter 8's per-rank results, typed: a rank's place in the grid and what it did there
(:class:`GridRankResult`), read by name (``r.pp_index``, ``r.bytes_per_group["tp"]``) by the chapter
and by the registered ``tensor-parallel`` experiment alike; and the check of a run against one process.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ...numerics import max_gap
from ...results import _Keyed
from . import ops as op_names
from . import tolerances

GROUPS = {"tp": (op_names.TP_ALL_REDUCE, op_names.SP_ALL_GATHER, op_names.SP_REDUCE_SCATTER,
                 op_names.SP_REGATHER),
          "pp": (op_names.PP_ACTIVATION, op_names.PP_GRADIENT), "dp": (op_names.DP_GRAD_ALL_REDUCE,)}
"""Each group's collectives, as the cost model's terms (:func:`~.formulas.step_bytes`) count them."""
UNMODELLED = (op_names.SP_ENDS, op_names.SP_NORM_GRADS)  # entering/leaving sequence parallelism, norm grads


def group_bytes(ops: dict[str, dict], steps: int = 1) -> dict[str, float]:
    """Bytes sent per step over each group (``tp``, ``pp``, ``dp``) and in the collectives no
    cost-model term counts (``unmodelled``), from counted ``ops`` covering ``steps`` steps."""
    def sent(names) -> float:
        return sum(ops.get(op, {}).get("bytes_sent", 0) for op in names) / steps

    return {**{g: sent(names) for g, names in GROUPS.items()}, "unmodelled": sent(UNMODELLED)}


@dataclass
class GridRankResult(_Keyed):
    """One rank of a chapter 8 run: its coordinates in ``arange(world).view(dp, pp, tp)``, its losses,
    the parameters it holds and the bytes it sent per step over each group."""

    rank: int
    dp_index: int
    """Which data-parallel replica (its share of the batch)."""
    pp_index: int
    """Which pipeline stage (its ``layers / pp`` blocks)."""
    tp_index: int
    """Which tensor-parallel rank of its stage (its ``heads / tp`` heads)."""
    losses: list[float] | None
    """The global loss per step; None on a stage that never sees it (all but the last)."""
    param_numel: int
    """Parameters this rank holds (its shards of its stage's)."""
    bytes_per_group: dict[str, float]
    """Bytes sent per step: ``tp``, ``pp``, ``dp`` (as :data:`GROUPS`) and ``unmodelled``."""
    peak: int | None = None
    """The training's measured allocator peak in bytes (the 3-D run); None where not measured."""

    @classmethod
    def of(cls, out: dict | GridRankResult, steps: int | None = None) -> GridRankResult:
        """A job's plain record (``train.train_job``, ``three_d.train_3d_job``, the experiment's
        worker) typed. ``steps``: the steps its ``ops`` counters cover (a ``train_job`` record counts
        its first step on its own, ``step``)."""
        if isinstance(out, GridRankResult):
            return out
        if "ops" in out:
            if steps is None:
                raise TypeError("a record with the whole run's ops needs steps= to give bytes per step")
            per_step = group_bytes(out["ops"], steps)
        else:
            per_step = group_bytes(out.get("step", {}), 1)
        dp, pp, tp = out["grid"]
        return cls(rank=out["rank"], dp_index=dp, pp_index=pp, tp_index=tp, losses=out.get("losses") or None,
                   param_numel=out["param_numel"], bytes_per_group=per_step, peak=out.get("peak"))

    def to_dict(self) -> dict:
        return asdict(self)


def equality(cfg, outs: list[dict], ref: dict) -> dict:
    """Every rank's losses and final parameters (its stage's, reassembled over tp) against one
    process's (``train.reference``), with :mod:`.tolerances`' float32 bounds for ``cfg`` (the model's
    :class:`~.model.Config`): ``gap`` (parameters), ``loss_gap``, their ``tolerance`` and
    ``loss_tolerance``, and ``equal``."""
    tol = tolerances.transformer(cfg, ref)
    params = {n: t for o in outs for n, t in o["params"].items()}
    missing = set(ref["params"]) - set(params)
    if missing:
        raise ValueError(f"no rank returned the parameters {', '.join(sorted(missing))}")
    ranks = [GridRankResult.of(o, cfg.steps) for o in outs]
    gap = max(float((params[n] - ref["params"][n]).abs().max()) for n in ref["params"])
    loss_gap = max(max_gap(r.losses, ref["losses"]) for r in ranks if r.losses is not None)
    loss_tol = tol["rel"] * max(ref["losses"])
    return {"gap": gap, "loss_gap": loss_gap, "tolerance": tol["params"], "loss_tolerance": loss_tol,
            "equal": gap <= tol["params"] and loss_gap <= loss_tol}
