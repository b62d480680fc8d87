"""Chapter 8 §5: data × pipeline × tensor parallelism on one grid equals one process; every group's
counted bytes equal the cost model's term and every rank's parameters their formula; a layout the
pipeline cannot split is refused naming the parameter before any rank starts."""

import pytest

from lesson_lib import close_all
from lesson_lib.chapters import ch08_exercises, ch08_grid
from lesson_lib.milestones.tensor_parallel import formulas, three_d, train
from lesson_lib.milestones.tensor_parallel.grid import Layout
from lesson_lib.milestones.tensor_parallel.model import Config

pytestmark = pytest.mark.ch8
CFG = Config.tiny(steps=2)


@pytest.fixture(scope="module", autouse=True)
def _close_clusters():
    yield
    close_all()


@pytest.fixture(scope="module")
def ref():
    return train.reference(CFG)


@pytest.mark.numerics
@pytest.mark.parametrize("dp, pp, tp, sp", [pytest.param(1, 2, 1, False, marks=pytest.mark.slow),
                                             pytest.param(1, 2, 2, True, marks=pytest.mark.slow),
                                             (2, 2, 2, False)])
def test_3d_equals_one_process_and_each_group_sends_its_cost_model_term(dp, pp, tp, sp, ref):
    row = ch08_grid.run_layout(CFG, Layout(dp=dp, pp=pp, tp=tp, sequence_parallel=sp), 2, ref)
    assert row["equal"], row
    for group in ("tp", "pp", "dp"):
        assert row["counted"][group] == row["formula"][group], (group, row)
    assert row["params"] == row["param_formula"] and max(row["params"]) < sum(t.numel() for t in
                                                                              ref["params"].values())
    assert (row["counted"]["unmodelled"] > 0) == sp  # entering/leaving the region, norms' gradients


def test_stage_params_add_up_to_the_whole_model(ref):
    whole = sum(t.numel() for t in ref["params"].values())
    assert sum(formulas.stage_params(CFG, 1, 2, s) for s in range(2)) == whole
    assert formulas.stage_params(CFG, 1, 1, 0) == whole


@pytest.mark.parametrize("call, name", [
    (lambda: three_d.check(CFG, Layout(pp=3), 2), "layers"),
    (lambda: three_d.check(CFG, Layout(dp=2, pp=2), 3), "micro"),
    (lambda: ch08_grid.grid_3d(layouts=((1, 2, 1, False), (1, 4, 1, False))), "layers"),
])
def test_a_layout_the_pipeline_cannot_split_is_refused(call, name, no_orphans):
    with pytest.raises(ValueError, match=name):
        call()


@pytest.mark.parametrize("answer, verdict", [
    ((2, 2, 2), None), (Layout(dp=2, pp=2, tp=2), None), ((2.0, 2.0, 2.0), None),
    ((2, 4, 1), "bytes are not time"),  # fewest bytes, but 4 stages over 2 micro-batches idle 60 %
    ((1, 2, 4), "which one is larger"),  # the same bubble, more tensor-parallel time on NVLink
    ((4, 2, 1), "over the budget"),  # sends little, does not fit
    ((8, 1, 1), "cannot run"), ((2, 2, 3), "cannot run"),
])
def test_the_layout_exercise_runs_the_answer_and_judges_memory_then_step_time(answer, verdict):
    v = ch08_exercises.exercises()["layout"].submit(answer)
    assert bool(v) == (verdict is None) and (verdict is None or verdict in v.message), v.message


@pytest.mark.parametrize("pp, tp, name", [(8, 1, "pp = 8"), (3, 1, "pp = 3"), (1, 3, "tp = 3")])
def test_the_formulas_refuse_a_split_the_model_cannot_take(pp, tp, name):
    cfg = ch08_grid.case_cfg()  # 4 layers, 4 heads: pp = 8 once scored a layout that cannot exist
    for call in (lambda: formulas.stage_params(cfg, tp, pp, 0),
                 lambda: formulas.step_bytes(cfg, 1, pp, tp, 1),
                 lambda: formulas.step_time(cfg, 1, pp, tp, 1)):
        with pytest.raises(ValueError, match=name):
            call()


def test_step_time_by_hand_for_a_pipeline_with_no_other_traffic():
    """dp = tp = 1: only compute, the bubble and the pipeline's messages. Worked by hand: Ψ from
    torch's own parameter count, 6·Ψ FLOPs per token at half an A100's 312 TFLOP/s, GPipe's
    (M + P − 1)/M, and 2 messages per micro-batch of a [seq, batch / M, d] float32 activation on
    InfiniBand HDR (25 GB/s, 5 µs: data/links.csv)."""
    from lesson_lib.milestones.tensor_parallel.model import Transformer

    cfg = ch08_grid.case_cfg()
    psi = sum(p.numel() for p in Transformer(cfg).parameters())
    compute = 6 * psi * cfg.seq * cfg.batch / 4 / (0.5 * 312e12) * (2 + 4 - 1) / 2
    pp = 2 * 2 * (5e-6 + 4 * cfg.seq * (cfg.batch // 2) * cfg.d_model / 25e9)
    t = formulas.step_time(cfg, 1, 4, 1, 2)
    assert t["bubble"] == pytest.approx(3 / 5) and t["tp"] == 0 and t["dp"] == 0
    assert t["compute"] == pytest.approx(compute) and t["pp"] == pytest.approx(pp)
    assert t["step"] == pytest.approx(compute + pp)


def test_at_gpt3_width_the_bubble_not_the_bytes_decides_the_layout():
    """The layout exercise's answer (2, 2, 2) is not the one that sends the fewest bytes (2, 4, 1),
    whose 4 stages over 2 micro-batches idle 60 % of the step; at the chapter's own width the
    latency of the messages decides and the bytes answer is also the fastest."""
    c = ch08_grid.LAYOUT_CASE
    options = ch08_grid.feasible(ch08_grid.case_cfg(), c["world"], c["budget"], c["micro"])
    assert min(options, key=lambda k: options[k]["total"]) == (2, 4, 1)
    assert ch08_grid.best_layout() == (2, 2, 2)
    here = {k: formulas.step_time(ch08_grid.case_cfg(), *k, c["micro"])["step"] for k in options}
    assert min(here, key=here.get) == (2, 4, 1)


@pytest.mark.parametrize("tp", [2, 4])
def test_the_pipeline_term_agrees_with_chapter_7_with_sequence_parallelism(tp):
    """Between stages a rank sends, per micro-batch, its activation forward and its gradient back:
    with sequence parallelism seq/t of the [seq, b, d] tensor, which is Megatron's scatter/gather
    (SC21 §4.1) that chapter 7's planner counts, 2·m·(s·b·h/t) elements per rank of a middle stage;
    without it, each tp rank sends the whole tensor, t times that."""
    cfg = ch08_grid.case_cfg()
    dp, pp, micro = 1, 4, 2
    b = cfg.batch // dp // micro
    megatron = 2 * micro * 4 * cfg.seq * b * cfg.d_model / tp  # float32 bytes
    assert formulas.step_bytes(cfg, dp, pp, tp, micro, sequence_parallel=True)["pp"] == megatron
    assert formulas.step_bytes(cfg, dp, pp, tp, micro)["pp"] == tp * megatron
