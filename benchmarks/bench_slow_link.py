"""Chapter 10 §3 over a slower link: DiLoCo at H = 4 against chapter 6's PowerSGD at rank 1 and DDP,
time to the same held-out loss, where the notebook's 10 Mbit/s run is too close to call between the
first two. Uses the notebook's own ``my_diloco`` (read from notebooks/scripts/10_resilience.py), so
this is the cell the text points to, run a few times; the order is each run's."""

from __future__ import annotations

import ast
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "notebooks" / "scripts" / "10_resilience.py"


def _my_diloco():
    """The notebook's ``my_diloco``, compiled from its script with the names it uses."""
    import time

    import torch
    import torch.distributed as dist

    from lesson_lib import comm
    from lesson_lib.milestones.resilience import task as T

    tree = ast.parse(SCRIPT.read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "my_diloco")
    scope = {"time": time, "torch": torch, "dist": dist, "comm": comm, "T": T}
    exec(compile(ast.Module([fn], []), str(SCRIPT), "exec"), scope)
    return scope["my_diloco"]


def measure(runs: int = 2, gbps: float = 0.001, h: int = 4, rank: int = 1, steps: int = 128) -> list[dict]:
    from lesson_lib.chapters import ch10
    from lesson_lib.milestones.resilience import task as T

    fn, rows = _my_diloco(), []
    for i in range(runs):
        out = ch10.slow_link(fn, T.Task(steps=steps), gbps=gbps, h=h, rank=rank)
        rows.append({"run": i, "order": out["order"], "reach_s": out["reach"],
                     "bytes": {n: r["bytes_sent"] for n, r in out["runs"].items()},
                     "collectives": {n: r["collectives"] for n, r in out["runs"].items()}})
    return rows


def show(rows: list[dict]) -> None:
    for r in rows:
        print(f"run {r['run']}: " + " < ".join(f"{n} ({r['reach_s'][n]:.2f} s)" for n in r["order"]))
