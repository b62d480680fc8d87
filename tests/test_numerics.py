"""The shared tolerances: each bound admits rounding and refuses the smallest real error it names."""

import pytest
import torch

from lesson_lib import numerics
from lesson_lib.milestones import data_parallel as dp

pytestmark = pytest.mark.numerics


def test_max_gap_is_the_largest_absolute_difference_and_refuses_unequal_lengths():
    assert numerics.max_gap([1.0, 2.0, 3.0], [1.5, 1.0, 3.0]) == 1.0
    assert numerics.max_gap([], []) == 0.0
    with pytest.raises(ValueError, match="3 values with 2"):
        numerics.max_gap([1, 2, 3], [1, 2])


def test_sum_order_tolerance_admits_reordered_sums_and_refuses_a_missing_one_over_n():
    # bug caught: a bound so loose that data parallel without the 1/N average would pass
    cfg = dp.Config.tiny(world_size=1, optimizer="sgd")
    ref = dp.reference(cfg)
    tol = numerics.sum_order_tolerance(ref)
    assert tol == 10 * cfg.steps * torch.finfo(torch.float32).eps * max(ref)
    doubled = dp.reference(cfg.replace(lr=2 * cfg.lr))  # what summing N = 2 gradients does to SGD
    assert numerics.max_gap(doubled, ref) > 100 * tol


def test_adam_drift_stays_below_one_skipped_step():
    cfg = dp.Config.tiny(steps=10, lr=0.01)
    tol = numerics.adam_drift(cfg)
    assert tol["params"] < cfg.lr  # one skipped Adam step moves parameters by about lr
    with pytest.raises(ValueError, match="skipped step"):
        numerics.adam_drift(dp.Config.tiny(steps=100))


def test_pipeline_tolerance_grows_with_the_terms_summed():
    small, more = (numerics.pipeline_tolerance(m, steps=4, depth=7) for m in (2, 8))
    assert 0 < small < more < 1e-3


def test_within_roundings_takes_the_same_arithmetic_and_refuses_a_wrong_factor():
    from lesson_lib.numerics import within_roundings

    x = torch.arange(1, 751, dtype=torch.float32)
    assert not torch.equal(x / 3, x * (1.0 / 3))  # the two spellings differ in the last bit somewhere
    assert within_roundings(x * (1.0 / 3), x / 3)
    assert not within_roundings(x / 3 * 1.0001, x / 3)  # 1e-4 relative is ~800 roundings at 1
    assert not within_roundings((x / 3)[None], x / 3)  # another shape
