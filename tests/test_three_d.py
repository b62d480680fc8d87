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


@pytest.mark.slow
@pytest.mark.parametrize("answer, verdict", [
    ((2, 4, 1), None), (Layout(dp=2, pp=4, tp=1), None),
    ((1, 4, 2), "sends less"),       # fits, but tensor parallelism sends more than the pipeline
    ((4, 2, 1), "over the budget"),  # sends little, does not fit
    ((8, 1, 1), "cannot run"), ((2, 2, 3), "cannot run"),
])
def test_the_layout_exercise_runs_the_answer_and_judges_memory_then_bytes(answer, verdict):
    v = ch08_exercises.exercises()["layout"].submit(answer)
    assert bool(v) == (verdict is None) and (verdict is None or verdict in v.message), v.message
