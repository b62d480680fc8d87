"""Chapter 7's cost model, new terms: each against a number its paper prints, or worked
by hand in the test (never by calling the function under test for the expected value)."""

import json
import math

import pytest
from conftest import cli_in_process

from lesson_lib import costmodel as cm

pytestmark = pytest.mark.ch7


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8, 12, 1000, 1024])
def test_halving_doubling_and_recursive_doubling_as_mpich_runs_them(n):
    """Thakur, Rabenseifner & Gropp (2005): p′ = 2^⌊log₂N⌋; ranks above p′ fold in and out."""
    s = 1e6
    k = math.floor(math.log2(n))
    p2 = 2**k
    hd, rd = cm.allreduce_terms("halving-doubling", n, s), cm.allreduce_terms("recursive-doubling", n, s)
    if p2 == n:
        assert hd == (2 * k, pytest.approx(2 * (n - 1) / n * s)) and rd == (k, pytest.approx(k * s))
    else:
        assert hd == (2 * k + 2, pytest.approx((2 * (p2 - 1) / p2 + 2) * s))
        assert rd == (k + 2, pytest.approx((k + 2) * s))
    if n == 3:  # the worked case: 4α + 3·S·β
        assert hd == (4, pytest.approx(3 * s))


def test_interleaved_bubble_is_p_minus_1_over_v_m():
    """Narayanan et al. (SC21) §2.2.2: the interleaved schedule's bubble is (p−1)/(v·m) of the ideal."""
    base = dict(params=1e9, tokens=1e12, devices=8, batch_tokens=64 * 2048, layers=16, hidden=1024,
                pipeline=4, recompute=False)
    for v in (1, 2, 4):
        t = cm.step_time(cm.Plan(**base, chunks=v))
        assert math.isclose(t["bubble"], t["compute"] * 3 / (v * 32))  # m = 64 sequences / d = 2
    with pytest.raises(ValueError, match="chunks"):
        cm.Plan(**{**base, "chunks": 8}).validate()  # 4 stages × 8 chunks > 16 layers


def test_activation_memory_per_policy_is_korthikanti_table_2():
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    sbh = s * b * h
    assert cm.layer_activation_bytes(s, b, h, a, 1) == sbh * (34 + 5 * a * s / h)
    assert cm.layer_activation_bytes(s, b, h, a, t, policy="selective") == sbh * (10 + 24 / t)
    assert cm.layer_activation_bytes(s, b, h, a, t, True, "selective") == pytest.approx(sbh * 34 / t)
    assert cm.layer_activation_bytes(s, b, h, a, t, policy="full") == 2 * sbh
    assert cm.layer_activation_bytes(s, b, h, a, t, True, "full") == 2 * sbh / t
    # FlashAttention stores no s×s scores either (Dao et al. 2022): the selective row's bytes
    assert cm.layer_activation_bytes(s, b, h, a, t, flash_attention=True) == sbh * (10 + 24 / t)
    # Korthikanti §5: for GPT-3, 5as/h = 80 of the 114 s·b·h bytes: selective saves 70 %
    saved = 1 - cm.layer_activation_bytes(s, b, h, a, 1, policy="selective") / cm.layer_activation_bytes(
        s, b, h, a, 1)
    assert round(saved, 2) == 0.70
    # the interleaved schedule holds L·(1 + (p−1)/(p·v)) layer-micro-batches (Korthikanti §4.2.3)
    assert cm.pipeline_layers_held(96, 8, 64) == 96
    assert cm.pipeline_layers_held(96, 8, 64, chunks=2) == 96 * (1 + 7 / 16)


def korthikanti_flops(batch, layers, hidden, seq=2048, vocab=51200, selective=False):
    """Korthikanti et al. (2022) §6: model FLOPs 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)); with
    selective recomputation the hardware FLOPs have s/(3h) for s/(6h). Written out here."""
    attn = seq / (3 * hidden) if selective else seq / (6 * hidden)
    return 72 * batch * seq * layers * hidden**2 * (1 + attn + vocab / (12 * layers * hidden))


@pytest.mark.parametrize("name, batch, layers, hidden, gpus, seconds, mfu, hfu", [
    ("22B", 4, 48, 6144, 8, 1.10, 0.415, 0.437), ("175B", 64, 96, 12288, 64, 13.75, 0.514, 0.528),
    ("530B", 280, 105, 20480, 280, 37.83, 0.560, 0.570), ("1T", 512, 128, 25600, 512, 71.49, 0.563, 0.570)])
def test_mfu_and_hfu_reproduce_korthikanti_table_5(name, batch, layers, hidden, gpus, seconds, mfu, hfu):
    """Table 5 prints MFU and HFU for each run with selective recomputation + sequence parallelism."""
    psi = 12 * layers * hidden**2 + 51200 * hidden  # the matmul parameters SC21's 72·B·s·l·h² counts
    tokens = batch * 2048
    model = cm.model_flops_per_token(psi, layers, hidden, 2048) * tokens
    hardware = model + cm.recompute_flops_per_token("selective", psi, layers, hidden, 2048, 51200) * tokens
    assert model == pytest.approx(korthikanti_flops(batch, layers, hidden), rel=1e-12)
    assert hardware == pytest.approx(korthikanti_flops(batch, layers, hidden, selective=True), rel=1e-12)
    peak = gpus * 312e12 * seconds
    tol = 0.005 / seconds * mfu + 0.0006  # the table's seconds to 3-4 digits, its percentages to 0.1
    assert model / peak == pytest.approx(mfu, abs=tol)
    assert hardware / peak == pytest.approx(hfu, abs=tol)


def test_sc21_eq3_is_model_flops_plus_full_recomputation():
    """SC21 Eq. 3 (96·B·s·l·h²·(1 + s/6h + V/16lh)) is PaLM's model FLOPs plus the layers' forward."""
    B, s, L, h, V = 1536, 2048, 96, 12288, 51200
    psi = 12 * L * h**2 + V * h
    per_token = cm.model_flops_per_token(psi, L, h, s) + cm.recompute_flops_per_token("full", psi, L, h, s, V)
    assert per_token * B * s == pytest.approx(cm.sc21_eq3_flops(B, s, L, h, V), rel=1e-12)
    assert cm.sc21_eq3_flops(B, s, L, h, V) == pytest.approx(96 * B * s * L * h**2 * (
        1 + s / (6 * h) + V / (16 * L * h)), rel=1e-15)


def test_mt_nlg_mfu_is_palms_table():
    """PaLM (Chowdhery et al., 2022) Table 3: MT-NLG's MFU is 30.2 %; its 60.1 s per iteration on
    2,240 A100s (Smith et al., 2022) with 6N + 12·L·h·s per token gives it."""
    per_token = cm.model_flops_per_token(530e9, 105, 20480, 2048)
    mfu = per_token * 1920 * 2048 / 60.1 / (2240 * 312e12)
    assert round(mfu, 3) == pytest.approx(0.302, abs=0.0015)
    e = cm.estimate(cm.published_plan("mt-nlg-530b"))
    assert math.isclose(e["mfu"], per_token * 1920 * 2048 / e["step_s"] / (2240 * 312e12), rel_tol=1e-9)
    assert e["hfu"] > e["mfu"]  # full recomputation executes more than the model needs


def test_zero3_gathers_per_microbatch_and_holds_the_microbatch_it_runs():
    """LAMB's bar: 6 sequences per replica as one micro-batch hold 48.9 GB per device; as 6
    micro-batches of 1 they gather the parameters 6 times and LAMB is slower than ZeRO-3 at both
    overlaps (the issue counted the gathers only: 80.6 / 50.2 days; gradients reduce-scattered per
    micro-batch as DeepSpeed does make it slower still)."""
    one = cm.estimate(cm.plan_for("lamb", 175e9, 300e9, 1024))
    assert one["plan"].microbatches == 1 and round(one["memory"]["total"] / 1e9, 1) == 48.9
    for ov in (0.0, 1.0):
        six = cm.estimate(cm.plan_for("lamb", 175e9, 300e9, 1024, micro_batch=1, overlap=ov))
        z3 = cm.estimate(cm.plan_for("zero-3", 175e9, 300e9, 1024, overlap=ov))
        assert six["plan"].microbatches == 6 and six["days"] > z3["days"] > 0
        assert six["memory"]["activations"] < one["memory"]["activations"] / 5
    a, b = cm.zero3_terms(8, 2e9, 2e9, 10, 3)
    assert (a, b) == (3 * 10 * 7 * 3, pytest.approx(7 / 8 * 6e9 * 3))


def test_tensor_parallel_overlap_is_a_band():
    plan = cm.published_plan("korthikanti-175b-full")
    e = cm.estimate(plan)
    hidden = cm.estimate(cm.published_plan("korthikanti-175b-full", tp_overlap=1.0))
    assert e["terms"]["tensor"] > 0 and hidden["terms"]["tensor"] == 0
    assert e["tp_band"] == {"exposed": e["step_s"], "hidden": pytest.approx(hidden["step_s"])}
    half = cm.step_time(cm.published_plan("korthikanti-175b-full", tp_overlap=0.5))
    assert math.isclose(half["tensor"], e["terms"]["tensor"] / 2)


def test_context_and_expert_parallel_terms_by_hand():
    # all-gather CP over 4: per block and micro-batch the K/V gathered (3 steps, 3/4 of the bytes)
    # and their gradients reduce-scattered; ring: K/V and their gradients passed back in the backward
    assert cm.context_parallel_terms(4, 8e6, 2, 3) == (2 * 3 * 2 * 3, pytest.approx(2 * 3 * 2 * 0.75 * 8e6))
    assert cm.context_parallel_terms(4, 8e6, 1, 1, "ring") == (3 * 3, pytest.approx(3 * 0.75 * 8e6))
    assert cm.context_parallel_terms(1, 8e6, 2, 3) == (0.0, 0.0)
    # EP over 8, top-2: 4 all-to-alls per block and micro-batch, 7/8 of 2 tokens' bytes each
    assert cm.expert_parallel_terms(8, 1e6, 2, 1, 1) == (4 * 7, pytest.approx(4 * 7 / 8 * 2e6))
    dense = cm.Plan(10e9, 1e12, 64, tensor=8, batch_tokens=64 * 4096, seq_len=4096)
    moe = cm.Plan(10e9, 1e12, 64, tensor=8, batch_tokens=64 * 4096, seq_len=4096, experts=8,
                  expert_parallel=8, top_k=2, active_params=2.5e9)
    assert cm.flops(moe)["flops"] == cm.flops(dense)["flops"] / 4  # FLOPs follow the active parameters
    assert cm.step_time(moe)["expert"] > 0 == cm.step_time(dense)["expert"]
    assert cm.memory(moe)["params"] < cm.memory(dense)["params"]  # experts spread over 8 ranks
    cp = cm.Plan(10e9, 1e12, 64, tensor=8, context=4, batch_tokens=64 * 4096, seq_len=4096)
    assert cp.data_parallel == 2 and cm.step_time(cp)["context"] > 0
    for bad, name in ((dict(context=3), "context"), (dict(expert_parallel=2), "expert_parallel"),
                      (dict(precision="fp8"), "precision"), (dict(recompute="some"), "recompute"),
                      (dict(tp_overlap=2.0), "tp_overlap")):
        with pytest.raises(ValueError, match=name):
            cm.Plan(10e9, 1e12, 64, tensor=8, batch_tokens=64 * 4096, seq_len=4096, **bad).validate()


def test_cli_takes_the_layout_and_writes_the_json_keys(tmp_path):
    out = tmp_path / "l.json"
    proc = cli_in_process("estimate", "--params", "405e9", "--tokens", "15.6e12", "--device", "h100-sxm",
                          "--link", "ib-ndr", "--intra-link", "nvlink4", "--tensor", "8", "--pipeline",
                          "16", "--data", "64", "--chunks", "7", "--micro-batch-size", "1",
                          "--batch-tokens", str(2048 * 8192), "--seq", "8192", "--layers", "126",
                          "--hidden", "16384", "--heads", "128", "--recompute", "full",
                          "--flash-attention", "--sequence-parallel", "--context", "1", "--precision",
                          "bf16", "--overlap", "1", "--tp-overlap", "0.5", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    row = json.loads(out.read_text())[0]
    assert row["milestone"] == "layout" and row["plan"]["devices"] == 8192
    assert {"step_s", "days", "tflops_per_device", "mfu", "hfu", "fits"} <= set(row)
    assert "interleaved 1F1B with v = 7" in proc.stdout
    moe = cli_in_process("estimate", "--params", "40e9", "--tokens", "1e12", "--data", "64", "--experts",
                         "16", "--expert-parallel", "8", "--active-params", "10e9", "--precision", "fp8",
                         "--device", "h100-sxm")
    assert moe.returncode == 0, moe.stderr
    bad = cli_in_process("estimate", "--params", "1e9", "--tokens", "1e9", "--data", "8", "--recompute", "x")
    assert bad.returncode == 2 and "recompute" in bad.stderr


def test_cli_published_prints_the_prediction_beside_the_paper(tmp_path):
    out = tmp_path / "p.json"
    proc = cli_in_process("estimate", "--published", "korthikanti-175b-full", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "18.13" in proc.stdout and "Korthikanti" in proc.stdout
    row = json.loads(out.read_text())[0]
    assert row["published"] == 18.13 and {"step_s", "mfu", "fits", "error"} <= set(row)
    bad = cli_in_process("estimate", "--published", "gpt-5")
    assert bad.returncode == 2 and "published" in bad.stderr
