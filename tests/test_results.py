"""A run's per-rank records are typed once (lesson_lib.results) and written back to JSON unchanged."""

import json

import pytest

from lesson_lib.experiments import Result
from lesson_lib.results import RankResult, Step

STEP = {"step": 0, "start": 1.0, "wall_s": 0.5, "comm_s": 0.2, "compute_s": 0.3, "busy_s": 0.25,
        "bytes_sent": 64, "bytes_recv": 64, "loss": 2.0}
RANK = {"rank": 1, "bytes_sent": 128, "bytes_recv": 96, "compute_s": 0.6, "comm_s": 0.4, "busy_s": 0.5,
        "wall_s": 1.0, "memory": {"params": 40, "optimizer": 80}, "ops": {"grad_all_reduce": {"calls": 2}},
        "steps": [STEP, {**STEP, "step": 1, "wall_s": 0.7}, {**STEP, "step": 2, "wall_s": 0.9}]}


def _result(per_rank):
    return Result(experiment="x", world_size=len(per_rank), backend="gloo", config={}, losses=[2.0],
                  per_rank=per_rank)


def test_each_rank_becomes_a_typed_record_read_by_field():
    r = _result([RANK, {**RANK, "rank": 0}])
    p = r.per_rank[0]
    assert isinstance(p, RankResult) and isinstance(p.steps[0], Step)
    assert (p.rank, p.bytes_sent, p.memory["optimizer"], p.steps[1].wall_s) == (1, 128, 80, 0.7)
    assert p.median("wall_s") == 0.8 and r.median_step("wall_s") == [0.8, 0.8]  # step 0 skipped
    assert r.step_times() == [0.5, 0.7, 0.9]
    assert p["bytes_recv"] == 96 and p.steps[0]["loss"] == 2.0  # keyed reading, as the JSON has it
    assert p.steps[0].get("runqueue_s", -1.0) == -1.0 and "runqueue_s" not in p.steps[0]


def test_to_dict_writes_the_keys_the_ranks_returned():
    r = _result([RANK])
    assert json.loads(json.dumps(r.to_dict()))["per_rank"] == [RANK]


def test_a_per_step_key_no_field_holds_is_an_error_not_dropped():
    with pytest.raises(TypeError, match="momentum"):
        _result([{**RANK, "steps": [{**STEP, "momentum": 0.9}]}])
