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
from ..exercises import Exercise, Verdict
from ..experiments import Result, run
from ..milestones import zero
from ..runtime import warm_cluster

# A 150k-parameter MLP, 8 steps: a few seconds for all four stages on 2 cores.
PRESET = {"steps": 8, "global_batch": 64, "hidden": 256, "depth": 3}
CATEGORIES = ("params", "grads", "optimizer")


def _run(stage: int, world_size: int = 4, live=None, **options) -> Result:
    cfg = zero.Config(stage=stage, world_size=world_size, **{**PRESET, **options})
    on_event = live.track(f"stage {stage}", cfg.steps, world_size) if live else None
    return run("zero", cfg, cluster=warm_cluster(world_size), on_event=on_event)


def stages(world_size: int = 4, precision: str = "fp32") -> dict[int, Result]:
    """Train with stages 0–3; live loss, then measured memory per category beside the formulas."""
    live = plots.LiveRuns(f"ZeRO stages 0–3 on {world_size} ranks ({precision})")
    display(live)
    results = {s: _run(s, world_size, live, precision=precision) for s in range(4)}
    rows = [{"label": f"stage {s}", "measured": r.per_rank[0]["memory"], "formula": r["formula"]}
            for s, r in results.items()]
    display(plots.memory_vs_formula(rows, f"Memory per rank, {world_size} ranks, {precision}: "
                                          "measured (bars) vs Rajbhandari et al. (2020) (marks)"))
    return results


def memory_ratios(results: dict[int, Result]) -> dict[int, dict[str, float]]:
    """Measured / formula for each model-state category, per stage (rank 0)."""
    out = {}
    for s, r in results.items():
        m, f = r.per_rank[0]["memory"], r["formula"]
        out[s] = {c: m[c] / f[c] for c in CATEGORIES}
        out[s]["total"] = sum(m[c] for c in CATEGORIES) / f["total"]
    print("measured / formula:\n" + "\n".join(
        f"  stage {s}: " + ", ".join(f"{c} {v:.3f}" for c, v in d.items()) for s, d in out.items()))
    return out


def agreement(results: dict[int, Result]) -> dict:
    """Do all stages train the same model? Against stage 0 and (fp32) single-process Adam."""
    base = results[0]
    same = {s: r.losses == base.losses and r["final_params"] == base["final_params"]
            for s, r in results.items()}
    out = {"identical_to_stage_0": same}
    if base.config["precision"] == "fp32":
        ref = zero.reference(zero.Config(**{k: base.config[k] for k in zero.Config().task()}))
        out["max_gap_vs_single_process"] = max(abs(a - b) for r in results.values()
                                               for a, b in zip(r.losses, ref))
    print(out)
    return out


def traffic(results: dict[int, Result]) -> list[dict]:
    """Counted bytes per rank per step against the paper's 2Ψ / 3Ψ (ring, (N−1)/N each)."""
    rows = [{"label": f"stage {s}", "counted": statistics.mean(r["traffic_per_step"]),
             "formula": r["traffic_formula_padded"], "step_ms": 1e3 * r.median_step_time(),
             "busy_ms": 1e3 * max(r.median_step("busy_s"))}
            for s, r in results.items()]
    display(plots.stage_traffic(rows, note=plots.oversubscription_note(results.values())))
    print("stage 3 / stage 0 traffic: " + f"{rows[3]['counted'] / rows[0]['counted']:.3f}")
    return rows


def torch_zero(world_size: int = 4, ours: Result | None = None) -> dict:
    """torch's ZeroRedundancyOptimizer (ZeRO-1) on the same run; agreement and optimizer bytes."""
    cfg = zero.Config(stage=1, world_size=world_size, **PRESET).validate()
    outs = warm_cluster(world_size).run(zero.torch_zero_reference, cfg)
    ours = ours or _run(1, world_size)
    gap = max(abs(a - b) for a, b in zip(outs[0]["losses"], ours.losses))
    pgap = max(abs(a - b) for a, b in zip(outs[0]["params"], ours["final_params"]))
    opt = [o["optimizer_bytes"] for o in outs]
    print(f"largest loss difference from our stage 1: {gap:.2e}; parameters: {pgap:.2e}\n"
          f"optimizer state per rank (measured): torch {opt}, ours "
          f"{[p['memory']['optimizer'] for p in ours.per_rank]}")
    return {"loss_gap": gap, "param_gap": pgap, "torch_optimizer_bytes": opt,
            "our_optimizer_bytes": [p["memory"]["optimizer"] for p in ours.per_rank]}


def paper_example() -> dict[int, float]:
    """The paper's 7.5B parameters on 64 GPUs, mixed precision: GB per device for stages 0–3."""
    gb = {s: zero_memory(7.5e9, 64, s, "mixed")["total"] / 1e9 for s in range(4)}
    print("7.5B parameters, 64 GPUs: " + ", ".join(f"stage {s}: {v:.1f} GB" for s, v in gb.items()))
    return gb


def first_fitting_stage(params: float, world_size: int, device_gb: float, precision: str = "mixed"):
    """The lowest stage whose model states fit ``device_gb`` (None if none does)."""
    for s in range(4):
        if zero_memory(params, world_size, s, precision)["total"] <= device_gb * 1e9:
            return s
    return None


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
    display(plots.fits_table(rows, ["model", "parameters", "80 GB", "141 GB"], title))
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
    import ipywidgets as W

    def go(world_size, precision):
        stages(world_size, precision)

    return widgets.run_button("Run all stages", {
        "world_size": W.IntSlider(value=2, min=1, max=4, description="ranks"),
        "precision": W.ToggleButtons(options=["fp32", "mixed"], description="precision"),
    }, go)


# --------------------------------------------------------------------------- exercises


def _check_stage2(fn) -> Verdict:
    cases = [(7.5e9, 64), (1e6, 4), (3e9, 1)]
    for psi, n in cases:
        got, want = fn(psi, n), zero_memory(psi, n, 2, "mixed")["total"]
        if got is None or abs(float(got) - want) > 1e-6 * want:
            return Verdict(False, f"for Ψ={psi:g}, N={n} you gave {got}; think about which parts are "
                                  "replicated and which are split")
    return Verdict(True, "2Ψ + 14Ψ/N: fp16 parameters replicated, gradients and optimizer state sharded")


def _check_stage1_update(fn) -> Verdict:
    import torch

    g = torch.Generator().manual_seed(3)
    params, grads = torch.randn(10, generator=g), torch.randn(10, generator=g)
    n, lr = 4, 0.1
    pieces = [fn(params.clone(), grads.clone(), r, n, lr) for r in range(n)]
    if any(p is None for p in pieces):
        return Verdict(False, "your function returned None")
    full = torch.cat([torch.as_tensor(p) for p in pieces])
    want = params - lr * grads
    ok = full.shape == want.shape and torch.allclose(full, want)
    return Verdict(ok, "the ranks' shards together make the full SGD step" if ok else
                   "concatenating every rank's shard should give params - lr·grads")


def _reference_stage1():
    def stage1_update(params, grads, rank, world_size, lr):
        size = -(-params.numel() // world_size)
        lo, hi = rank * size, min((rank + 1) * size, params.numel())
        return params[lo:hi] - lr * grads[lo:hi]

    return stage1_update


def exercises() -> dict[str, Exercise]:
    return {
        "stage2": Exercise(
            "stage2", "the stage-2 formula",
            "Mixed-precision Adam keeps 2 bytes of fp16 parameters, 2 bytes of gradients and K = 12 bytes "
            "of optimizer state per parameter. Write <code>stage2(psi, n)</code>: bytes of model state per "
            "device under ZeRO stage 2 with N devices.",
            _check_stage2, "Stage 2 shards the optimizer state and the gradients; what is left whole?",
            "def stage2(psi, n):\n    return 2 * psi + (2 + 12) * psi / n",
            lambda: (lambda psi, n: 2 * psi + 14 * psi / n)),
        "stage1": Exercise(
            "stage1", "the stage-1 sharded update",
            "Every rank has the full (averaged) gradient and the full parameters, as flat tensors. Write "
            "<code>stage1_update(params, grads, rank, world_size, lr)</code> returning only this rank's "
            "slice of the parameters after one SGD step: slices of ceil(len/N) elements, in rank order "
            "(the last may be shorter). An all-gather would then give everyone the whole result.",
            _check_stage1_update, "Compute this rank's [lo, hi) first; update only that slice.",
            "def stage1_update(params, grads, rank, world_size, lr):\n"
            "    size = -(-params.numel() // world_size)\n"
            "    lo, hi = rank * size, min((rank + 1) * size, params.numel())\n"
            "    return params[lo:hi] - lr * grads[lo:hi]",
            _reference_stage1),
        "fit": Exercise(
            "fit", "when does it fit?",
            "A 13-billion-parameter model, mixed-precision Adam, 8 devices of 80 GB each. Ignoring "
            "activations: what is the first ZeRO stage (0–3) at which the model states fit one device? "
            "Predict it, then check with the calculator above.",
            lambda a: Verdict(int(a) == first_fitting_stage(13e9, 8, 80),
                              f"you said stage {int(a)}" + ("" if int(a) == first_fitting_stage(13e9, 8, 80)
                                                            else "; compute 16Ψ, 4Ψ+12Ψ/N, … in GB")),
            "Stage 0 needs 16 × 13 GB. Stage 1 keeps 4Ψ whole and splits 12Ψ over 8.",
            "Stage 1: 4 × 13 GB + 12 × 13 GB / 8 = 52 + 19.5 = 71.5 GB ≤ 80 GB.",
            lambda: 1),
    }
