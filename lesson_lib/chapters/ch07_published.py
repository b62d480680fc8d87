"""Chapter 7's step model against the published runs (notebooks/07_impact.ipynb, §1).

One efficiency, :data:`~lesson_lib.costmodel.CALIBRATED_EFFICIENCY`, fitted once on SC21 Table 1
(in-sample, ``data/sc21_table1.csv``); every ``out-of-sample`` run of ``data/published.csv`` predicted
from its paper's own layout (:func:`~lesson_lib.costmodel.calibrate.compare`); ``sanity-check`` rows
(a layout assumed) shown apart. :func:`every_run` draws predicted against published and measures the
spread; :func:`published_check` is the chapter's first look, a few named runs in TFLOP/s and days.
"""

from __future__ import annotations

import plotly.graph_objects as go
from IPython.display import display

from .. import costmodel
from ..costmodel import calibrate

GOAL = 0.15  # the goal for a held-out run: within ±15 % of its published number
GROUPS = {"in-sample": ("circle", "#4C78A8"), "out-of-sample": ("diamond", "#E45756"),
          "sanity-check": ("x-open", "#72B7B2")}


def _in_sample_rows() -> list[dict]:
    """SC21 Table 1's rows at the stored efficiency (TFLOP/s per GPU, hardware FLOPs as SC21 reports)."""
    rows = []
    for r in calibrate.in_sample():
        rate = costmodel.estimate(calibrate.in_sample_plan(r, costmodel.CALIBRATED_EFFICIENCY))
        rows.append({"case": f"sc21-{r['params'] / 1e9:g}b", "use": "in-sample", "unit": "TFLOP/s (hardware)",
                     "published": r["achieved_tflops_per_device"], "predicted": rate["tflops_per_device"],
                     "error": rate["tflops_per_device"] / r["achieved_tflops_per_device"] - 1,
                     "layout": f"t={int(r['tensor'])} p={int(r['pipeline'])} n={int(r['devices']):,}"})
    return rows


def every_run() -> dict:
    """Every run: SC21 Table 1 (in-sample), then each held-out and sanity-check row of the file, in
    the unit its paper gives (seconds per iteration, else TFLOP/s per GPU, else tokens/s per GPU). The
    file's ``calibration`` row is SC21 Table 1's last row again, so it is not drawn twice. Draws the
    figure, prints each error and the spread per group; returns {"rows", "spread"}."""
    rows = _in_sample_rows()
    for r in calibrate.compare_all():
        if r["use"] in ("out-of-sample", "sanity-check"):
            plan = r["estimate"]["plan"]
            rows.append({**{k: r[k] for k in ("case", "use", "unit", "published", "predicted", "error")},
                         "layout": f"t={plan.tensor} p={plan.pipeline} v={plan.chunks} n={plan.devices:,}"})
    spread = {}
    for use in GROUPS:
        errs = [r["error"] for r in rows if r["use"] == use]
        spread[use] = {"runs": len(errs), "min": min(errs), "max": max(errs),
                       "within_goal": sum(abs(e) <= GOAL for e in errs)}
    display(_figure(rows))
    print(f"{'run':<27} {'use':<14} {'layout':<24} {'unit':<19} {'paper':>7} {'model':>7} {'error':>7}")
    for r in rows:
        flag = "" if abs(r["error"]) <= GOAL or r["use"] != "out-of-sample" else "  outside ±15 %"
        print(f"{r['case']:<27} {r['use']:<14} {r['layout']:<24} {r['unit']:<19} {r['published']:>7.4g} "
              f"{r['predicted']:>7.4g} {r['error']:>+7.1%}{flag}")
    print()
    for use, s in spread.items():
        print(f"{use}: {s['runs']} runs, errors {s['min']:+.1%} to {s['max']:+.1%}, "
              f"{s['within_goal']} of {s['runs']} within ±15 %")
    return {"rows": rows, "spread": spread}


def _figure(rows: list[dict]) -> go.Figure:
    fig = go.Figure()
    lo = min(min(r["published"], r["predicted"]) for r in rows) / 1.5
    hi = max(max(r["published"], r["predicted"]) for r in rows) * 1.5
    for scale, dash, name in ((1, "solid", "predicted = published"), (1 + GOAL, "dash", "±15 %"),
                              (1 - GOAL, "dash", None), (1.25, "dot", "±25 %"), (0.75, "dot", None)):
        fig.add_scatter(x=[lo, hi], y=[lo * scale, hi * scale], mode="lines", name=name or "",
                        showlegend=name is not None, hoverinfo="skip",
                        line={"color": "#888", "dash": dash, "width": 1})
    for use, (symbol, color) in GROUPS.items():
        mine = [r for r in rows if r["use"] == use]
        fig.add_scatter(x=[r["published"] for r in mine], y=[r["predicted"] for r in mine], mode="markers",
                        name={"in-sample": "in-sample (SC21 Table 1: the fit)", "out-of-sample": "held out",
                              "sanity-check": "sanity check (layout assumed)"}[use],
                        marker={"symbol": symbol, "color": color, "size": 10},
                        text=[f"{r['case']} ({r['unit']}): {r['error']:+.1%}" for r in mine],
                        hovertemplate="%{text}<extra></extra>")
    title = ("The step model against every published run: predicted vs the paper's number, each in "
             "its paper's unit<br><sup>s per iteration, TFLOP/s per GPU or tokens/s per GPU; log axes; "
             f"efficiency {costmodel.CALIBRATED_EFFICIENCY:g} fitted on SC21 Table 1 alone</sup>")
    fig.update_layout(height=480, title=title, xaxis={"type": "log", "title": "published"},
                      yaxis={"type": "log", "title": "predicted"},
                      legend={"orientation": "h", "y": -0.2}, margin={"t": 90})
    return fig


# The runs chapter 7's text names first, in TFLOP/s and days; every_run() gives every run of the file.
CHAPTER_RUNS = ("gpt3-175b", "gpt-1t", "mt-nlg-530b", "llama-65b")


def published_check(cases=CHAPTER_RUNS) -> list[dict]:
    """The step model against published runs (data/published.csv), each with its use: in the
    calibration set, held out (the paper's layout), or a sanity check (a layout assumed). Per GPU:
    TFLOP/s where the paper gives it, else tokens/s; then days, or seconds per step where the paper
    gives no end-to-end days. Prints the table."""
    rows = []
    for case in cases:
        p = costmodel.published()[case]
        e = costmodel.estimate(costmodel.published_plan(case))
        if p["achieved_tflops_per_device"] != "":
            paper, model, unit = p["achieved_tflops_per_device"], e["tflops_per_device"], "TFLOP/s"
        else:
            paper, model, unit = p["tokens_per_s_per_device"], e["plan"].batch_tokens / e["step_s"] / \
                e["plan"].devices, "tokens/s"
        if p["published_days"] != "":
            time_unit, published, modelled = "days", p["published_days"], e["days"]
        else:
            time_unit, published, modelled = "s/step", p["published_step_s"], e["step_s"]
        rows.append({"case": case, "use": p["use"], "estimate": e, "unit": unit, "published_rate": paper,
                     "modelled_rate": model, "rate_error": model / paper - 1, "time_unit": time_unit,
                     "published_time": published, "modelled_time": modelled,
                     "time_error": modelled / published - 1})
    print(f"{'case':<12} {'use':<14} {'per GPU: paper':>16} {'model':>7} {'error':>6}  layout, dominant term")
    for r in rows:
        e = r["estimate"]
        print(f"{r['case']:<12} {r['use']:<14} {r['published_rate']:>7g} {r['unit']:<8} "
              f"{r['modelled_rate']:>7.0f} {r['rate_error']:>+6.0%}  "
              f"t={e['plan'].tensor} p={e['plan'].pipeline}{' sp' if e['plan'].sequence_parallel else ''}, "
              f"{e['dominant']}")
    print(f"\n{'case':<12} {'time: paper':>19} {'model':>6} {'error':>6}")
    for r in rows:
        print(f"{r['case']:<12} {r['published_time']:>12g} {r['time_unit']:<6} {r['modelled_time']:>6.1f} "
              f"{r['time_error']:>+6.0%}")
    return rows

