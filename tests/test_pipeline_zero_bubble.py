"""Chapter 3: the zero-bubble schedule ZB-H1 (Qi et al., 2024) — its order, its replay against the
paper's bubble, its messages, the split backward, and real ranks against one process and 1F1B."""

from fractions import Fraction

import pytest
import torch

from lesson_lib import numerics, run
from lesson_lib.costmodel import bubble_formula
from lesson_lib.milestones import pipeline as pp
from lesson_lib.milestones.pipeline import zero_bubble as zb
from lesson_lib.milestones.pipeline import zero_bubble_stage as zbs
from lesson_lib.milestones.pipeline.schedules import all_actions, idle_share, replay

pytestmark = pytest.mark.ch3
GRID = [(p, m) for p in range(1, 7) for m in range(1, 13)]
SCHEDULES = {"zb-h1": zb.all_zb_h1, "1f1b, B and W split": zb.split_1f1b}
SMALL = dict(steps=3, global_batch=24, hidden=16, depth=3, d_in=8, classes=4, samples=256)


def _close(a, b):  # test_pipeline's tolerance: float32 sums in another order
    torch.testing.assert_close(torch.as_tensor(a), torch.as_tensor(b), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- the schedule


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("p, m", GRID)
def test_schedule_properties(name, p, m):
    acts = SCHEDULES[name](p, m)
    for k, a in enumerate(acts):
        where = f"{name}, stage {k} of P={p}, M={m}: {' '.join(f'{x}{i}' for x, i in a)}"
        want = [(x, i) for x in "FBW" for i in range(m)]
        assert sorted(a) == sorted(want), f"not each F, B and W exactly once: {where}"
        assert all(a.index(("F", i)) < a.index(("B", i)) for i in range(m)), f"a B before its F: {where}"
        assert all(a.index(("B", i)) < a.index(("W", i)) for i in range(m)), f"a W before its B: {where}"
        for kind in "FBW":  # each direction of each link carries micro-batches in order
            assert [i for x, i in a if x == kind] == list(range(m)), f"{kind} out of order: {where}"
        w = min(p - k - 1, m)
        assert [x for x, _ in a[:w + 1]] == ["F"] * w + ["F" if w < m else "B"], f"warm-up: {where}"
        held = zb.max_in_flight(a)
        expected = min(p, m) if name == "zb-h1" else min(p - k, m)
        assert held == expected, f"{held} micro-batches from F to W, expected {expected}: {where}"
    zb.replay(acts, zb.equal_durations(acts))  # raises if it deadlocks
    if name != "zb-h1":  # 1F1B also runs with its gradient sent after W (one backward call)
        zb.replay(acts, zb.equal_durations(acts), whole_backward=True)


@pytest.mark.parametrize("p, m", [(p, m) for p, m in GRID if m >= p])
def test_equal_durations_give_the_papers_bubble(p, m):
    # F = B = W = 1 (the paper's assumption; a whole backward is 2). 1F1B as it runs — one backward,
    # the gradient sent after W — idles (P−1)(F+B+W) = 3(P−1) per stage; ZB-H1 (P−1)(F+B−W) = P−1.
    z, one = zb.all_zb_h1(p, m), zb.split_1f1b(p, m)
    got = zb.idle(zb.replay(z, zb.equal_durations(z)))
    base = zb.idle(zb.replay(one, zb.equal_durations(one), whole_backward=True))
    where = f"P={p}, M={m}"
    assert base["idle"] == [3 * (p - 1)] * p == [zb.bubble(p, m)["1f1b"]] * p, f"1f1b, {where}: {base}"
    assert got["idle"] == [p - 1] * p == [zb.bubble(p, m)["zb-h1"]] * p, f"zb-h1, {where}: {got}"
    if p > 1:
        assert Fraction(got["idle"][0], base["idle"][0]) == Fraction(1, 3), where  # the paper's third
    assert got["makespan"] == 3 * m + p - 1 and base["makespan"] == 3 * (m + p - 1), where
    assert got["idle_share"] == Fraction(p - 1, 3 * m + p - 1), where
    assert base["idle_share"] == Fraction(p - 1, m + p - 1), where
    assert got["idle_over_work"] == Fraction(p - 1, 3 * m), where
    assert base["idle_over_work"] == Fraction(p - 1, m), where
    # 1F1B's replay here is the chapter's 1F1B replay (F = 1, B = 2), whose bubble is the formula
    acts = all_actions("1f1b", p, m)
    plain = replay(acts, {(k, x, i): 1 if x == "F" else 2 for k, a in enumerate(acts) for x, i in a})
    assert float(base["idle_share"]) == pytest.approx(idle_share(plain))
    assert idle_share(plain) == pytest.approx(bubble_formula(p, m))


@pytest.mark.parametrize("f, b, w", [(1, 1, 1), (2, 1, 1), (1, 2, 1), (2, 2, 1), (3, 2, 2), (2, 3, 2),
                                     (2, 2, Fraction(1, 2))])
def test_unequal_durations_give_p_minus_1_times_f_plus_b_minus_w_while_w_is_the_shortest(f, b, w):
    for p, m in [(2, 2), (3, 5), (4, 4), (4, 9), (5, 10)]:
        z, one = zb.all_zb_h1(p, m), zb.split_1f1b(p, m)
        got = zb.idle(zb.replay(z, zb.equal_durations(z, f, b, w)))["idle"]
        base = zb.idle(zb.replay(one, zb.equal_durations(one, f, b, w), whole_backward=True))["idle"]
        early = zb.idle(zb.replay(one, zb.equal_durations(one, f, b, w)))["idle"]
        where = f"F={f}, B={b}, W={w}, P={p}, M={m}"
        assert got == [(p - 1) * (f + b - w)] * p, f"zb-h1, {where}: {got}"
        assert base == [(p - 1) * (f + b + w)] * p, f"1f1b, {where}: {base}"
        assert early == [(p - 1) * (f + b)] * p, f"1f1b sending B first, {where}: {early}"


@pytest.mark.parametrize("p, m", [(p, m) for p, m in GRID if m < p])
def test_fewer_microbatches_than_stages_still_never_idle_more_than_1f1b(p, m):
    z, one = zb.all_zb_h1(p, m), zb.split_1f1b(p, m)
    got = zb.idle(zb.replay(z, zb.equal_durations(z)))["idle"][0]
    base = zb.idle(zb.replay(one, zb.equal_durations(one), whole_backward=True))["idle"][0]
    assert p - 1 <= got <= base, f"zb-h1, P={p}, M={m}: idle {got}, 1f1b {base}"


@pytest.mark.parametrize("p, m", GRID)
def test_messages_are_1f1bs(p, m):
    n = zb.messages(zb.all_zb_h1(p, m))
    assert n == zb.messages(zb.split_1f1b(p, m)) == {"activations": (p - 1) * m, "grads": (p - 1) * m}, (p, m)


def test_order_by_hand_and_against_torch():
    # P = 4, M = 6, stage 1: two warm-up forwards, then F/B pairs; its first W comes after its 2nd B
    order = " ".join(f"{x}{i}" for x, i in zb.zb_h1_actions(4, 6, 1))
    assert order == "F0 F1 F2 B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 B4 W3 B5 W4 W5"
    try:  # torch builds ZB1P (= ZB-H1 with one stage per rank) in a private helper: compare if it is there
        from types import SimpleNamespace

        from torch.distributed.pipelining.schedules import ScheduleInterleavedZeroBubble
        from torch.distributed.pipelining.schedules import _ComputationType as C
        kind = {C.FORWARD: "F", C.BACKWARD_INPUT: "B", C.BACKWARD_WEIGHT: "W"}
    except (ImportError, AttributeError) as e:
        pytest.skip(f"torch's zero-bubble schedule is not where it was: {e}")
    for p, m in GRID:
        rounds = max(1, m // p)
        if m % rounds:
            continue  # torch refuses these
        me = SimpleNamespace(n_local_stages=1, microbatches_per_round=m // rounds, pp_group_size=p,
                             _n_microbatches=m)
        for k in range(p):
            theirs = [(kind[a.computation_type], a.microbatch_index)
                      for a in ScheduleInterleavedZeroBubble._calculate_single_rank_operations(me, k) if a]
            assert theirs == zb.zb_h1_actions(p, m, k), f"zb-h1, stage {k} of P={p}, M={m}"


def test_a_schedule_that_deadlocks_and_bad_input():
    bad = zb.all_zb_h1(2, 2)
    bad[0] = [("W", 0)] + [a for a in bad[0] if a != ("W", 0)]  # a W before its own B
    with pytest.raises(ValueError, match="deadlocks"):
        zb.replay(bad, zb.equal_durations(bad))
    bad = zb.all_zb_h1(2, 2)
    bad[1] = [("B", 0)] + [a for a in bad[1] if a != ("B", 0)]  # a B before its F
    with pytest.raises(ValueError, match="deadlocks"):
        zb.replay(bad, zb.equal_durations(bad))
    for args, name in [((0, 4, 0), "stages"), ((2, 0, 0), "microbatches"), ((2, 4, 2), "stage")]:
        with pytest.raises(ValueError, match=name):
            zb.zb_h1_actions(*args)
    # ZB-H1's order needs the gradient to leave after B: a stage that sent it only after W would
    # wait for a W that its neighbour holds back behind a forward that waits for this stage
    z = zb.all_zb_h1(3, 3)
    with pytest.raises(ValueError, match="deadlocks"):
        zb.replay(z, zb.equal_durations(z), whole_backward=True)
    with pytest.raises(ValueError, match="recompute"):
        pp.Config(stages=2, schedule="zb-h1", recompute=True, **SMALL).validate()


# --------------------------------------------------------------------------- the split backward


@pytest.mark.parametrize("first", [True, False])
def test_b_computes_no_weight_gradient_and_b_plus_w_is_the_backward(first):
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    stage = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16),
                                torch.nn.ReLU())
    x, g = torch.randn(5, 8, requires_grad=not first), torch.randn(5, 16)
    for p in stage.parameters():
        p.grad = torch.zeros_like(p)
    out, outs = zbs.forward_keeping(stage, x)
    with FlopCounterMode(display=False) as b_count:
        dx, douts = zbs.backward_input(out, x, outs, g)
    assert all(not p.grad.any() for p in stage.parameters())  # B left the weights' gradients alone
    with FlopCounterMode(display=False) as w_count:
        zbs.backward_weight([stage[0], stage[2]], outs, douts)
    # each Linear's input gradient is one matmul, its weight gradient another: 2·rows·in·out FLOPs each
    inputs = 2 * 5 * 16 * 16 + (0 if first else 2 * 5 * 8 * 16)
    assert b_count.get_total_flops() == inputs
    assert w_count.get_total_flops() == 2 * 5 * 8 * 16 + 2 * 5 * 16 * 16
    ref = [p.grad.clone() for p in stage.parameters()]
    for p in stage.parameters():
        p.grad = None
    x2 = x.detach().requires_grad_(not first)
    stage(x2).backward(g)  # the whole backward, at once
    for a, b in zip(ref, stage.parameters(), strict=True):
        assert torch.equal(a, b.grad)
    assert (dx is None) == first and (first or torch.equal(dx, x2.grad))


# --------------------------------------------------------------------------- on real ranks


@pytest.mark.parametrize("P, M", [(2, 4), (4, 4), (4, 2), (2, 3)])
def test_zb_h1_on_real_ranks_equals_one_process_and_1f1b(clusters, P, M):
    cfg = pp.Config(stages=P, schedule="zb-h1", microbatches=M, **SMALL).validate()
    outs = clusters(P).run(pp.worker, cfg)
    ours, ref = pp.state(outs), pp.reference(cfg)
    for key in ("losses", "grads", "params"):
        _close(ours[key], ref[key])
    g = pp.gaps(ours, ref)  # and within the chapter's own check (its §2 and interleaved cells)
    assert max(g.values()) <= numerics.pipeline_tolerance(microbatches=M, steps=cfg.steps, depth=cfg.depth), g
    one = pp.state(clusters(P).run(pp.worker, cfg.replace(schedule="1f1b")))
    # the same matmuls, and each weight gradient added in micro-batch order: 1F1B's, bit for bit
    assert ours["losses"] == one["losses"] and torch.equal(ours["params"], one["params"]), (P, M)
    assert [o["max_in_flight"] for o in outs] == [min(P, M)] * P


def test_zb_h1_run_counts_1f1bs_messages_and_records_w(clusters):
    P, M = 3, 6
    cfg = pp.Config(stages=P, schedule="zb-h1", microbatches=M, **SMALL)
    r = run("pipeline", cfg, cluster=clusters(P))
    one = run("pipeline", cfg.replace(schedule="1f1b"), cluster=clusters(P))
    assert r["messages_per_microbatch"] == {"send_activation": P - 1, "send_grad": P - 1}
    for k in range(P):  # per rank, the same calls and bytes as 1F1B
        for op in ("send_activation", "send_grad", "recv_activation", "recv_grad"):
            mine, theirs = (x.per_rank[k]["ops"].get(op) for x in (r, one))
            assert (mine and (mine["calls"], mine["bytes_sent"], mine["bytes_recv"])) == \
                (theirs and (theirs["calls"], theirs["bytes_sent"], theirs["bytes_recv"])), (k, op)
        for step in range(cfg.steps):
            mine = [e for e in r["events"] if e["rank"] == k and e["step"] == step]
            for kind in ("forward", "backward", "weight"):
                assert sorted(e["microbatch"] for e in mine if e["kind"] == kind) == list(range(M)), (k, kind)
    assert r["bubble_formula"] == pytest.approx((P - 1) / (3 * M + P - 1))
    assert all(0 <= b["busy"] < 1 and 0 <= b["wall"] < 1 for b in r["bubble_per_step"])
    assert r["max_in_flight"] == [P] * P
