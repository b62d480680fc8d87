"""Chapter 7's one calibration and its held-out runs: the efficiency is fitted once on the
in-sample set, every row of SC21 Table 1, and every ``out-of-sample`` run of data/published.csv is
predicted from its paper's layout, each a test that fails when its error leaves the band stated here."""

import pytest

from lesson_lib import costmodel as cm
from lesson_lib.costmodel import calibrate

pytestmark = pytest.mark.ch7

GOAL = 0.15  # the goal for every held-out run: within ±15 % of the published number
# Runs that miss the goal, each with the band it does hold and the term it misses. The efficiency e(x)
# now rises with the GEMM shapes (h/t, s, b), which brought Korthikanti's larger runs within the goal but
# one; what is left is named here.
MISSES = {
    # too slow: the interleaving v is not reported for Table 5's runs; at v = 1 the bubble (P−1)/M of
    # 35 stages over 280 micro-batches is 12 % of the compute, which v > 1 would divide
    "korthikanti-530b-full": (0.20, "bubble: the interleaving v is not reported (v = 1 assumed)"),
    # too fast: 126 TFLOP/s where SC21 Table 1 reached 163 on the same shape (t 8, p 35): DeepSpeed's
    # pipeline engine, not Megatron's, and e(x) is fitted on Megatron's runs
    "mt-nlg-530b": (0.20, "implementation: e(x) is fitted on Megatron's kernels, MT-NLG ran DeepSpeed's"),
    # too fast: FSDP's gathers assumed hidden (overlap = 1), and 'up to 147' is a best rate, not a mean
    "opt-175b": (0.20, "exposed FSDP gathers (overlap = 1 assumed) against a best, not a mean, rate"),
    # too slow: the model leaves the expert all-to-all exposed where DualPipe hides it behind compute, and
    # prices 7168 × 2048 expert GEMMs with the dense e(x)
    "deepseek-v3": (0.30, "expert all-to-all overlap (DualPipe) and the efficiency of small expert GEMMs"),
}
HELD_OUT = [c for c, p in cm.published().items() if p["use"] == "out-of-sample"]


def test_the_efficiency_is_fitted_once_on_sc21_table_1_alone():
    """Refit on the in-sample set: the stored constant is the fit (to its 3 digits), and no held-out
    run is in that set (the in-sample file has none of their layouts)."""
    fit = calibrate.fit_efficiency()
    assert round(fit["efficiency"], 3) == cm.CALIBRATED_EFFICIENCY  # the constant, still there to fix
    rows = calibrate.in_sample()
    assert len(rows) == 10 and [r["achieved_tflops_per_device"] for r in rows][-2:] == [163, 163]
    # the in-sample spread, stated: the model is flat where SC21's per-GPU rate rises 137 → 163
    errors = [r["error"] for r in fit["rows"]]
    assert -0.12 < min(errors) and max(errors) < 0.16
    for case in HELD_OUT:
        p = cm.published()[case]
        assert (p["tensor"], p["pipeline"], p["devices"]) not in {
            (r["tensor"], r["pipeline"], r["devices"]) for r in rows}
    assert cm.published_plan("mt-nlg-530b").efficiency == "gemm"  # e(x), fitted on the same rows alone


def test_the_gemm_shape_efficiency_is_fitted_once_on_sc21_table_1_alone():
    """e(x) = E·x/(x + k·R): refit on the in-sample set, the stored (E, k) is the fit (to its digits),
    it halves the constant's squared log error, and it rises with the GEMM size as SC21's MFU does."""
    from lesson_lib.costmodel.gemm import GEMM_FIT

    fit = calibrate.fit_gemm_efficiency()
    assert (round(fit["e_max"], 3), round(fit["k"], 2)) == GEMM_FIT == (0.728, 1.64)
    assert fit["loss"] < 0.55 * fit["constant_loss"]
    rows = sorted(fit["rows"], key=lambda r: r["intensity"])
    assert all(a["efficiency"] < b["efficiency"] for a, b in zip(rows, rows[1:]))
    # in-sample spread, stated: the t = 1 and t = 2 rows (1.7B, 3.6B) stay too fast, by 14 % and 6 %
    errors = {r["params"]: r["error"] for r in fit["rows"]}
    assert -0.07 < min(errors.values()) and max(errors.values()) == errors[1.7e9] < 0.14


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
    for case in ("llama3-405b-8k", "llama3-405b-16k", "llama3-405b-16k-cp16"):
        r = calibrate.compare(case)
        assert r["unit"] == "TFLOP/s (model)" and "ASSUMED" in r["source"]
        assert r["predicted"] == pytest.approx(r["mfu"] * 989, rel=1e-9)
        assert r["estimate"]["plan"].chunks == 7


def test_opt_175b_depends_on_its_assumed_micro_batches_and_says_so():
    """OPT-175B's paper gives no micro-batch: one micro-batch of 8 per replica is assumed (FSDP gathers
    the weights once a step). With 8 micro-batches of 1 the gathers run 8 times and the rate falls by more
    than half: the row says so, and the test holds the model to it."""
    one = calibrate.compare("opt-175b")
    eight = calibrate.compare("opt-175b", micro_batch=1)
    p = one["estimate"]["plan"]
    layout = (p.tensor, p.data_parallel, p.zero, p.sequences_per_microbatch, p.microbatches)
    assert layout == (8, 124, 3, 8, 1)
    assert eight["estimate"]["plan"].microbatches == 8
    assert eight["predicted"] < 0.5 * one["predicted"]
    assert all(w in one["source"] for w in ("ASSUMED", "ONE micro-batch", "by more than half"))


def test_bloom_runs_on_its_own_layout_and_links():
    """BLOOM's run records: TP 4, PP 12, so d = 384 / 48 = 8; micro-batch 2 of a 2,048 batch, so 128
    micro-batches per replica; 4 Omni-Path links of 100 Gb/s per node of 8 GPUs = 6.25 GB/s per GPU."""
    r = calibrate.compare("bloom-176b")
    p = r["estimate"]["plan"]
    assert (p.tensor, p.pipeline, p.data_parallel, p.microbatches) == (4, 12, 8, 128)
    assert cm.links()[p.link]["beta"] == pytest.approx(1 / (4 * 100e9 / 8 / 8))
    assert r["unit"] == "s/step" and r["published"] == 105.22


def test_deepseek_v3_is_a_moe_in_fp8_and_its_miss_is_the_all_to_all():
    """DeepSeek-V3: 671B parameters of which 37B active, 256 experts over 64 ranks, 8 per token, FP8;
    1,543 tokens/s per GPU is 10^12 tokens / (180,000 GPU hours x 3,600 s). The model's largest term is
    the expert all-to-all, which the paper's DualPipe overlaps: the miss it states."""
    assert round(1e12 / (180e3 * 3600)) == cm.published()["deepseek-v3"]["tokens_per_s_per_device"]
    r = calibrate.compare("deepseek-v3")
    p, e = r["estimate"]["plan"], r["estimate"]
    assert (p.experts, p.expert_parallel, p.top_k, p.active, p.precision) == (256, 64, 8, 37e9, "fp8")
    assert (p.tensor, p.pipeline, p.data_parallel) == (1, 16, 128)
    assert e["dominant"] == "expert" and r["error"] < -GOAL


def test_llama3_long_context_row_runs_the_context_parallel_term():
    """Table 4's CP = 16 row: 131,072-token sequences split over 16 ranks, keys and values all-gathered
    (Llama 3 §3.3.2); d = 16,384 / (8 · 16 · 16) = 8 replicas of 16 sequences. The context term is
    (c − 1)/c of a sequence's K and V per layer: non-zero, and smaller than the compute it sits beside."""
    r = calibrate.compare("llama3-405b-16k-cp16")
    p, t = r["estimate"]["plan"], r["estimate"]["terms"]
    assert (p.context, p.context_algorithm, p.seq_len, p.data_parallel, p.microbatches) == \
        (16, "all-gather", 131072, 8, 16)
    assert 0 < t["context"] < t["compute"]
    assert r["published"] == 380 and r["unit"] == "TFLOP/s (model)"


# The held-out runs issue 57 added, by case prefix and source (written here, not read from the chapter).
NEW_SOURCES = {"nemotron4-340b": "Nemotron-4 340B report, NVIDIA 2024",
               "nemo-": "NeMo 24.07 performance summary, NVIDIA 2024",
               "bridge-": "Megatron-Bridge 25.11 performance summary, NVIDIA 2025",
               "dgxc-": "DGX Cloud Benchmarking Nemotron4 340B 24.11, NVIDIA 2024"}


def _source_of(case: str) -> str | None:
    return next((v for k, v in NEW_SOURCES.items() if case.startswith(k)), None)


def test_issue_57_adds_twelve_or_more_held_out_runs_from_three_or_more_sources():
    """Each from its own layout, with no per-run factor (the file has no efficiency column), marked held
    out; median and worst |error| as measured on 2026-12-07: 7.2 % and 14.3 % (Llama 2 70B)."""
    new = {c: p for c, p in cm.published().items() if _source_of(c)}
    assert len(new) >= 12 and len({_source_of(c) for c in new}) >= 3
    assert "efficiency" not in next(iter(new.values()))
    for case, p in new.items():
        assert p["use"] == "out-of-sample" and p["held_out"] == 1, case
        assert "Table" in p["source"] and "ASSUMED" in p["source"], case
    errors = sorted(abs(calibrate.compare(c)["error"]) for c in new)
    median = (errors[len(errors) // 2 - 1] + errors[len(errors) // 2]) / 2 if len(errors) % 2 == 0 \
        else errors[len(errors) // 2]
    assert median <= 0.08 and max(errors) <= GOAL


def test_held_out_rows_are_marked_and_never_calibrate():
    """The column says held out exactly where use says out-of-sample; the fits read SC21 Table 1 only,
    whose layouts none of the held-out runs share."""
    for case, p in cm.published().items():
        assert (p["use"] == "out-of-sample") == (p["held_out"] == 1), case
    fit = calibrate.fit_gemm_efficiency()
    assert [r["params"] for r in fit["rows"]] == [r["params"] for r in calibrate.in_sample()]


def test_every_held_out_miss_names_the_term_it_lacks():
    from lesson_lib.chapters.ch07_published import LACKS

    for case in HELD_OUT:
        if abs(calibrate.compare(case)["error"]) > GOAL:
            assert case in LACKS and case in MISSES, case


def test_the_distributed_optimizer_shards_over_data_and_context_ranks():
    # Llama 3.1 405B on 128 B200s (Megatron-Bridge 25.11): t 4, p 8, c 2, so d = 2; Megatron shards the
    # optimizer over d·c = 4 ranks, as the gradient ring runs over them: 2 + 2 + 12/4 bytes per parameter
    # of the 405e9 / (4·8) = 12.66e9 each GPU holds
    mem = cm.memory(cm.published_plan("bridge-llama31-405b-b200"))
    shard = 405e9 / 32
    states = mem["params"] + mem["grads"] + mem["optimizer"]
    assert states == pytest.approx((2 + 2 + 12 / 4) * shard, rel=1e-12)


def test_torchtitan_llama3_8b_fp8_gain_and_weak_scaling():
    """torchtitan's benchmark (December 2024), Llama 3.1 8B with FSDP: Float8 with torch.compile ran
    8,532 and 8,380 tokens/s per GPU on 8 and 128 H100s against 6,667 and 6,514 without (1.28×, 1.29×);
    the model's FP8 gain lands within 5 %. Weak-scaled from 8 to 128 GPUs the measured step grew
    5,762/5,605 − 1 = 2.8 %: the model's grows, by less (the term it lacks, printed in chapter 7)."""
    from lesson_lib.chapters.ch07_published import torchtitan_llama3_8b

    for n, gain in ((8, 8532 / 6667), (128, 8380 / 6514)):
        bf16, fp8 = (cm.step_time(torchtitan_llama3_8b(n, p))["step"] for p in ("bf16", "fp8"))
        model = bf16 / fp8
        assert abs(model / gain - 1) < 0.05, (n, model, gain)
    grow = cm.step_time(torchtitan_llama3_8b(128))["step"] / cm.step_time(torchtitan_llama3_8b(8))["step"] - 1
    assert 0 < grow < 5762 / 5605 - 1
