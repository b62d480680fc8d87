"""Chapter 9's delayed scaling worked step by step by hand (issue 58). The lesson is the order:
the scale comes from the amax history *first*, and only then does this step's amax join it, so a new
outlier saturates on the step it appears and is absorbed one step later. Every expected value below
is a literal: e4m3's largest finite value is 448 (Micikevicius et al., 2022, Table 1), a scale is
amax / 448, and the cast's values are x / scale, clamped to ±448."""

import pytest
import torch

from lesson_lib.milestones.fp8 import scaling

pytestmark = pytest.mark.ch9


def _values(x8):
    return [float(v) for v in x8.float()]


def test_delayed_scaling_takes_the_scale_from_the_history_then_records_the_amax():
    s = scaling.DelayedScaling(history=2, fmt=torch.float8_e4m3fn)

    # step 1: no history yet, so the current amax 2 gives the scale 2/448; x/s = 224·x, exactly e4m3
    x8, scale = s.quantize(torch.tensor([1.0, -2.0, 0.5]))
    assert float(scale) == pytest.approx(2 / 448, rel=1e-7)
    assert _values(x8) == [224.0, -448.0, 112.0]

    # step 2: an outlier, amax 4. The scale is still the history's 2/448, so 4 becomes 896 and
    # saturates at 448 (taking this step's amax first would give 4/448 and no saturation: 448, 112)
    x8, scale = s.quantize(torch.tensor([4.0, 1.0]))
    assert float(scale) == pytest.approx(2 / 448, rel=1e-7)
    assert _values(x8) == [448.0, 224.0]

    # step 3: amax 1, but the history is (2, 4): scale 4/448, so 1 → 112 and 0.5 → 56
    x8, scale = s.quantize(torch.tensor([1.0, 0.5]))
    assert float(scale) == pytest.approx(4 / 448, rel=1e-7)
    assert _values(x8) == [112.0, 56.0]

    # step 4: the history of 2 steps is now (4, 1): step 1's amax 2 has left it; still 4/448
    x8, scale = s.quantize(torch.tensor([2.0]))
    assert float(scale) == pytest.approx(4 / 448, rel=1e-7)
    assert _values(x8) == [224.0]

    # step 5: history (1, 2): the outlier of step 2 has left the window; the scale falls to 2/448
    x8, scale = s.quantize(torch.tensor([1.0]))
    assert float(scale) == pytest.approx(2 / 448, rel=1e-7)
    assert _values(x8) == [224.0]
    assert [float(a) for a in s.amaxes] == [2.0, 1.0]


def test_an_all_zero_first_step_scales_by_one_and_the_next_step_by_the_history():
    s = scaling.DelayedScaling(history=4)
    x8, scale = s.quantize(torch.zeros(3))
    assert float(scale) == 1.0 and _values(x8) == [0.0, 0.0, 0.0]  # amax 0: scale 1, nothing divides by 0
    x8, scale = s.quantize(torch.tensor([0.25]))  # the history holds only 0: scale 1 again, 0.25 as is
    assert float(scale) == 1.0 and _values(x8) == [0.25]
