"""Chapter 7's one calibration and its held-out runs: the efficiency is fitted once on the
in-sample set, every row of SC21 Table 1, and every ``out-of-sample`` run of data/published.csv is
predicted from its paper's layout, each a test that fails when its error leaves the band stated here."""

import pytest

from lesson_lib import costmodel as cm
from lesson_lib.costmodel import calibrate

pytestmark = pytest.mark.ch7

GOAL = 0.15  # the goal for every held-out run: within ±15 % of the published number
# Runs that miss the goal, each with the band it does hold and the term it misses. The model's one
# efficiency is the same for every matrix size, so it cannot rise with h/t as SC21 Table 1 and
# Korthikanti's Table 5 do (in-sample, the 530B and 1T rows are already 10-11 % slow); the
# interleaving factor v of these runs is not reported (v = 1 assumed), so their bubble may be too large.
MISSES = {
    "korthikanti-175b-selective": (0.20, "compute: one efficiency for every matrix size"),
    "korthikanti-530b-full": (0.25, "compute (efficiency rises with h/t) and bubble (v not reported)"),
    "korthikanti-530b-selective": (0.25, "compute (efficiency rises with h/t) and bubble (v not reported)"),
    "korthikanti-1t-full": (0.25, "compute (efficiency rises with h/t) and bubble (v not reported)"),
    "korthikanti-1t-selective": (0.25, "compute (efficiency rises with h/t) and bubble (v not reported)"),
}
HELD_OUT = [c for c, p in cm.published().items() if p["use"] == "out-of-sample"]


def test_the_efficiency_is_fitted_once_on_sc21_table_1_alone():
    """Refit on the in-sample set: the stored constant is the fit (to its 3 digits), and no held-out
    run is in that set (the in-sample file has none of their layouts)."""
    fit = calibrate.fit_efficiency()
    assert round(fit["efficiency"], 3) == cm.CALIBRATED_EFFICIENCY
    rows = calibrate.in_sample()
    assert len(rows) == 10 and [r["achieved_tflops_per_device"] for r in rows][-2:] == [163, 163]
    # the in-sample spread, stated: the model is flat where SC21's per-GPU rate rises 137 → 163
    errors = [r["error"] for r in fit["rows"]]
    assert -0.12 < min(errors) and max(errors) < 0.16
    for case in HELD_OUT:
        p = cm.published()[case]
        assert (p["tensor"], p["pipeline"], p["devices"]) not in {
            (r["tensor"], r["pipeline"], r["devices"]) for r in rows}
    assert cm.published_plan("mt-nlg-530b").efficiency == cm.CALIBRATED_EFFICIENCY


def test_sc21_table_1_is_internally_consistent():
    """Each row's aggregate PFLOP/s is n × its per-GPU TFLOP/s (rounded), and % of peak is X / 312."""
    for r in calibrate.in_sample():
        assert r["devices"] * r["achieved_tflops_per_device"] / 1e3 == pytest.approx(r["aggregate_pflops"],
                                                                                    rel=0.005)
        assert round(100 * r["achieved_tflops_per_device"] / 312) == r["percent_of_peak"]


def test_gpt3_row_cites_section_5_1_and_says_its_layout_is_assumed():
    p = cm.published()["gpt3-175b"]
    assert p["use"] == "sanity-check" and "Section 5.1" in p["source"] and "ASSUMED" in p["source"]
    assert "Table 1 has no 175B row" in p["source"]


@pytest.mark.parametrize("case", HELD_OUT)
def test_held_out_run_within_its_band(case):
    p = cm.published()[case]
    assert p["source"] and ("Table" in p["source"] or "Section" in p["source"])
    r = calibrate.compare(case)
    band, missing = MISSES.get(case, (GOAL, None))
    assert abs(r["error"]) <= band, (case, r["error"], missing)
    if missing is not None:  # a recorded miss stays a miss until the model gains the term it lacks
        assert abs(r["error"]) > GOAL, f"{case} now meets the goal: drop it from MISSES"


def test_llama3_rows_use_model_flops_and_say_what_is_assumed():
    for case in ("llama3-405b-8k", "llama3-405b-16k"):
        r = calibrate.compare(case)
        assert r["unit"] == "TFLOP/s (model)" and "ASSUMED" in r["source"]
        assert r["predicted"] == pytest.approx(r["mfu"] * 989, rel=1e-9)
        assert r["estimate"]["plan"].chunks == 7
