"""What notebooks/09_fp8.ipynb calls: each function runs one section's measurement (on a warm
cluster where ranks are involved), prints it, draws it and returns the data the notebook asserts
on. The algorithms are in :mod:`lesson_lib.milestones.fp8`; no presets here.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from IPython.display import display

from .. import plots
from ..milestones.fp8 import allgather, errors, formats, tolerances, train
from ..runtime import warm_cluster
from .ch09_scale import at_scale  # noqa: F401  (the notebook calls it here)


def formats_table() -> list[dict]:
    """§1: range and precision of the five formats, and the two FP8 grids drawn."""
    rows = formats.table()
    print(
        f"{'format':<6}{'exp':>4}{'man':>4}{'largest':>12}{'smallest normal':>17}{'smallest subnormal':>20}"
        f"{'eps':>10}{'binades':>9}"
    )
    for r in rows:
        print(
            f"{r['format']:<6}{r['exponent_bits']:>4}{r['mantissa_bits']:>4}{r['max']:>12.4g}"
            f"{r['smallest_normal']:>17.4g}{r['smallest_subnormal']:>20.4g}"
            f"{r['eps']:>10.3g}{r['binades']:>9.1f}"
        )
    print(
        "eps: the step from 1 to the next value (2^-mantissa bits); binades: powers of two from the "
        "smallest subnormal to the largest value"
    )
    display(plots.fp8.grids({name: formats.grid(name) for name in ("e4m3", "e5m2")}))
    return rows


def format_choice(seed: int = 0) -> list[dict]:
    """§1: each FP8 format's mean elementwise error on an activation-like tensor and on a tensor built
    to span 24 binades (more than e4m3's range)."""
    return _print_formats(errors.format_choice(seed), f"synthetic tensors, seed {seed}")


def _print_formats(rows: list[dict], what: str) -> list[dict]:
    print(f"mean |x̂ − x| / |x| after a per-tensor scaled cast ({what})\n"
          f"{'tensor':<34}{'span (binades)':>15}{'e4m3':>8}{'e5m2':>8}")
    for r in rows:
        print(f"{r['tensor']:<34}{r['span']:>15.1f}{r['e4m3']:>8.3f}{r['e5m2']:>8.3f}")
    return rows


def gradient_formats(outs: list[dict]) -> list[dict]:
    """§3: both formats' errors on the output-gradients each rank's FP8Matmul cast in the run."""
    tensors = {f"rank {r}, layer {i}, step {s}": g for r, o in enumerate(outs)
               for s, gs in o["output_grads"].items() for i, g in enumerate(gs)}
    return _print_formats(errors.format_errors(tensors), "this run's output-gradients, cast in the backward")


def recipes(seed: int = 0) -> dict:
    """§2: each recipe's matmul error on activations with outliers; no scaling's overflow and
    underflow; the outlier sweep drawn."""
    case = errors.outlier_case(seed)
    rows = errors.matmul_errors(case)
    print(
        f"a [128×256] with {case['outliers']} outliers ×200, w [128×256] ~ N(0, 0.02²), seed {seed}: "
        "mean relative error per row of a @ wᵀ against fp32"
    )
    for r in rows:
        print(f"  {r['recipe']:<30}{r['error']:>8.4f}")
    demo = errors.no_scaling_demo(seed)
    print(
        f"\n{'cast without a scale':<20}{'over max':>9}{'→ inf':>7}{'→ 0':>7}"
        f"{'error':>8}{'scaled error':>14}"
    )
    for r in demo:
        print(
            f"{r['tensor']:<20}{r['over']:>9.2%}{r['inf']:>7}{r['under']:>7.0%}{r['error']:>8.3f}"
            f"{r['scaled_error']:>14.3f}"
        )
    sweep = errors.outlier_sweep(seed=seed)
    names = list(dict.fromkeys(x["recipe"] for x in sweep))
    print(f"\nthe same matmul as the outliers grow (the figure below):\n{'outliers ×':>12}"
          + "".join(f"{n.split(' (')[0]:>13}" for n in names))
    for size in dict.fromkeys(x["outlier"] for x in sweep):
        err = {x["recipe"]: x["error"] for x in sweep if x["outlier"] == size}
        print(f"{size:>12,.0f}" + "".join(f"{err[n]:>13.4f}" for n in names))
    display(plots.fp8.outlier_sweep(sweep))
    return {"rows": {r["recipe"]: r["error"] for r in rows}, "no_scaling": demo, "sweep": sweep}


def training(world_size: int = 2, cfg: train.Config | None = None) -> dict:
    """§3: the same MLP, data and seeds in fp32, bf16 and FP8 on ``world_size`` ranks, each against
    one process; then with gradients 1,024× smaller, FP8 with and without scaling."""
    cfg = (cfg or train.Config.tiny()).check(world_size)
    small = replace(cfg, loss_divisor=1024.0)
    runs, rows, grads = {}, [], None
    for c, precision in (
        (cfg, "fp32"),
        (cfg, "bf16"),
        (cfg, "fp8"),
        (small, "fp8"),
        (small, "fp8 unscaled"),
        (small, "fp32"),
    ):
        capture = (0, c.steps - 1) if (c, precision) == (cfg, "fp8") else ()  # what the backward casts
        outs = warm_cluster(world_size).run(train.train_job, replace(c, capture_steps=capture), precision)
        grads = outs if capture else grads
        ref = train.reference(c, precision, world_size)
        label = precision + (", loss ÷ 1024" if c.loss_divisor != 1 else "")
        runs[label] = outs[0]["losses"]
        rows.append(
            {
                "label": label,
                "losses": outs[0]["losses"],
                "dp_gap": max(abs(a - b) for o in outs for a, b in zip(o["losses"], ref["losses"])),
                "dp_tolerance": tolerances.data_parallel(ref["losses"], world_size),
                "zero_grads": outs[0]["zero_grad_share"],
            }
        )
    fp32 = runs["fp32"]
    for r in rows:
        base = runs["fp32, loss ÷ 1024"] if "÷" in r["label"] else fp32
        r["gap"] = max(abs(a - b) for a, b in zip(r["losses"], base))
    tol = {
        "bf16": tolerances.loss_gap(fp32, torch.bfloat16),
        "fp8": tolerances.loss_gap(fp32, torch.float8_e4m3fn),
    }
    print(
        f"{cfg.steps} steps of SGD, {world_size} ranks × {cfg.batch // world_size} samples, "
        f"seed {cfg.seed}\n"
        f"{'run':<26}{'final loss':>11}{'gap to fp32':>12}{'ranks vs 1 process':>19}{'zero grads':>11}"
    )
    for r in rows:
        print(
            f"{r['label']:<26}{r['losses'][-1]:>11.4f}{r['gap']:>12.4f}{r['dp_gap']:>19.1e}"
            f"{r['zero_grads']:>11.0%}"
        )
    print(f"allowed gap to fp32 (u·max loss): bf16 {tol['bf16']:.4f}, fp8 {tol['fp8']:.4f}")
    display(
        plots.fp8.losses(
            runs, "The same MLP, data and seeds: FP8 follows fp32; without scaling, small gradients vanish"
        )
    )
    print()
    return {"rows": {r["label"]: r for r in rows}, "tolerance": tol, "gradients": gradient_formats(grads)}


def all_gather(world_sizes=(2, 4), seed: int = 0) -> list[dict]:
    """§4: the MLP's weights sharded, gathered in FP8 with their scales, against the unsharded FP8
    model; bytes against bf16 and the formula."""
    g = torch.Generator().manual_seed(seed)
    weights = [0.1 * torch.randn(64, 32, generator=g), 0.1 * torch.randn(32, 64, generator=g)]
    x = torch.randn(16, 32, generator=g)
    ref = allgather.unsharded_forward(weights, x)
    rows = []
    for n in world_sizes:
        outs = warm_cluster(n).run(allgather.sharded_forward_job, weights, x)
        sent = outs[0]["sent"]
        rows.append(
            {
                "ranks": n,
                "equal": all(torch.equal(o["y"], ref) for o in outs),
                "fp8": sent["fp8_all_gather"] + sent["fp8_amax_gather"],
                "bf16": sent["bf16_all_gather"],
                "fp8_formula": sum(allgather.gather_bytes(w.numel(), n, "fp8") for w in weights),
                "bf16_formula": sum(allgather.gather_bytes(w.numel(), n, "bf16") for w in weights),
            }
        )
    print(
        f"{'N':>2}{'bit-equal to unsharded':>24}{'FP8 + scales (formula)':>25}"
        f"{'bf16 (formula)':>17}{'ratio':>7}"
    )
    for r in rows:
        print(
            f"{r['ranks']:>2}{str(r['equal']):>24}{r['fp8']:>14,} ({r['fp8_formula']:,}){r['bf16']:>8,} "
            f"({r['bf16_formula']:,}){r['fp8'] / r['bf16']:>7.3f}"
        )
    return rows


def recipe_calculator(seed: int = 0):
    """§2 as a control: a scaling recipe and the outliers' size → that matmul's error against fp32,
    computed in real FP8 (``_scaled_mm``) on the same tensors as §2, beside bf16's."""
    import ipywidgets as W

    recipe = W.Dropdown(options=list(errors.RECIPES), value="per tensor", description="recipe")
    size = W.Dropdown(options=[1, 10, 100, 1_000, 10_000, 100_000, 1_000_000], value=100,
                      description="outliers ×")
    out = W.HTML()

    def update(*_):
        case = errors.outlier_case(seed, outlier=float(size.value))
        ref = case["a"] @ case["w"].t()
        y = errors.recipe_product(case["a"], case["w"], recipe.value, case["history"])
        got = errors.row_error(y, ref)
        bf16 = errors.row_error(case["a"].bfloat16() @ case["w"].bfloat16().t(), ref)
        out.value = (f"{recipe.value}, outliers ×{size.value:,}: mean relative error per row "
                     f"<b>{got:.4f}</b> against fp32 (bf16: {bf16:.4f}), seed {seed}")

    recipe.observe(update, "value")
    size.observe(update, "value")
    update()
    return W.VBox([recipe, size, out])
