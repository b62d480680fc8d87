"""Chapter 4, section 10 — fp16 needs loss scaling, bf16 does not (notebooks/04_zero.ipynb).

:func:`loss_scaling` is one cell's figure work: ``zero.loss_scaling``'s task in each precision, in
this process (no ranks: the point is the number format), a table, the figure, and what the
notebook asserts.
"""

from __future__ import annotations

from IPython.display import display

from .. import plots
from ..milestones.zero import loss_scaling as ls
from ..numerics import max_gap


def loss_scaling(task: ls.Task | None = None) -> dict:
    """Every precision of :data:`~lesson_lib.milestones.zero.loss_scaling.PRECISIONS` on ``task``:
    per precision the largest share of zero gradient values (and the first step's), the largest loss
    gap to fp32 and the rounding tolerance for it, the loss scale used."""
    task = task or ls.Task()
    runs = {p: ls.train(p, task) for p in ls.PRECISIONS}
    ref = runs["fp32"]["losses"]
    rows = {p: {"zero_first": r["zero_share"][0], "zero_max": max(r["zero_share"]),
                "loss_gap": max_gap(r["losses"], ref), "tolerance": ls.loss_tolerance(p, task, ref),
                "scale": r["scale"][-1], "final_loss": r["losses"][-1]} for p, r in runs.items()}
    print(f"{task.depth} tanh layers of {task.width}, Adam, {task.steps} steps of {task.batch} samples:")
    print(f"{'precision':>13} {'zero grads, step 0':>19} {'largest':>8} {'loss gap to fp32':>17} "
          f"{'rounding allows':>16} {'loss scale':>11}")
    for p, r in rows.items():
        print(f"{p:>13} {r['zero_first']:>19.1%} {r['zero_max']:>8.1%} {r['loss_gap']:>17.1e} "
              f"{r['tolerance']:>16.1e} {r['scale']:>11g}")
    display(plots.precision.loss_scaling(runs))
    return rows
