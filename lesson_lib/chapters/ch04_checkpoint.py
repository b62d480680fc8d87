"""Chapter 4, section 9 — surviving a failure: sharded checkpoints with ``torch.distributed.checkpoint``.

One cell: :func:`survive` trains FSDP2 uninterrupted, then with a rank SIGKILLed mid-step, then
resumed on fresh processes from the last checkpoint (``zero.checkpoint.survive``), draws the three
loss curves and prints what the failure cost, measured.
"""

from __future__ import annotations

from IPython.display import display

from .. import plots
from ..milestones import zero


def config(world_size: int = 2, steps: int = 12) -> zero.Config:
    """Section 8's ``laptop`` model and data (FSDP2, Adam), run for ``steps`` steps."""
    return zero.Config.laptop(stage=3, world_size=world_size, steps=steps)


def survive(world_size: int = 2, steps: int = 12, every: int = 4, kill_step: int = 10,
            kill_rank: int = 1, mtbf_h: float = 1.0) -> dict:
    """Checkpoint every ``every`` steps, SIGKILL ``kill_rank`` in ``kill_step``, resume; the figure
    and the time lost. ``mtbf_h`` (an assumption, printed) feeds Young's interval."""
    cfg = config(world_size, steps)
    run = zero.checkpoint.survive(cfg, zero.checkpoint.Plan(every, kill_step, kill_rank))
    display(plots.checkpoint.resumed_loss(
        run, f"FSDP2 on {world_size} ranks, a checkpoint every {every} steps: rank {kill_rank} SIGKILLed "
             f"in step {kill_step}, fresh processes resume at step {run['restored_step']}"))
    files = run["shards"]["bytes"]
    step_s = run["redone_s"] / max(1, run["redone_steps"])
    other = run["time_lost_s"] - sum(run[k] for k in ("redone_s", "detect_s", "restart_s", "load_s"))
    young = zero.checkpoint.young_interval(max(run["save_s"]), mtbf_h * 3600)
    rest = (f"  the rest: mostly the fresh processes' first job (importing FSDP2 and DCP, sharding the "
            f"model)\n    and the part of step {kill_step} done before the kill: {other:.2f} s\n")
    if other < 0:  # the total is a difference of two runs' times: never print a negative share
        rest = (f"  (the parts above add up to {-other:.2f} s more than the total: the total is a "
                "difference\n  of two runs' times, which vary by about that much from run to run)\n")
    print(f"the runtime's error: {run['error']}\n"
          f"time lost: {run['time_lost_s']:.1f} s measured (killed run + restart + resumed run − "
          f"uninterrupted run), of which\n"
          f"  {run['redone_steps']} steps redone since the checkpoint: {run['redone_s'] * 1e3:.0f} ms\n"
          f"  the kill noticed (SIGKILL → WorkerError in the notebook): {run['detect_s']:.2f} s\n"
          f"  fresh processes started and joined: {run['restart_s']:.2f} s\n"
          f"  the checkpoint loaded (slowest rank): {run['load_s'] * 1e3:.0f} ms\n" + rest +
          f"checkpoint written in {', '.join(f'{s * 1e3:.0f}' for s in run['save_s'])} ms; files: "
          + ", ".join(f"{name} {b / 1e3:,.0f} kB" for name, b in files.items()) + "\n"
          f"Young (1974), sqrt(2·δ·MTBF) with δ = {max(run['save_s']) * 1e3:.0f} ms (measured) and a "
          f"failure every {mtbf_h:g} h (assumed):\n  checkpoint every {young:.0f} s ≈ "
          f"{young / step_s:,.0f} of these steps")
    return run
