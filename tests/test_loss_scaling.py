"""Chapter 4, §10: unscaled fp16 flushes small gradients to zero, dynamic loss scaling keeps them and
trains like fp32 to rounding, bf16 (fp32's exponent range) needs no scale; GradScaler on CPU."""

import pytest
import torch

from lesson_lib.milestones.zero import loss_scaling as ls
from lesson_lib.numerics import max_gap

pytestmark = pytest.mark.ch4


@pytest.fixture(scope="module")
def runs():
    return {p: ls.train(p) for p in ls.PRECISIONS}


def test_unscaled_fp16_flushes_most_gradients_where_scaled_fp16_and_bf16_flush_none(runs):
    assert max(runs["fp32"]["zero_share"]) == 0.0  # tanh: fp32 has no exact zeros of its own
    assert runs["fp16"]["zero_share"][0] > 0.5, runs["fp16"]["zero_share"]  # the underflow
    # catches: the scale not applied (then scaled fp16 flushes as unscaled does), fp16 run as bf16
    for p in ("fp16+scaling", "bf16"):
        assert max(runs[p]["zero_share"]) < 0.01, (p, runs[p]["zero_share"])


@pytest.mark.numerics
def test_scaled_fp16_and_bf16_track_fp32_within_their_rounding(runs):
    ref = runs["fp32"]["losses"]
    for p in ("fp16+scaling", "bf16"):
        assert max_gap(runs[p]["losses"], ref) <= ls.loss_tolerance(p, ls.Task(), ref), p
    assert runs["fp16+scaling"]["scale"] == [2.0**16] * ls.Task().steps  # no overflow at GradScaler's default
    assert all(runs["fp16+scaling"]["stepped"])
    # the same start: the first losses differ by one forward's rounding only
    assert abs(runs["fp16"]["losses"][0] - ref[0]) <= ls.loss_tolerance("fp16", ls.Task(), ref)


def test_the_scale_is_dynamic_an_overflow_skips_the_step_and_halves_it():
    # S = 2²⁰ times the gradients overflows fp16 (largest 65,504) in the backward: inf, caught
    r = ls.train("fp16+scaling", ls.Task(steps=12), init_scale=2.0**20)
    assert not r["stepped"][0] and r["scale"][0] == 2.0**20, r
    for i in range(11):  # skipped: halved; taken: kept (GradScaler doubles S only after 2,000 clean steps)
        assert r["scale"][i + 1] == r["scale"][i] / (1 if r["stepped"][i] else 2), (i, r["scale"])
    assert sum(r["stepped"]) >= 6, r["stepped"]  # then it trains


def test_fp16_underflows_where_bf16_does_not():
    tiny = torch.tensor([2.0**-26, 1e-10, 2.0**-24])
    assert tiny.half().tolist()[:2] == [0.0, 0.0] and tiny.half()[2] > 0  # 2⁻²⁴: fp16's smallest
    assert (tiny.bfloat16() > 0).all()  # bf16's exponent is fp32's: down to ~1e-38


def test_zero_share_and_bad_precision():
    params = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(1))]
    params[0].grad, params[1].grad = torch.tensor([0.0, 1.0, 0.0]), torch.tensor([0.0])
    assert ls.zero_share(params) == 0.75
    with pytest.raises(ValueError, match="precision"):
        ls.train("fp8")
