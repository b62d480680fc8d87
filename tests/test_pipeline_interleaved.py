"""Chapter 3: the interleaved 1F1B schedule (Narayanan et al., 2021) — its order, its replay on the
ideal machine, its bubble against the formula, its messages and what each rank holds."""

from fractions import Fraction

import pytest

from lesson_lib.costmodel import bubble_formula
from lesson_lib.milestones.pipeline import interleaved as il
from lesson_lib.milestones.pipeline.schedules import all_actions, idle_share, replay, stage_actions

pytestmark = pytest.mark.ch3
CASES = [(p, v, m) for p in (2, 3, 4) for v in (1, 2, 3) for m in (p, 2 * p, 4 * p)]


@pytest.mark.parametrize("p, v, m", CASES)
def test_order_and_no_deadlock(p, v, m):
    acts = il.all_interleaved(p, m, v)
    for r, a in enumerate(acts):
        want = [(x, c, i) for x in "FB" for c in range(v) for i in range(m)]
        assert sorted(a) == sorted(want) and len(a) == len(set(a))  # each (chunk, micro-batch) once
        assert all(a.index(("F", c, i)) < a.index(("B", c, i)) for c in range(v) for i in range(m))
        for x in "FB":  # each chunk's forwards and backwards run micro-batches in order
            for c in range(v):
                assert [i for y, d, i in a if (y, d) == (x, c)] == list(range(m))
        w = il.warmup_forwards(p, m, v, r)
        assert all(x == "F" for x, *_ in a[:w]) and (w == v * m or a[w + 1][0] == "B")
    il.replay_interleaved(acts, il.equal_durations(acts, v))  # raises if it deadlocks


@pytest.mark.parametrize("p, m", [(p, m) for p in (1, 2, 3, 4, 5) for m in range(1, 13)])
def test_one_chunk_is_1f1b(p, m):
    acts = il.all_interleaved(p, m, 1)
    assert [[(x, i) for x, _, i in a] for a in acts] == all_actions("1f1b", p, m)
    assert [(x, i) for x, _, i in il.interleaved_actions(p, m, 1, 0)] == stage_actions("1f1b", p, m, 0)
    durations = {(r, x, 0, i): 1.0 if x == "F" else 2.0 for r, a in enumerate(acts) for x, _, i in a}
    spans = il.replay_interleaved(acts, durations)
    plain = replay(all_actions("1f1b", p, m), {(r, x, i): d for (r, x, _, i), d in durations.items()})
    assert {(r, x, i): s for (r, x, _, i), s in spans.items()} == plain


@pytest.mark.parametrize("p, v, m", CASES + [(4, 4, 8), (2, 4, 2), (4, 2, 8)])
def test_in_flight_is_bounded(p, v, m):
    for r, a in enumerate(il.all_interleaved(p, m, v)):
        # w warm-up forwards, then one more before the first backward frees one: min(w + 1, v·M)
        assert il.max_in_flight(a) == il.in_flight_bound(p, m, v, r) <= min(2 * p - 1 + (v - 1) * p, v * m)
        if v == 1:
            assert il.max_in_flight(a) == min(p - r, m)  # plain 1F1B's bound


@pytest.mark.parametrize("p, v, m", CASES + [(4, 4, 8), (4, 4, 4)])
def test_equal_chunks_give_exactly_the_formula_bubble(p, v, m):
    # F = 1 and B = 2 per whole stage, so 1/v and 2/v per chunk. Work per rank: 3M. Ideal makespan:
    # the line fills and drains in P − 1 chunk steps of F + B, 3(P − 1)/v, so the idle share is
    # (3(P−1)/v) / (3M + 3(P−1)/v) = (P−1)/(v·M + P − 1); as a share of the ideal 3M, (P−1)/(v·M).
    acts = il.all_interleaved(p, m, v)
    spans = il.replay_interleaved(acts, il.equal_durations(acts, v))
    makespan = max(e for _, e in spans.values())
    assert makespan == 3 * m + Fraction(3 * (p - 1), v)
    assert il.exact_idle_share(spans) == Fraction(p - 1, v * m + p - 1)
    assert idle_share(spans) == pytest.approx(bubble_formula(p, m, v), abs=1e-12)
    assert (makespan - 3 * m) / (3 * m) == Fraction(p - 1, v * m)


@pytest.mark.parametrize("p, v, m", CASES)
def test_messages_rise_v_fold(p, v, m):
    n = il.messages(il.all_interleaved(p, m, v), v)
    assert n == {"activations": (v * p - 1) * m, "grads": (v * p - 1) * m}


def test_first_rank_order_matches_megatron_by_hand():
    # P = 2, M = 4, v = 2, rank 0: warm-up (2 − 0 − 1)·2 + (2 − 1)·2 = 4 forwards: micro-batches 0, 1
    # through chunk 0, then through chunk 1; then 1F1B with backwards from chunk 1 first.
    assert il.interleaved_actions(2, 4, 2, 0) == [
        ("F", 0, 0), ("F", 0, 1), ("F", 1, 0), ("F", 1, 1),
        ("F", 0, 2), ("B", 1, 0), ("F", 0, 3), ("B", 1, 1),
        ("F", 1, 2), ("B", 0, 0), ("F", 1, 3), ("B", 0, 1),
        ("B", 1, 2), ("B", 1, 3), ("B", 0, 2), ("B", 0, 3)]


def test_megatrons_factor_2_costs_no_bubble_on_the_ideal_machine():
    # With free messages, (P − r − 1) + (v − 1)·P warm-up forwards give the same idle share with
    # fewer chunks in flight: the extra P − r − 1 forwards are slack for messages that take time.
    for p, v, m in [c for c in CASES if c[1] > 1]:
        fwd = [("F", c, i) for c, i in il.action_order(p, m, v, True)]
        bwd = [("B", c, i) for c, i in il.action_order(p, m, v, False)]
        acts = []
        for r in range(p):
            w = min(p - r - 1 + (v - 1) * p, v * m)
            acts.append(fwd[:w] + [a for k in range(len(fwd) - w) for a in (fwd[w + k], bwd[k])]
                        + bwd[len(fwd) - w:])
        spans = il.replay_interleaved(acts, il.equal_durations(acts, v))
        assert il.exact_idle_share(spans) == Fraction(p - 1, v * m + p - 1)
        # rank 0 holds v·P chunks (capped at v·M) instead of Megatron's 2P − 1 + (v − 1)·P
        assert il.max_in_flight(acts[0]) == min(v * p, v * m) <= il.in_flight_bound(p, m, v, 0)


@pytest.mark.slow
def test_bench_bubble_adds_interleaved(capsys):
    from lesson_lib.__main__ import load_benchmark

    bench = load_benchmark("bubble")
    rows = bench.measure(schedules=("interleaved",), microbatches=(2,), repeats=1, steps=2)
    assert [(r["schedule"], r["microbatches"]) for r in rows] == [("interleaved", 2)]
    assert rows[0]["formula"] == 1 / 5  # (P − 1)/(v·M + P − 1) with P = 2, v = 2, M = 2
    assert rows[0]["busy_ratio"] == pytest.approx(5 * rows[0]["busy"]) and 0 < rows[0]["wall"] < 1
    bench.show(rows)
    assert "interleaved M=2: busy/formula" in capsys.readouterr().out


def test_a_schedule_that_deadlocks_and_bad_input():
    bad = il.all_interleaved(2, 2, 2)
    bad[1] = [("B", 1, 0)] + [a for a in bad[1] if a != ("B", 1, 0)]
    with pytest.raises(ValueError, match="deadlocks"):
        il.replay_interleaved(bad, il.equal_durations(bad, 2))
    with pytest.raises(ValueError, match="microbatches"):
        il.interleaved_actions(4, 6, 2, 0)
    with pytest.raises(ValueError, match="chunks"):
        il.interleaved_actions(4, 8, 0, 0)
    with pytest.raises(ValueError, match="rank"):
        il.interleaved_actions(4, 8, 2, 4)


# --------------------------------------------------------------------------- on real ranks

SMALL = dict(steps=3, global_batch=24, hidden=16, depth=3, d_in=8, classes=4, samples=256)


@pytest.mark.parametrize("P, v, M", [(2, 2, 4), (3, 2, 6)])  # 2 ranks: both links join the same pair
def test_interleaved_on_real_ranks_equals_single_process_training(clusters, P, v, M):
    import torch

    from lesson_lib import run
    from lesson_lib.milestones import pipeline as pp

    cfg = pp.Config(stages=P, schedule="interleaved", chunks=v, microbatches=M,
                    **{**SMALL, "depth": v * P - 1}).validate()
    r = run("pipeline", cfg, cluster=clusters(P))
    assert r["partition"] == [[s, s + 1] for s in range(v * P)]  # v·P pieces of one layer each
    # each micro-batch crosses v·P − 1 = 3 boundaries each way, counted by the link's ops
    assert r["messages_per_microbatch"] == {"send_activation": v * P - 1, "send_grad": v * P - 1}
    assert r["max_in_flight"] == [il.in_flight_bound(P, M, v, k) for k in range(P)]
    assert r["bubble_formula"] == bubble_formula(P, M, v) and 0 <= r["bubble_busy"] < 1
    ours, ref = pp.state(clusters(P).run(pp.worker, cfg)), pp.reference(cfg)
    for key in ("losses", "grads", "params"):  # float32 sums in another order: the tolerance of
        torch.testing.assert_close(torch.as_tensor(ours[key]), torch.as_tensor(ref[key]),  # test_pipeline
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("options, name", [
    (dict(schedule="interleaved", chunks=2, microbatches=3), "microbatches"),  # 3 is no multiple of 2
    (dict(schedule="1f1b", chunks=2), "chunks"),
    (dict(schedule="interleaved", chunks=3), "chunks"),  # 6 virtual stages, 4 layers
    (dict(schedule="interleaved", chunks=0), "chunks"),
])
def test_bad_interleaved_config_names_the_parameter(options, name):
    from lesson_lib.milestones import pipeline as pp

    with pytest.raises(ValueError, match=name):
        pp.Config(stages=2, **{"microbatches": 4, **options, **{k: v for k, v in SMALL.items()}}).validate()
