"""One calibration, stated, and everything else held out (chapter 7).

The step model has one number that is not a datasheet's or a paper's: the share of peak FLOP/s the
matmuls reach. :func:`fit_efficiency` fits it once on the **in-sample set**, every row of Narayanan et
al. (SC21) Table 1 (``data/sc21_table1.csv``), and the result is
:data:`~.terms.CALIBRATED_EFFICIENCY`. Every ``out-of-sample`` row of ``data/published.csv`` is then
predicted from its paper's own layout (:func:`compare`) and never enters the fit.
"""

from __future__ import annotations

import math

from ..data import read_csv
from .plan import Plan, published_plan
from .planner import estimate
from .terms import devices, published

# What the in-sample rows share (SC21 §5.1): GPT models with V = 51,200 and sequences of 2,048 on
# DGX A100 (80 GB) with 8 HDR ports, full recomputation. Not reported per row, and assumed here:
# micro-batches of 1, no interleaving (v = 1), gradients all-reduced after the backward (no overlap).
SC21 = dict(device="a100-80gb", link="ib-hdr", intra_link="nvlink3", seq_len=2048, vocab=51200,
            recompute="full", attention_flops=True, micro_batch=1, chunks=1, overlap=0.0)


def in_sample() -> list[dict]:
    """SC21 Table 1, one dict per row (params, shape, t, p, devices, batch, TFLOP/s per GPU)."""
    return [{k: float(v) for k, v in r.items()} for r in read_csv("sc21_table1.csv")]


def in_sample_plan(row: dict, efficiency: float) -> Plan:
    """The Plan of one SC21 Table 1 row at ``efficiency``, modelled for one step."""
    batch = row["global_batch"] * SC21["seq_len"]
    return Plan(row["params"], batch, int(row["devices"]), tensor=int(row["tensor"]),
                pipeline=int(row["pipeline"]), batch_tokens=batch, layers=int(row["layers"]),
                hidden=int(row["hidden"]), heads=int(row["heads"]), efficiency=efficiency, **SC21)


def fit_efficiency(rows: list[dict] | None = None, lo: float = 0.2, hi: float = 1.0) -> dict:
    """The efficiency that minimises the squared log error of the modelled TFLOP/s per GPU (hardware
    FLOPs, SC21 Eq. 3's basis, as the paper reports) over ``rows`` (default: the in-sample set).
    Golden-section search to 1e-6; returns the efficiency and each row's modelled rate and error."""
    rows = in_sample() if rows is None else rows

    def loss(eff: float) -> float:
        return sum(math.log(estimate(in_sample_plan(r, eff))["tflops_per_device"]
                            / r["achieved_tflops_per_device"]) ** 2 for r in rows)

    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    while b - a > 1e-6:
        c, d = b - g * (b - a), a + g * (b - a)
        a, b = (a, d) if loss(c) < loss(d) else (c, b)
    eff = (a + b) / 2
    fitted = []
    for r in rows:
        rate = estimate(in_sample_plan(r, eff))["tflops_per_device"]
        fitted.append({**r, "modelled_tflops": rate, "error": rate / r["achieved_tflops_per_device"] - 1})
    return {"efficiency": eff, "rows": fitted}


def compare(case: str, **options) -> dict:
    """A published run's prediction beside its paper's number, in the unit the paper gives: seconds
    per iteration where it prints them, else TFLOP/s per GPU (on the row's ``rate_basis``: hardware
    FLOPs, or model FLOPs for an MFU), else tokens/s per GPU. ``band``: the same with the
    tensor-parallel traffic all exposed and all hidden (the model's own uncertainty)."""
    p = published()[case]
    plan = published_plan(case, **options)
    e = estimate(plan)
    peak = devices()[plan.device]["peak_flops"]

    def rate(step_s: float) -> tuple[str, float, float]:
        terms = e["terms"]
        if p.get("published_step_s", "") != "":
            return "s/step", p["published_step_s"], step_s
        if p["achieved_tflops_per_device"] != "":
            key = "model_flops" if p.get("rate_basis") == "model" else "hardware_flops"
            basis = "TFLOP/s (model)" if key == "model_flops" else "TFLOP/s (hardware)"
            return basis, p["achieved_tflops_per_device"], terms[key] / step_s / plan.devices / 1e12
        return "tokens/s", p["tokens_per_s_per_device"], plan.batch_tokens / step_s / plan.devices

    unit, paper, model = rate(e["step_s"])
    band = sorted(rate(e["tp_band"][k])[2] for k in ("exposed", "hidden"))
    return {"case": case, "use": p["use"], "unit": unit, "published": paper, "predicted": model,
            "error": model / paper - 1, "band": band, "estimate": e,
            "mfu": e["mfu"], "hfu": e["hfu"], "published_mfu": (p["achieved_tflops_per_device"] * 1e12 / peak
                                                                if p.get("rate_basis") == "model" else None),
            "source": p["source"]}


def compare_all(use: str | None = None) -> list[dict]:
    """:func:`compare` for every published run (or those of one ``use``), in the file's order."""
    return [compare(c) for c, p in published().items() if use is None or p["use"] == use]


def comparison_table(rows: list[dict]) -> str:
    """The comparisons as text: run, use, unit, paper, model, error, band, MFU and HFU."""
    lines = [f"{'run':<26} {'use':<13} {'unit':<19} {'paper':>7} {'model':>7} {'error':>6} "
             f"{'tp band':>15} {'MFU':>4} {'HFU':>4}"]
    for r in rows:
        lines.append(f"{r['case']:<26} {r['use']:<13} {r['unit']:<19} {r['published']:>7.4g} "
                     f"{r['predicted']:>7.4g} {r['error']:>+6.1%} "
                     f"{r['band'][0]:>7.4g}–{r['band'][1]:<7.4g} {r['mfu']:>4.0%} {r['hfu']:>4.0%}")
    return "\n".join(lines)


def _in_sample_parts(rows: list[dict]) -> list[tuple]:
    """Per in-sample row: (compute + bubble at efficiency 1, the rest of the step, hardware FLOPs per
    device, the paper's TFLOP/s, the GEMM intensity x, the device's ridge R). SC21's plans hide nothing,
    so the step is (compute + bubble)/e + rest exactly."""
    from .gemm import plan_intensity, ridge

    parts = []
    for r in rows:
        plan = in_sample_plan(r, 1.0)
        t = estimate(plan)["terms"]
        scaled = t["compute"] + t["bubble"]
        parts.append((scaled, t["step"] - scaled, t["hardware_flops"] / plan.devices / 1e12,
                      r["achieved_tflops_per_device"], plan_intensity(plan), ridge(devices()[plan.device])))
    return parts


def fit_gemm_efficiency(rows: list[dict] | None = None) -> dict:
    """E and k of e(x) = E·x/(x + k·R) (:mod:`.gemm`) that minimise the squared log error of the modelled
    TFLOP/s per GPU over ``rows`` (default: the in-sample set, SC21 Table 1): a grid, then nested
    golden-section searches to 1e-5. Returns E, k, the loss, the constant fit's loss for comparison,
    and each row's x, efficiency and error."""
    rows = in_sample() if rows is None else rows
    parts = _in_sample_parts(rows)

    def modelled(e_max: float, k: float) -> list[float]:
        return [flops / (scaled / (e_max * x / (x + k * r)) + rest)
                for scaled, rest, flops, _, x, r in parts]

    def loss(e_max: float, k: float) -> float:
        return sum(math.log(m / p[3]) ** 2 for m, p in zip(modelled(e_max, k), parts))

    g = (math.sqrt(5) - 1) / 2

    def golden(f, a: float, b: float) -> float:
        while b - a > 1e-5:
            c, d = b - g * (b - a), a + g * (b - a)
            a, b = (a, d) if f(c) < f(d) else (c, b)
        return (a + b) / 2

    best_k = lambda e_max: golden(lambda k: loss(e_max, k), 0.0, 10.0)
    e_max = golden(lambda e: loss(e, best_k(e)), 0.3, 1.5)
    k = best_k(e_max)
    constant = min(loss(e / 1000, 0.0) for e in range(300, 1001))
    out = []
    for r, m, p in zip(rows, modelled(e_max, k), parts):
        out.append({**r, "intensity": p[4], "efficiency": e_max * p[4] / (p[4] + k * p[5]),
                    "modelled_tflops": m, "error": m / p[3] - 1})
    return {"e_max": e_max, "k": k, "loss": loss(e_max, k), "constant_loss": constant, "rows": out}
