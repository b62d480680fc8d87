"""Chapter 4 — ZeRO (notebooks/04_zero.ipynb).

One function per notebook cell: runs the ZeRO milestone's four stages in real processes, sets
the measured memory and traffic beside the paper's formulas, and returns what the cells assert.
"""

from __future__ import annotations

import statistics

from IPython.display import display

from .. import plots, widgets
from ..costmodel import zero_memory
from ..data import read_csv
from ..experiments import Result, run_warm
from ..milestones import zero
from ..numerics import adam_drift, max_gap
from ..runtime import warm_cluster
from .ch04_checkpoint import survive  # noqa: F401  (section 9)
from .ch04_exercises import exercises, first_fitting_stage, task  # noqa: F401
from .ch04_fsdp import fsdp2, fsdp2_memory  # noqa: F401  (section 8)
from .ch04_hsdp import hsdp, reduce_precision  # noqa: F401  (section 8)
from .ch04_precision import loss_scaling  # noqa: F401  (section 10)
from .ch04_prefetch import backward_prefetch, prefetch_timeline  # noqa: F401  (section 3)

CATEGORIES = ("params", "grads", "optimizer")


def config(stage: int = 1, world_size: int = 4, **options) -> zero.Config:
    """The chapter's run (``zero.Config.laptop()``), validated (raises ValueError naming a bad field)."""
    return zero.Config.laptop(stage=stage, world_size=world_size, **options)


def valid_world_sizes(most: int = 4) -> list[int]:
    """Rank counts the explorer offers: the preset's global batch must split evenly over them."""
    batch = zero.Config.PRESETS["laptop"]["global_batch"]
    return [n for n in range(1, most + 1) if batch % n == 0]


def _run(stage: int, world_size: int = 4, live=None, **options) -> Result:
    return run_warm(config(stage, world_size, **options), live, f"stage {stage}")


def stages(world_size: int = 4, precision: str = "fp32") -> dict[int, Result]:
    """Train with stages 0–3; live loss, then the inventory of memory per category beside the formulas."""
    for s in range(4):  # a bad choice fails here, before any worker starts
        config(s, world_size, precision=precision)
    live = plots.common.LiveRuns(f"ZeRO stages 0–3 on {world_size} ranks ({precision})")
    display(live)
    results = {s: _run(s, world_size, live, precision=precision) for s in range(4)}
    rows = [{"label": f"stage {s}", "measured": r.per_rank[0].memory, "formula": r["formula"]}
            for s, r in results.items()]
    title = (f"Memory per rank, {world_size} ranks, {precision}: the inventory of what rank 0 holds (bars) "
             "vs Rajbhandari et al. (2020) (marks)")
    display(plots.memory.memory_vs_formula(rows, title))
    return results


def stage2_buckets(world_size: int = 4, bucket_layers=(0.5, 1.0, 2.0), stage2: Result | None = None) -> dict:
    """Stage 2 with buckets reduce-scattered during the backward, at bucket sizes given in units of
    the largest layer's gradient: the peak of full gradients each rank held, against one bucket +
    one layer and the whole gradient; and whether training stayed the same as ``stage2``'s."""
    base = stage2 or _run(2, world_size)
    largest, whole = max(base["layer_bytes"]), sum(base["layer_bytes"])
    rows, same = [{"label": "no buckets", "peak": max(base["full_grads_peak"]), "bound": whole}], []
    for k in bucket_layers:
        mb = k * largest / 2**20
        r = _run(2, world_size, bucket_mb=mb)
        rows.append({"label": f"{k:g} × largest layer", "peak": max(r["full_grads_peak"]),
                     "bound": int(mb * 2**20) + largest})
        same.append(r.losses == base.losses and r["final_params"] == base["final_params"])
    display(plots.memory.gradient_peaks(rows, whole, f"ZeRO-2 on {world_size} ranks: full gradients held at "
                                                     "once, by bucket size (measured)"))
    print(f"{'bucket':<20} {'most full-gradient bytes at once':>32} {'bound':>12}")
    for row in rows:
        print(f"{row['label']:<20} {row['peak']:>32,} {row['bound']:>12,}")
    return {"rows": rows, "whole": whole, "same_training": same}


def prefetch_depths(world_size: int = 4, depths=(1, 2), stage3: Result | None = None) -> list[dict]:
    """Stage 3 gathering ``depth`` layers ahead in the forward: the most bytes of gathered parameters a
    rank held (measured from the storages), against the largest d + 1 consecutive layers; whether
    training and traffic stayed those of ``stage3`` (no prefetch)."""
    base = stage3 or _run(3, world_size)
    lb, rows = base["layer_bytes"], []
    print(f"{'prefetch d':>10} {'most gathered bytes at once':>28} {'largest d + 1 layers':>21}")
    for d in (0, *depths):
        r = base if d == 0 else _run(3, world_size, prefetch=d)
        rows.append({"depth": d, "peak": max(r["full_params_peak"]),
                     "window": max(sum(lb[i:i + d + 1]) for i in range(len(lb))),
                     "same": r.losses == base.losses and r["final_params"] == base["final_params"]
                     and r["traffic_per_step"] == base["traffic_per_step"]})
        print(f"{d:>10} {rows[-1]['peak']:>28,} {rows[-1]['window']:>21,}")
    return rows


def memory_ratios(results: dict[int, Result]) -> dict[int, dict[str, float]]:
    """Measured / formula for each model-state category, per stage (rank 0)."""
    out = {}
    for s, r in results.items():
        m, f = r.per_rank[0].memory, r["formula"]
        out[s] = {c: m[c] / f[c] for c in CATEGORIES}
        out[s]["total"] = sum(m[c] for c in CATEGORIES) / f["total"]
    cols = [*CATEGORIES, "total"]
    print("inventory ÷ formula, rank 0\n" + f"{'stage':>5} " + " ".join(f"{c:>9}" for c in cols))
    for s, d in out.items():
        print(f"{s:>5} " + " ".join(f"{d[c]:>9.3f}" for c in cols))
    return out


def agreement(results: dict[int, Result]) -> dict:
    """Do all stages train the same model? Against stage 0 and (fp32) single-process Adam."""
    base = results[0]
    same = {s: r.losses == base.losses and r["final_params"] == base["final_params"]
            for s, r in results.items()}
    out = {"identical_to_stage_0": same}
    if base.config["precision"] == "fp32":
        cfg = zero.Config(**{k: base.config[k] for k in zero.Config().task()})
        ref = zero.reference(cfg)
        out["max_gap_vs_single_process"] = max(max_gap(r.losses, ref) for r in results.values())
        out["tolerance"] = adam_drift(cfg)["loss_rel"] * max(map(abs, ref))
    print("bit for bit stage 0's training: "
          + ", ".join(f"stage {s} {'yes' if v else 'NO'}" for s, v in same.items()))
    if "tolerance" in out:
        print(f"largest loss gap to single-process Adam: {out['max_gap_vs_single_process']:.1e} "
              f"(rounding allows {out['tolerance']:.1e})")
    return out


def traffic(results: dict[int, Result]) -> list[dict]:
    """Counted bytes per rank per step against the paper's 2Ψ / 3Ψ (ring, (N−1)/N each)."""
    rows = [{"label": f"stage {s}", "counted": statistics.mean(r["traffic_per_step"]),
             "formula": r["traffic_formula_padded"], "step_ms": 1e3 * r.median_step_time(),
             "busy_ms": 1e3 * max(r.median_step("busy_s"))}
            for s, r in results.items()]
    display(plots.memory.stage_traffic(rows, note=plots.common.oversubscription_note(results.values())))
    print("stage 3 / stage 0 traffic: " + f"{rows[3]['counted'] / rows[0]['counted']:.3f}")
    return rows


def torch_zero(world_size: int = 4, ours: Result | None = None) -> dict:
    """torch's ZeroRedundancyOptimizer (ZeRO-1) on the same run; agreement and optimizer bytes."""
    cfg = config(1, world_size)
    outs = warm_cluster(world_size).run(zero.torch_zero_reference, cfg)
    ours = ours or _run(1, world_size)
    gap, pgap = max_gap(outs[0]["losses"], ours.losses), max_gap(outs[0]["params"], ours["final_params"])
    tol = adam_drift(cfg)
    opt = [o["optimizer_bytes"] for o in outs]
    print(f"largest difference from our stage 1: losses {gap:.2e}, parameters {pgap:.2e}\n"
          f"(rounding allows {tol['params']:.1e} = lr·steps/100)\n"
          f"optimizer state bytes per rank\n{'rank':>4} {'torch':>10} {'ours':>10}")
    for r, (a, b) in enumerate(zip(opt, (p.memory["optimizer"] for p in ours.per_rank))):
        print(f"{r:>4} {a:>10,} {b:>10,}")
    return {"loss_gap": gap, "param_gap": pgap, "torch_optimizer_bytes": opt,
            "param_tolerance": tol["params"], "loss_tolerance": tol["loss_rel"] * max(map(abs, ours.losses)),
            "our_optimizer_bytes": [p.memory["optimizer"] for p in ours.per_rank]}


def paper_example() -> dict[int, float]:
    """The paper's 7.5B parameters on 64 GPUs, mixed precision: GB per device for stages 0–3."""
    gb = {s: zero_memory(7.5e9, 64, s, "mixed")["total"] / 1e9 for s in range(4)}
    print("7.5B parameters, 64 GPUs: " + ", ".join(f"stage {s}: {v:.1f} GB" for s, v in gb.items()))
    return gb


def fits(world_size: int = 64, precision: str = "mixed") -> list[dict]:
    """Which landmark models' training states fit an 80 GB or a 141 GB device, at each stage."""
    rows = []
    for m in read_csv("model_sizes.csv"):
        psi = float(m["parameters"])
        row = {"model": m["model"], "parameters": f"{psi / 1e9:,.2f} B"}
        for gb in (80, 141):
            s = first_fitting_stage(psi, world_size, gb, precision)
            row[f"{gb} GB"] = "no stage" if s is None else f"stage {s}"
        rows.append(row)
    title = f"First ZeRO stage at which the model states fit, {world_size} devices, {precision}"
    display(plots.memory.fits_table(rows, ["model", "parameters", "80 GB", "141 GB"], title))
    return rows


def calculator():
    import ipywidgets as W

    psi = W.FloatLogSlider(value=7.5e9, base=10, min=6, max=12.5, step=0.001, description="parameters",
                           readout_format=".3g", layout={"width": "520px"})
    n = W.Dropdown(options=[1, 2, 4, 8, 16, 64, 256, 1024], value=64, description="devices")
    prec = W.ToggleButtons(options=["mixed", "fp32"], description="precision")
    out = W.HTML()

    def update(*_):
        td = "<td style='padding:2px 14px;text-align:right'>"
        rows = "".join(
            f"<tr>{td}stage {s}</td>{td}{t / 1e9:,.1f} GB</td>"
            f"{td}{'fits' if t <= 80e9 else '—'}</td>{td}{'fits' if t <= 141e9 else '—'}</td></tr>"
            for s in range(4) for t in [zero_memory(psi.value, n.value, s, prec.value)["total"]])
        out.value = (f"<table><tr>{td}</td>{td}<b>model states per device</b></td>{td}<b>80 GB</b></td>"
                     f"{td}<b>141 GB</b></td></tr>{rows}</table>")

    for w in (psi, n, prec):
        w.observe(update, "value")
    update()
    return W.VBox([psi, n, prec, out])


def explorer():
    """Stages 0–3 with a chosen rank count and precision; offers only rank counts that split the
    preset's batch, and checks the config before any worker starts."""
    import ipywidgets as W

    def go(world_size, precision):
        try:
            config(1, world_size, precision=precision)
        except ValueError as e:
            print(f"not started: {e}")
            return
        stages(world_size, precision)

    return widgets.run_button("Run all stages", {
        "world_size": W.Dropdown(options=valid_world_sizes(), value=2, description="ranks"),
        "precision": W.ToggleButtons(options=["fp32", "mixed"], description="precision"),
    }, go)


def measured_memory(preset: str = "memory", bucket_mb: float = 4.0) -> dict:
    """Stages 0–3 (and stage 2 with buckets of ``bucket_mb`` MiB) on the ``memory`` preset, a model
    whose states dominate: each rank's peak of allocated bytes during the steps, *measured* by the
    allocator (:class:`lesson_lib.peakmem.PeakMemory`), beside the *inventory* of what it knows it
    holds and the paper's formula (a model). Returns what the notebook asserts."""
    runs = [(f"stage {s}", s, {}) for s in range(3)] + [("stage 2, buckets", 2, {"bucket_mb": bucket_mb}),
                                                        ("stage 3", 3, {})]
    rows = []
    for label, s, options in runs:
        r = run_warm(zero.Config.from_preset(preset, stage=s, **options))
        mem = [p.memory for p in r.per_rank]
        rows.append({"label": label, "stage": s, "buckets": bool(options),
                     "measured": [m["measured_peak"] for m in mem],
                     "states": [sum(m[c] for c in CATEGORIES) for m in mem],
                     "buffers": [m["buffers"] for m in mem], "activations": [m["activations"] for m in mem],
                     "formula": r["formula"]["total"], "whole_gradient": sum(r["layer_bytes"]),
                     "method": mem[0]["measured_method"]})
    cfg = zero.Config.from_preset(preset)
    psi, n = zero.param_count(cfg), cfg.world_size
    display(plots.memory.measured_vs_inventory(
        rows, f"{psi / 1e6:.1f}M parameters, {cfg.depth + 1} layers, {n} ranks, fp32 Adam: peak allocated "
              "per rank (measured), what it lists (inventory), Rajbhandari et al. (2020) (model)"))
    print(f"measured by: {rows[0]['method']}\nMB; measured: per rank; inventory: model states, transient "
          "buffers, activations;\nnot listed: at least measured − inventory")
    mb = lambda b: f"{b / 1e6:,.1f}"
    print(f"{'run':<17} {'measured':>15} {'states':>7} {'buffers':>7} {'activ.':>7} {'not listed':>10} "
          f"{'formula':>7}")
    for row in rows:
        listed = [s + b + a for s, b, a in zip(row["states"], row["buffers"], row["activations"])]
        unlisted = min(m - x for m, x in zip(row["measured"], listed))
        print(f"{row['label']:<17} {', '.join(map(mb, row['measured'])):>15} {mb(max(row['states'])):>7} "
              f"{mb(max(row['buffers'])):>7} {mb(max(row['activations'])):>7} {mb(unlisted):>10} "
              f"{mb(row['formula']):>7}")
    return {"rows": rows, "world_size": n, "param_count": psi}
