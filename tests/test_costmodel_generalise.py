"""Chapter 7's cost model beyond its first calibration (issue 57, "what generalises"): Blackwell
devices and RoCE/NVLink 5 links, the embedding out of the matmul FLOPs, grouped-query attention's
activations, the efficiency from the GEMM shapes, the exposed data-parallel bucket and FP8's bf16
parts. Every expected number is worked by hand here from the datasheets' and papers' figures (the
CSV files read with csv, not through the library)."""

import csv
from pathlib import Path

import pytest

from lesson_lib import costmodel as cm

pytestmark = pytest.mark.ch7

ROOT = Path(__file__).resolve().parent.parent


def _csv(name: str) -> dict[str, dict]:
    with open(ROOT / "data" / name, newline="") as f:
        return {r["id"]: r for r in csv.DictReader(f)}


def test_blackwell_devices_and_their_links_from_the_datasheets():
    dev, link = _csv("devices.csv"), _csv("links.csv")
    # HGX B200: 36 PFLOP/s BF16 with sparsity for 8 GPUs, halved for dense; DGX B200: 72 PFLOP/s FP8 sparse,
    # 1,440 GB and 64 TB/s for 8 GPUs. GB200 NVL72: 360 / 720 PFLOP/s sparse, 13.4 TB, 576 TB/s for 72 GPUs.
    assert float(dev["b200"]["peak_tflops"]) == 36e3 / 8 / 2 == 2250
    assert float(dev["b200"]["fp8_tflops"]) == 72e3 / 8 / 2 == 4500
    assert (float(dev["b200"]["memory_gb"]), float(dev["b200"]["hbm_tbs"])) == (1440 / 8, 64 / 8)
    assert float(dev["gb200"]["peak_tflops"]) == 360e3 / 72 / 2 == 2500
    assert float(dev["gb200"]["fp8_tflops"]) == 720e3 / 72 / 2 == 5000
    assert float(dev["gb200"]["memory_gb"]) == round(13.4e3 / 72)
    assert float(dev["gb200"]["hbm_tbs"]) == 576 / 72
    assert (int(dev["gb200"]["nvlink_domain"]), int(dev["b200"]["nvlink_domain"])) == (72, 8)
    # NVLink 5: 1.8 TB/s per GPU both ways together, so 900 GB/s each way; RoCE: 400 Gb/s = 50 GB/s
    assert float(link["nvlink5"]["bandwidth_gbps"]) == 1.8e3 / 2
    assert float(link["roce-400g"]["bandwidth_gbps"]) == 400 / 8
    for row in (dev["b200"], dev["gb200"], link["nvlink5"], link["roce-400g"]):
        assert "datasheet" in row["source"] and ("2024" in row["source"] or "2022" in row["source"])
    # usable from a Plan: the FP8 peak and the NVLink domain come from the table
    assert cm.plan.FP8_PEAK_FLOPS["gb200"] == 5000e12 and "a100-80gb" not in cm.plan.FP8_PEAK_FLOPS
    assert cm.devices()["gb200"]["domain"] == 72


def test_a_gb200_nvl72_keeps_context_parallel_traffic_on_nvlink_where_a_dgx_cannot():
    # t = 8, c = 8: 64 GPUs per context group, inside a 72-GPU NVLink domain, outside an 8-GPU DGX
    base = dict(params=1e9, tokens=1e12, devices=64, tensor=8, context=8, seq_len=8192, batch_tokens=8192,
                layers=8, hidden=1024, heads=8, link="roce-400g", intra_link="nvlink5", recompute="none",
                efficiency=0.5)
    nvl = cm.step_time(cm.Plan(device="gb200", **base))
    dgx = cm.step_time(cm.Plan(device="b200", **base))
    # all-gather of K and V (bf16, 2·2·s·h/t bytes per layer) forward, reduce-scatter backward, 7 steps each:
    # (1 + 1)·(c − 1)/c·kv per block, 8 blocks; α counts 2·(c − 1) messages per block
    kv = 2 * 2 * 8192 * 1024 / 8
    b, a = 8 * 2 * 7 / 8 * kv, 8 * 2 * 7
    assert nvl["context"] == pytest.approx(a * 2e-6 + b / 900e9, rel=1e-9)
    assert dgx["context"] == pytest.approx(a * 5e-6 + b / 50e9, rel=1e-9)


def test_an_untied_input_embedding_is_a_lookup_not_a_matmul():
    # PaLM's MFU (Chowdhery et al. 2022, App. B) counts 6·N matmul FLOPs per token; an untied input
    # embedding's V·h parameters are a table lookup. Llama 3 405B's shape: L = 126, h = 16,384, V = 128,000,
    # s = 8,192 (Dubey et al. 2024, Table 3), 405e9 parameters with both V·h tables.
    L, h, V, s, psi = 126, 16384, 128000, 8192, 405e9
    base = dict(params=psi, tokens=1e12, devices=8, layers=L, hidden=h, heads=128, seq_len=s, vocab=V,
                batch_tokens=8 * s, recompute="none", efficiency=0.5)
    untied = cm.flops(cm.Plan(**base, tied_embeddings=False))
    tied = cm.flops(cm.Plan(**base))
    by_hand = (6 * (405e9 - 128000 * 16384) + 12 * 126 * 16384 * 8192) * 8 * 8192
    assert untied["model_flops"] == pytest.approx(by_hand, rel=1e-12)
    assert untied["hardware_flops"] == pytest.approx(by_hand, rel=1e-12)  # nothing recomputed
    assert tied["model_flops"] - untied["model_flops"] == pytest.approx(6 * V * h * 8 * 8192, rel=1e-9)
    # full recomputation repeats the layers' forward, 2·(N − V·h): neither the lookup nor the head
    full = cm.flops(cm.Plan(**{**base, "recompute": "full"}, tied_embeddings=False))
    assert full["hardware_flops"] - untied["hardware_flops"] == pytest.approx(
        (2 * (405e9 - 2 * V * h) + 4 * L * h * s) * 8 * 8192, rel=1e-12)
    with pytest.raises(ValueError, match="tied_embeddings"):
        cm.Plan(**{**base, "vocab": 0}, tied_embeddings=False).validate()


def test_the_llama_rows_are_untied_and_count_their_lookup_out():
    for case in ("llama3-405b-8k", "deepseek-v3", "llama-65b"):
        assert cm.published_plan(case).tied_embeddings is False, case
    assert cm.published_plan("gpt-1t").tied_embeddings is True  # Megatron's GPT ties them (SC21)
