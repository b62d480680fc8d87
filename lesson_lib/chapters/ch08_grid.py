"""Chapter 8 §5: the whole grid — data × pipeline × tensor parallelism on 8 ranks, equal to one
process, each group's counted bytes beside the cost model's terms — and the exercise that picks a
layout for a memory budget with those terms, then runs it."""

from __future__ import annotations

import dataclasses

from IPython.display import display

from .. import plots
from ..exercises import Exercise, Verdict, values_of, whole_number
from ..milestones.tensor_parallel import formulas, layout_search, three_d, train
from ..milestones.tensor_parallel.grid import Layout
from ..milestones.tensor_parallel.model import Config
from ..milestones.tensor_parallel.results import GROUPS, GridRankResult, equality
from ..runtime import warm_cluster


def counted(outs: list[dict | GridRankResult], steps: int) -> dict[str, float]:
    """Per group, the busiest rank's bytes sent per step, as the ranks counted them."""
    ranks = [GridRankResult.of(o, steps) for o in outs]
    return {g: max(r.bytes_per_group[g] for r in ranks) for g in (*GROUPS, "unmodelled")}


def run_layout(cfg: Config, layout: Layout, micro: int, ref: dict | None = None) -> dict:
    """``layout`` on its ranks: equality with one process, bytes per group and memory per rank."""
    three_d.check(cfg, layout, micro)  # before any rank starts
    outs = warm_cluster(layout.world_size).run(three_d.train_3d_job, cfg, layout, micro)
    ranks = [GridRankResult.of(o, cfg.steps) for o in outs]
    row = {"layout": layout, "counted": counted(ranks, cfg.steps),
           "formula": formulas.step_bytes(cfg, layout.dp, layout.pp, layout.tp, micro,
                                          layout.sequence_parallel),
           "params": [r.param_numel for r in ranks], "peak": [r.peak for r in ranks],
           "param_formula": [formulas.stage_params(cfg, layout.tp, layout.pp, r.pp_index) for r in ranks]}
    if ref is not None:
        row.update(equality(cfg, outs, ref))  # gap, loss_gap, tolerance, loss_tolerance, equal
    return row


def grid_3d(layouts=((2, 2, 2, False), (2, 2, 2, True)), cfg: Config | None = None, micro: int = 2) -> dict:
    """§5: (dp, pp, tp, sequence parallel) layouts on real ranks against one process."""
    cfg = cfg or Config.tiny()
    chosen = [Layout(dp=d, pp=p, tp=t, sequence_parallel=sp) for d, p, t, sp in layouts]
    for layout in chosen:
        three_d.check(cfg, layout, micro)  # every layout checked before any rank starts
    ref = train.reference(cfg)
    rows, bars = [], []
    for layout in chosen:
        row = run_layout(cfg, layout, micro, ref)
        rows.append(row)
        name = f"dp {layout.dp} × pp {layout.pp} × tp {layout.tp}" + (" + SP" * layout.sequence_parallel)
        bars += [{"label": f"{name}: {g}", "counted": row["counted"][g], "formula": row["formula"][g]}
                 for g in GROUPS]
        print(f"{name} on {layout.world_size} ranks, GPipe over {micro} micro-batches\n"
              f"  equal to one process: {row['equal']} (parameters {row['gap']:.1e}, "
              f"allowed {row['tolerance']:.1e})\n"
              "  bytes per step from each group's busiest rank, counted (cost model):\n    "
              + ", ".join(f"{g} {row['counted'][g]:,.0f} ({row['formula'][g]:,.0f})" for g in GROUPS)
              + (f"\n  not in the cost model: {row['counted']['unmodelled']:,.0f}"
                 if row["counted"]["unmodelled"] else ""))
        whole = sum(t.numel() for t in ref["params"].values())
        print(f"  parameters per rank {sorted(set(row['params']))} (formula "
              f"{sorted(set(row['param_formula']))}, one process {whole:,})\n"
              f"  training's measured peak per rank "
              f"{min(row['peak']) / 1e3:,.0f}–{max(row['peak']) / 1e3:,.0f} kB")
    display(plots.parallelism.bytes_vs_formula(
        bars, "Bytes per step from each group's busiest rank: counted (bars) and the cost model (markers)"))
    return {"rows": rows, "cfg": cfg}


# --------------------------------------------------------------------------- the layout exercise
LAYOUT_CASE = {"world": 8, "layers": 4, "budget": 15_000, "micro": 2,
               # the time is judged at GPT-3's width (Brown et al., 2020), on A100s (data/devices.csv)
               "wide": {"d_model": 12_288, "heads": 96, "ffn": 4 * 12_288, "seq": 2_048, "vocab": 51_200}}


def case_cfg() -> Config:
    """The exercise's model, as it runs on the ranks."""
    return Config.tiny(layers=LAYOUT_CASE["layers"], steps=1)


def wide_cfg() -> Config:
    """The same blocks at GPT-3's width: what the exercise's step time is judged on."""
    return dataclasses.replace(case_cfg(), **LAYOUT_CASE["wide"])


def feasible(cfg: Config, world: int, budget: int, micro: int) -> dict[tuple[int, int, int], dict]:
    """The exercise's options (:func:`~lesson_lib.milestones.tensor_parallel.layout_search.feasible`):
    bytes for ``cfg`` as it runs, time at GPT-3's width."""
    return layout_search.feasible(cfg, world, budget, micro, timed=wide_cfg())


def best_layout() -> tuple[int, int, int]:
    c = LAYOUT_CASE
    return layout_search.fastest(feasible(case_cfg(), c["world"], c["budget"], c["micro"]))


def _time(t: dict) -> str:
    return (f"{t['step'] * 1e3:,.0f} ms: compute {t['compute'] * 1e3:,.0f} ms with the bubble "
            f"idling {t['bubble']:.0%}, tp {t['tp'] * 1e3:,.1f}, pp {t['pp'] * 1e3:,.1f}, "
            f"dp {t['dp'] * 1e3:,.1f} exposed")


def _check_layout(answer) -> Verdict:
    c, cfg = LAYOUT_CASE, case_cfg()
    what = "three whole numbers (dp, pp, tp)"
    if isinstance(answer, Layout):
        answer = (answer.dp, answer.pp, answer.tp)
    # any form the course reads (exercises/answers.py): a tuple or list, "2,2,2", {"dp": 2, ...}
    dp, pp, tp = (whole_number(v, what) for v in values_of(answer, 3, what, names=(
        ("dp", "data", "data_parallel"), ("pp", "pipeline", "pipeline_parallel"),
        ("tp", "tensor", "tensor_parallel"))))
    try:
        layout = Layout(dp=dp, pp=pp, tp=tp).check(c["world"], cfg)
        three_d.check(cfg, layout, c["micro"])
    except ValueError as e:
        return Verdict(False, f"that layout cannot run: {e}")
    row = run_layout(cfg, layout, c["micro"])
    held = max(row["params"])
    if held > c["budget"]:
        return Verdict(False, f"measured on the ranks: a rank of dp {dp} × pp {pp} × tp {tp} holds {held:,} "
                              f"parameters, over the budget of {c['budget']:,}. Which axes cut the model?")
    sent = sum(row["counted"][g] for g in GROUPS)
    options = feasible(cfg, c["world"], c["budget"], c["micro"])
    mine, best = options[dp, pp, tp], best_layout()
    fewest = layout_search.fewest_bytes(options)
    by = ", ".join(f"{g} {row['counted'][g]:,.0f}" for g in GROUPS)
    measured = f"measured on the ranks: {held:,} parameters per rank, {sent:,.0f} bytes per step ({by})"
    if mine["time"]["step"] > options[best]["time"]["step"] * (1 + 1e-9):
        hint = (" It sends the fewest bytes, but bytes are not time: what does a pipeline of "
                f"{pp} stages over {c['micro']} micro-batches leave idle?") if (dp, pp, tp) == fewest else \
               " Set its terms beside those of the other layouts that fit: which one is larger here?"
        return Verdict(False, f"it fits; {measured}. At GPT-3's width one step takes {_time(mine['time'])}; "
                              f"another layout that fits is faster.{hint}")
    here = {k: formulas.step_time(cfg, *k, c["micro"])["step"] for k in options}
    return Verdict(True, f"{measured}; at GPT-3's width one step takes {_time(mine['time'])}, the fastest of "
                         f"the layouts that fit. At this chapter's width (d = {cfg.d_model}) the same model "
                         f"picks {min(here, key=here.get)}: there the messages' latency, not the bubble, "
                         "decides (chapter 7).")


def layout_exercise() -> Exercise:
    c = LAYOUT_CASE
    best = best_layout()
    options = feasible(case_cfg(), c["world"], c["budget"], c["micro"])
    w = c["wide"]
    return Exercise(
        key="layout", title="pick a layout with the cost model, then run it",
        prompt=f"The chapter's transformer with {c['layers']} blocks (<code>Config.tiny(layers="
               f"{c['layers']})</code>) on {c['world']} ranks, GPipe over {c['micro']} micro-batches. Each "
               f"rank may hold at most {c['budget']:,} parameters. Which (dp, pp, tp) fits, and takes the "
               f"shortest step when the same {c['layers']} blocks are GPT-3-wide (d = {w['d_model']:,}, "
               f"{w['heads']} heads, sequence {w['seq']:,}) on A100s, tp inside a node (NVLink), pp and dp "
               "between nodes (InfiniBand)? Use <code>formulas.stage_params</code> for the memory and "
               "<code>formulas.step_time(wide, dp, pp, tp, micro)</code> for the time, with "
               "<code>cfg, wide = ch08_grid.case_cfg(), ch08_grid.wide_cfg()</code>; the check runs your "
               "layout on the ranks, measures its memory and bytes, and times it with the same model. "
               "Answer <code>(dp, pp, tp)</code> (a tuple, a list, <code>\"2,2,2\"</code> or a dict "
               "keyed dp, pp, tp).",
        check=_check_layout,
        hint="Enumerate dp·pp·tp = 8 with layers % pp == 0, heads % tp == 0 and the batch divisible; keep "
             "those whose largest stage fits; compare step_time(...)['step']. Which term is largest?",
        solution=f"{best}: " + "; ".join(f"{k} {v['time']['step'] * 1e3:,.0f} ms ({v['total']:,.0f} bytes "
                                         "here)" for k, v in sorted(options.items()))
                 + f" among the layouts that fit {c['budget']:,} parameters per rank. The one that sends the "
                   "fewest bytes runs 4 stages over 2 micro-batches and idles 60 % of its step.",
        reference=lambda: best)
