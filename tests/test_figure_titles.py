"""Every figure's title sits under plotly's modebar (issue 59 item 9): the toolbar that appears over a
figure's top-right corner when the mouse is on it covered the right-hand end of long titles at
700–950 px (a JupyterLab cell on a laptop), most of all titles carrying the CPU-fallback note, which
``automargin`` pushed against the figure's top edge. Built from small inputs, without starting workers
(chapters 0, 1, 3, 4 and 7's talk chart: tests/test_figure_layout.py)."""

import importlib
import inspect
import pkgutil
from types import SimpleNamespace

import plotly.graph_objects as go
import pytest

from lesson_lib import plots
from lesson_lib.plots.common import MODEBAR_PX, SUP_LINE_PX, TITLE_LINE_PX, oversubscription_note

NOTE = oversubscription_note([SimpleNamespace(oversubscribed=True, world_size=4)])


def _figure_functions():
    """Every public function of lesson_lib.plots that builds a figure: it returns a go.Figure or
    takes a title, and is not a helper handed a figure (``fig``) to change."""
    for info in pkgutil.iter_modules(plots.__path__):
        module = importlib.import_module(f"{plots.__name__}.{info.name}")
        for name, f in vars(module).items():
            if name.startswith("_") or not inspect.isfunction(f) or f.__module__ != module.__name__:
                continue
            sig = inspect.signature(f)
            if "fig" not in sig.parameters and ("title" in sig.parameters
                                                or "Figure" in str(sig.return_annotation)):
                yield f"{info.name}.{name}", f


FUNCTIONS = list(_figure_functions())


def test_the_figure_functions_are_found():
    names = [n for n, _ in FUNCTIONS]
    for expected in ("alpha_beta.at_scale", "collectives.ring_animation", "compression.bandwidth_sweep",
                     "fp8.grids", "impact.dashboard", "large_batch.curves", "parallelism.ring_blocks",
                     "resilience.internet_scale", "training.timeline", "memory.stage_traffic"):
        assert expected in names
    assert len(names) >= 60


@pytest.mark.parametrize("name, build", FUNCTIONS, ids=[n for n, _ in FUNCTIONS])
def test_every_figure_function_places_its_title_clear_of_the_modebar(name, build):
    # @titled, or a call of its own where more is laid out under the title (chapter 7's talk chart)
    placed = getattr(build, "clear_of_modebar", False) or "clear_of_modebar(fig)" in inspect.getsource(build)
    assert placed, f"{name}: decorate it with @titled"


def _assert_placed(name: str, fig: go.Figure) -> None:
    t, height = fig.layout.title, fig.layout.height or 450
    scale = max(1.0, (t.font.size or round(1.4 * (fig.layout.font.size or 12))) / 17)
    lines = t.text.split("<br>")
    assert all(len(line) <= 80 for line in lines if "<sup" not in line), name
    # anchored by its first line, in pixels from the top: that line's top below the modebar's band
    assert t.yref == "container" and t.yanchor == "bottom" and t.automargin is False, name
    assert (1 - t.y) * height - TITLE_LINE_PX * scale >= MODEBAR_PX - 1e-6, name
    # the top margin holds every line above the plot area, and the subplot titles under them
    sup = sum("<sup" in line for line in lines)
    need = MODEBAR_PX + scale * (TITLE_LINE_PX * (len(lines) - sup) + SUP_LINE_PX * sup)
    if any(a.yref == "paper" and a.y == 1 and a.yanchor == "bottom" for a in fig.layout.annotations):
        need += 20
    assert fig.layout.margin.t >= need, name


def _results(batches=(64, 256)):
    """large_batch.curves' runs: per rank, steps with samples and wall time; the losses."""
    steps = [SimpleNamespace(samples=64 * (i + 1), wall_s=0.01) for i in range(5)]
    run = SimpleNamespace(per_rank=[SimpleNamespace(steps=steps)] * 2, losses=[2, 1.5, 1.2, 1.0, 0.9])
    return {(opt, b): run for opt in ("sgd", "lamb") for b in batches}


def _chapter_figures():
    """Figures of chapters 2, 5, 6, 7, 8, 9 and 10 as they build them, the CPU-fallback note where
    they add it, and the room's dashboard."""
    from lesson_lib.comm import schedules

    p = plots
    bw = [{"world_size": n, "algorithm": alg, "size_bytes": s, "algbw_GBps": 0.1}
          for n in (2, 4) for alg in ("ring", "library") for s in (1e3, 1e6)]
    scale = [{"link": link, "algorithm": alg, "size_bytes": s, "world_size": n, "time_s": 1e-3 * n,
              "latency_share": 0.1} for link in ("laptop", "IB") for alg in ("ring", "halving-doubling")
             for s in (25e6, 1e9) for n in (2, 4, 8)]
    yield "ch2 bandwidth", p.collectives.allreduce_bandwidth(bw, {}, NOTE)
    yield "ch2 ring", p.collectives.ring_animation(schedules.ring_states(4))
    yield "ch2 α-β", p.alpha_beta.at_scale(scale, "IB", "The α-β model at cluster scale: InfiniBand HDR "
                                           "(α = 5 µs assumed, 1/β = 25 GB/s) beside this laptop's fit")
    yield "ch2 vs server", p.collectives.ring_vs_parameter_server(
        [{"label": lb, "n": n, "step_ms": 5.0 * n, "bytes": 1e6 * n} for lb in ("ring", "parameter server")
         for n in (2, 4)], NOTE)
    yield "ch5 curves", p.large_batch.curves(_results(), NOTE)
    yield "ch5 epoch", p.large_batch.epoch_cost(
        [{"batch": b, "epoch_wall_s": 10 / b, "epoch_busy_s": 8 / b, "grad_bytes_per_epoch": 1e9 / b,
          "grad_bytes_per_epoch_formula": 1e9 / b} for b in (64, 256, 1024)], NOTE)
    yield "ch5 race", p.large_batch.race(
        [{"optimizer": "lamb", "lr": lr, "eval_accuracy": 0.8, "diverged": False, "rule": "sqrt",
          "multiplier": 1} for lr in (1e-3, 1e-2)], 4096, 0.85)
    predicted = {"none": ([0.1, 1, 10], [0.5, 0.1, 0.02]), "topk": ([0.1, 1, 10], [0.05, 0.01, 0.005])}
    sweep = [{"compressor": c, "gbps": g, "step_s": 0.1 / g, "busy_s": 0.05 / g}
             for c in predicted for g in (0.1, 1, 10)]
    yield "ch6 sweep", p.compression.bandwidth_sweep({2: (sweep, predicted), 4: (sweep, predicted)}, 50, NOTE)
    yield "ch6 time to target", p.compression.time_to_target(
        [{"compressor": c, "gbps": g, "time_s": 1 / g, "steps": 100} for c in predicted for g in (0.1, 1)],
        1.5, 50, 4)
    records = [{"label": lb, "link_gbps": g, "reached_target": True, "time_to_target_s": 3.0, "time_run_s": 3,
                "steps": 100, "bytes_per_step_busiest": 1e6, "median_step_s": 0.01, "predicted_step_s": 0.012,
                "peak_memory_per_rank": [{k: 1e6 for k in ("params", "grads", "optimizer", "activations",
                                                           "buffers")}]}
               for lb, g in (("data parallel", None), ("top-k 1%, emulated link", 1.0))]
    yield "ch7 dashboard", p.impact.dashboard(records, 1.5, NOTE)
    yield "ch7 predicted", p.impact.predicted_vs_measured(records, NOTE)
    held = [[(r - s) % 4 for s in range(4)] for r in range(4)]
    yield "ch8 ring blocks", p.parallelism.ring_blocks(
        held, True, "Ring attention, 4 ranks, causal: the K/V block each rank holds at each step, and what "
        "it skips")
    yield "ch9 outliers", p.fp8.outlier_sweep(
        [{"recipe": r, "outlier": o, "error": 1e-3 * o} for r in ("per-tensor", "per-row") for o in (1, 10)])
    yield "ch9 terms", p.fp8.terms([{"label": "bf16", "terms": {"matmul": 1.0, "comm": 0.5}},
                                    {"label": "fp8", "terms": {"matmul": 0.6, "comm": 0.5}}],
                                   "A 70B model's step on H100s (NDR, overlap 0.5): only the matmuls get "
                                   "faster in FP8; communication and the rest stay")
    yield "ch10 time to target", p.resilience.time_to_target(
        {"data parallel": [(0, 3.0), (10, 2.0)], "DiLoCo H=50": [(0, 3.0), (4, 2.0)]}, 2.2,
        "DiLoCo against data parallelism over an emulated 100 Mbit/s link: held-out loss against wall time",
        "a note under the axis")

    from lesson_lib.chapters import ch07_published

    yield "ch7 published", ch07_published._figure(
        [{"case": c, "use": u, "unit": "TFLOP/s per GPU", "published": 150.0, "predicted": 140.0,
          "error": -0.07} for c, u in (("gpt3-175b", "in-sample"), ("llama-65b", "out-of-sample"))])


@pytest.mark.parametrize("name, fig", list(_chapter_figures()), ids=lambda v: v if isinstance(v, str) else "")
def test_chapters_2_5_6_7_8_9_and_10_titles_sit_below_plotlys_modebar(name, fig):
    _assert_placed(name, fig)
    if name in ("ch2 bandwidth", "ch5 curves", "ch6 sweep", "ch7 dashboard"):  # the note still shown
        text = fig.layout.title.text
        assert "CPU fallback: 4 ranks share" in text and "<sup style='color:#a33'>" in text


def test_the_rooms_dashboard_title_sits_below_the_modebar_in_its_large_font():
    from lesson_lib.room.dashboard import Dashboard

    who = {f"learner {i}": "ready" for i in range(12)}
    rnd = SimpleNamespace(names=list(who), statuses={}, n=3, activity="steps", running=True, ok=False,
                          summary=None, verdict="", events=[])
    room = SimpleNamespace(name="workshop, Tuesday afternoon", rounds=[rnd], listeners=[],
                           learners=lambda: who)
    fig = Dashboard(room).fig
    # too long for one line of its 22 px font: who joined, then the round, a line each
    assert fig.layout.title.text == "room 'workshop, Tuesday afternoon': 12 joined<br>round 3, steps, running"
    _assert_placed("room dashboard", fig)
