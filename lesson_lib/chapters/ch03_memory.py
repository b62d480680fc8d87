"""Chapter 3 §6 — memory (notebooks/03_pipeline_parallelism.ipynb): the activations GPipe and 1F1B
hold, as an *inventory* (autograd's saved tensors) and *measured* (the allocator's peak,
:class:`lesson_lib.peakmem.PeakMemory`), then activation recomputation against both and its cost
in busy time. Each function runs real stages on warm clusters and returns what the notebook asserts.
"""

from __future__ import annotations

from types import SimpleNamespace

from IPython.display import display

from .. import plots
from ..config import positive_int
from ..experiments import run_warm
from ..milestones import pipeline as pp
from ..runtime import warm_cluster

LABELS = {("gpipe", False): "GPipe", ("1f1b", False): "1F1B", ("gpipe", True): "GPipe, recomputed",
          ("1f1b", True): "1F1B, recomputed"}


def _memory_cfg(stages: int, m: int, schedule: str, rows: int, **options) -> pp.Config:
    """The ``memory`` preset (activations dominate, the meter on) at ``rows`` samples per micro-batch."""
    return pp.Config.from_preset("memory", stages=stages, microbatches=m, schedule=schedule,
                                 global_batch=m * rows, **options)


def _stage_rows(stage_memory: list[dict], schedule: str, m: int, recompute: bool = False) -> list[dict]:
    return [{"schedule": schedule, "microbatches": m, "stage": s["stage"], "recompute": recompute,
             "label": LABELS[schedule, recompute], "peak": s["activation_peak"],
             "inventory": s["activation_peak"],
             "per_microbatch": s["activation_per_microbatch"], "in_flight": s["max_in_flight"],
             "measured": s.get("measured_step_peak")} for s in stage_memory]


def print_table(header: list[str], rows: list[list[str]]) -> None:
    """Columns aligned, one line a row: a few runs' figures side by side, not a wall of sentences."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    for line in (header, *rows):
        print("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip())


def _print_rows(rows: list[dict]) -> None:
    mb = lambda b: f"{b / 1e6:.2f}"
    print_table(["run", "stage", "in flight", "inventory MB", "measured MB", "difference MB"],
                [[r["label"], str(r["stage"]), str(r["in_flight"]), mb(r["inventory"]), mb(r["measured"]),
                  mb(r["measured"] - r["inventory"])] for r in rows])


def activation_memory(stages: int = 4, microbatches=(1, 2, 4, 8), rows_per_microbatch: int = 128):
    """Peak activation memory per stage, GPipe vs 1F1B, as M grows at a fixed micro-batch size: the
    saved tensors held at once (inventory) and, at the largest M, the allocator's peak (measured;
    ``measured`` is None at the other M)."""
    rows = []
    for schedule in ("gpipe", "1f1b"):
        for m in microbatches:  # the meter only where it is shown: its profiler slows every step
            r = run_warm(_memory_cfg(stages, m, schedule, rows_per_microbatch,
                                     peak_memory=m == max(microbatches)))
            rows += _stage_rows(r["stage_memory"], schedule, m)
    cfg = _memory_cfg(stages, 1, "gpipe", rows_per_microbatch)
    shape = (f"{cfg.layers} layers of width {cfg.hidden}, {stages} stages, {rows_per_microbatch} samples "
             "per micro-batch")
    display(plots.pipeline.activation_peaks(rows, f"Peak activation memory per stage, inventory ({shape})"))
    top = [r for r in rows if r["microbatches"] == max(microbatches)]
    display(plots.pipeline.measured_activations(
        top, f"M = {max(microbatches)}: what a stage's step allocated at its peak (measured) and the saved "
             f"tensors it held at once (inventory) — {shape}"))
    print(f"M = {max(microbatches)}. measured: the allocator's peak in the last step above what was alive\n"
          "at its start (parameters, gradients, momentum). inventory: autograd's saved tensors held at once.")
    _print_rows(top)
    return rows


def recomputation(stages: int = 4, microbatches: int = 8, rows_per_microbatch: int = 128,
                  timed_rows: int = 128, timed_steps: int = 2, rounds: int = 1) -> dict:
    """GPipe and 1F1B at M = ``microbatches`` with and without recomputation (``recompute=True``): the
    activations held, measured and inventoried; the training of the two, compared; and the busy time
    of the forwards and backwards, on the laptop preset with the meter off (its profiler costs every
    small op time), against one extra forward: (2F + B)/(F + B).

    ``timed_rows`` = 128 samples per micro-batch, so that the arithmetic outweighs each operation's
    fixed cost, as on real hardware (a forward without autograd's bookkeeping costs less than one
    with it, and on small micro-batches the bookkeeping is much of the forward). Other processes on
    the same cores inflate single steps, so ``rounds`` runs of each, taking turns, time ``timed_steps``
    steps after the first each, and each variant keeps its least disturbed step (least busy time).
    One round of 2 keeps §6 to seconds of Run All (benchmarks/cell-times.md); more are steadier."""
    for name, value in (("timed_steps", timed_steps), ("rounds", rounds)):
        positive_int(SimpleNamespace(**{name: value}), name)  # the configs' own check
    rows, equal = [], {}
    for schedule in ("gpipe", "1f1b"):
        states = {}
        for recompute in (False, True):
            cfg = _memory_cfg(stages, microbatches, schedule, rows_per_microbatch, recompute=recompute)
            outs = warm_cluster(stages).run(pp.worker, cfg.validate())
            states[recompute] = pp.state(outs)
            rows += _stage_rows(pp.summarize(cfg, outs)["stage_memory"], schedule, microbatches, recompute)
        equal[schedule] = pp.gaps(states[False], states[True])
    display(plots.pipeline.measured_activations(
        rows, f"M = {microbatches}, with and without recomputation: measured (bars) and inventory (marks)"))
    _print_rows(rows)
    for schedule, g in equal.items():
        print(f"{LABELS[schedule, False]}: recomputed against stored — largest difference of losses "
              f"{g['losses']:.1e}, gradients {g['grads']:.1e}, parameters {g['params']:.1e}")
    steps: dict[bool, list] = {False: [], True: []}
    for _ in range(rounds):
        for recompute in (False, True):  # taking turns: a burst of load falls on both alike
            cfg = pp.Config.laptop(stages=stages, microbatches=microbatches, schedule="1f1b",
                                   steps=timed_steps + 1, global_batch=microbatches * timed_rows,
                                   recompute=recompute)
            events = [e for e in run_warm(cfg)["events"] if e["step"] > 0]  # step 0 pays one-off costs
            steps[recompute] += [{k: sum(e["busy"] for e in events if e["kind"] == k and e["step"] == s)
                                  for k in ("forward", "backward")} for s in range(1, timed_steps + 1)]
    # the step that the other processes on these cores disturbed least: a burst of contention
    # (a browser drawing, the kernel) inflates the CPU time of whatever runs then
    busy = {r: min(per_step, key=lambda x: x["forward"] + x["backward"]) for r, per_step in steps.items()}
    f, b = busy[False]["forward"], busy[False]["backward"]
    ratio = sum(busy[True].values()) / (f + b)
    print(f"busy time of one step's forwards + backwards, all stages (the least busy of "
          f"{rounds * timed_steps}),\n1F1B on the laptop preset, {timed_rows} samples per micro-batch: "
          f"{1e3 * (f + b):.0f} ms stored, {1e3 * sum(busy[True].values()):.0f} ms recomputed — "
          f"{ratio:.2f}×\none extra forward, (2F + B)/(F + B) with this run's F = {1e3 * f:.0f} ms and "
          f"B = {1e3 * b:.0f} ms, predicts {(2 * f + b) / (f + b):.2f}×")
    return {"rows": rows, "equal": equal, "busy": busy, "busy_ratio": ratio, "forward_share": f / (f + b),
            "rows_per_microbatch": rows_per_microbatch}
