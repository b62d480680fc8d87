"""The planner's terms off the published runs' beaten path, each worked by hand here from the papers'
formulas and the link rows of data/links.csv (read with csv, not through the library): nothing
hidden (overlap 0), context parallelism with and without recomputation, expert parallelism beside
it, and the interleaved schedule's activations (chunks > 1)."""

import csv
import math
from pathlib import Path

import pytest

from lesson_lib import costmodel as cm

pytestmark = pytest.mark.ch7

ROOT = Path(__file__).resolve().parent.parent
with open(ROOT / "data" / "links.csv", newline="") as f:
    # id -> (α in seconds, β in seconds per byte): latency_us and bandwidth_gbps (GB/s each way)
    LINKS = {r["id"]: (float(r["latency_us"]) * 1e-6, 1 / (float(r["bandwidth_gbps"]) * 1e9))
             for r in csv.DictReader(f)}
A100, EFF = 312e12, 0.549  # A100 bf16 dense peak (datasheet); the efficiency fitted on SC21 Table 1

L, H, S = 8, 1024, 2048
PSI = 12 * L * H * H  # 100,663,296: GPT's 12·L·h² (no embedding), so the shape is exactly (8, 1024)


def _plan(**kw):
    base = dict(params=PSI, tokens=1e12, devices=16, layers=L, hidden=H, heads=8, seq_len=S, micro_batch=1,
                batch_tokens=16 * S, recompute="none", efficiency=EFF)  # the constant: e(x) is tested apart
    return cm.Plan(**{**base, **kw}).validate()


def _compute_s(plan_devices=16, tokens=16 * S, recompute=False):
    per_token = 6 * PSI + 12 * L * H * S + (2 * PSI + 4 * L * H * S if recompute else 0)
    return per_token * tokens / (plan_devices * A100 * EFF)


@pytest.mark.parametrize("overlap", [0.0, 1.0])
def test_the_data_parallel_ring_spans_d_times_c_and_hides_only_what_compute_covers(overlap):
    # c = 2 context ranks hold the same weights as their data-parallel peers: the gradient ring runs
    # over d·c = 16 ranks: 2(16−1) messages and 2·15/16 of the 2Ψ bf16 gradient bytes (chapter 2)
    plan = _plan(context=2, overlap=overlap)
    assert plan.data_parallel == 8
    alpha, beta = LINKS["ib-hdr"]
    lat, bw = 2 * 15 * alpha, 2 * 15 / 16 * 2 * PSI * beta
    t = cm.step_time(plan)
    assert math.isclose(t["compute"], _compute_s(), rel_tol=1e-9)
    # at most what the compute lasts, and never the last bucket: Megatron's max(4e7, 1e6·16) = 4e7 bf16
    # gradients (8e7 bytes of the 2Ψ = 2.01e8) in a ring over the 16 ranks after the backward
    last = 2 * 15 * alpha + 2 * 15 / 16 * 8e7 * beta
    hidden = min(overlap, t["compute"] / (lat + bw), 1 - last / (lat + bw))
    assert math.isclose(t["latency"], (1 - hidden) * lat, rel_tol=1e-9, abs_tol=1e-15)
    assert math.isclose(t["bandwidth"], (1 - hidden) * bw, rel_tol=1e-9, abs_tol=1e-15)
    if overlap == 0.0:  # nothing hidden: the whole exchange shows
        assert t["bandwidth"] == pytest.approx(bw) and t["bandwidth"] > 0


@pytest.mark.parametrize("algorithm, recompute, messages, kv_multiple", [
    # per block and micro-batch: all-gather K/V forward, reduce-scatter their gradients backward
    # (Llama 3 §3.3.2); ring: c−1 steps forward, twice that backward (Liu et al. 2023); full
    # recomputation repeats the forward's exchange. c = 2: one message, half the K/V bytes each.
    ("all-gather", "none", 2, 2 * 0.5), ("all-gather", "full", 3, 3 * 0.5),
    ("ring", "none", 3, 3 * 0.5), ("ring", "full", 4, 4 * 0.5),
])
def test_the_context_term_by_hand(algorithm, recompute, messages, kv_multiple):
    plan = _plan(context=2, context_algorithm=algorithm, recompute=recompute)
    kv = 2 * 2 * S * 1 * H  # bf16 K and V of the whole sequence, one micro-batch, all heads (no GQA)
    blocks_times_m = L * 2  # 8 blocks, 2 micro-batches (16 sequences over d = 8, one at a time)
    alpha, beta = LINKS["nvlink3"]  # t·c = 2 ≤ 8: within a node
    want = blocks_times_m * (messages * alpha + kv_multiple * kv * beta)
    assert math.isclose(cm.step_time(plan)["context"], want, rel_tol=1e-9)


def test_grouped_query_attention_sends_fewer_keys_and_values():
    full, gqa = (cm.step_time(_plan(context=2, kv_heads=k))["context"] for k in (0, 2))
    alpha, _ = LINKS["nvlink3"]
    # 2 of 8 heads' K and V: a quarter of the bytes, the same number of messages
    assert math.isclose(gqa - L * 2 * 2 * alpha, (full - L * 2 * 2 * alpha) / 4, rel_tol=1e-9)


@pytest.mark.parametrize("recompute, all_to_alls", [("none", 4), ("full", 6)])
def test_the_expert_term_beside_context_parallelism(recompute, all_to_alls):
    # e = 4 expert ranks (from d·c), top-2: per MoE block and micro-batch, all-to-alls of (e−1)/e of
    # the k·s/c·b·h bf16 token bytes a rank holds, e−1 messages each; 4, or 6 with full recomputation
    plan = _plan(context=2, experts=8, expert_parallel=4, top_k=2, active_params=PSI / 2, recompute=recompute)
    tokens = 2 * (S // 2) * 1 * H  # bf16, this rank's half of each sequence
    alpha, beta = LINKS["nvlink3"]  # t·e = 4 ≤ 8
    want = L * 2 * all_to_alls * (3 * alpha + 3 / 4 * 2 * tokens * beta)
    assert math.isclose(cm.step_time(plan)["expert"], want, rel_tol=1e-9)


@pytest.mark.parametrize("chunks", [1, 2])  # 8 layers over 4 stages: at most 2 chunks of one layer
def test_the_interleaved_schedule_holds_more_activations_on_the_first_stage(chunks):
    # P = 4 stages of 2 layers, M = 8 micro-batches per step: 1F1B holds min(P, M) = 4 micro-batches of
    # its 2 layers; interleaving with v chunks 1 + (P−1)/(P·v) times that (Korthikanti 2022 §4.2.3)
    plan = _plan(devices=32, pipeline=4, chunks=chunks, batch_tokens=64 * S)
    assert plan.data_parallel == 8 and plan.microbatches == 8
    per_layer = S * 1 * H * (10 + 24 + 5 * 8 * S / H)  # Korthikanti Table 2, t = 1, no recomputation
    held = 2 * 4 * (1 + 3 / (4 * chunks) if chunks > 1 else 1)
    assert math.isclose(cm.memory(plan)["activations"], held * per_layer, rel_tol=1e-9)


@pytest.mark.parametrize("chunks", [1, 2])
def test_the_pipeline_messages_grow_with_the_chunks_by_hand(chunks):
    # P = 4, d = 8, M = 8 micro-batches of one sequence, nothing hidden. Data parallel: a ring over
    # d = 8 of each stage's bf16 gradients, 2·Ψ/P bytes: 2·7 messages and 2·7/8 of the bytes. Pipeline:
    # each micro-batch crosses v·P − 1 boundaries each way; a rank sends v of them per direction,
    # 2·v·M messages of one activation, 2·s·b·h bf16 bytes (SC21 §2.2; chapter 3)
    plan = _plan(devices=32, pipeline=4, chunks=chunks, batch_tokens=64 * S)
    alpha, beta = LINKS["ib-hdr"]
    t = cm.step_time(plan)
    assert math.isclose(t["latency"], (2 * 7 + 2 * chunks * 8) * alpha, rel_tol=1e-9)
    ring_bytes = 2 * 7 / 8 * 2 * PSI / 4
    assert math.isclose(t["bandwidth"], (ring_bytes + 2 * chunks * 8 * 2 * S * 1 * H) * beta, rel_tol=1e-9)
