"""Chapter 8: every parallel layout of the transformer equals one process (to float32 rounding),
on two world sizes; the collectives' counted bytes equal their formulas; a bad layout is refused
with a ValueError naming the parameter before any rank starts."""

import pytest
import torch

from lesson_lib.chapters import ch08
from lesson_lib.milestones.context_parallel import ring_attention
from lesson_lib.milestones.expert_parallel import moe
from lesson_lib.milestones.tensor_parallel import formulas, tolerances, train
from lesson_lib.milestones.tensor_parallel.dtensor import dtensor_job
from lesson_lib.milestones.tensor_parallel.grid import Layout
from lesson_lib.milestones.tensor_parallel.memory import memory_job
from lesson_lib.milestones.tensor_parallel.model import Config

pytestmark = pytest.mark.ch8
CFG = Config.tiny()


@pytest.fixture(scope="module")
def ref():
    return train.reference(CFG)


# --------------------------------------------------------------------------- bad layouts, before any rank


@pytest.mark.parametrize("call, name", [
    (lambda: Layout(dp=2, tp=2).check(3), "world_size"),
    (lambda: Layout(tp=3).check(3, CFG), "heads"),
    (lambda: Layout(tp=4).check(4, Config(heads=4, ffn=130)), "ffn"),
    (lambda: Layout(tp=2, sequence_parallel=True).check(2, Config(seq=15)), "seq"),
    (lambda: Layout(dp=3).check(3, CFG), "batch"),
    (lambda: Layout(tp=0).check(), "tp"),
    (lambda: moe.MoEConfig(experts=4).check(3), "experts"),
    (lambda: moe.MoEConfig(top_k=3).check(2), "top_k"),
    (lambda: ring_attention.check_sequence(10, 4), "seq"),
    (lambda: ch08.tensor_parallel(world_sizes=(3,)), "heads"),
    (lambda: ch08.composed(dp=3, tp=1), "batch"),
])
def test_a_bad_layout_is_refused_naming_the_parameter(call, name, no_orphans):
    # bug caught: a layout that cannot run reaching the ranks (a hang or an index error on one rank)
    with pytest.raises(ValueError, match=name):
        call()


# --------------------------------------------------------------------------- tensor and sequence parallel


@pytest.mark.numerics
@pytest.mark.parametrize("layout", [Layout(tp=2), Layout(tp=4), Layout(tp=2, sequence_parallel=True),
                                    Layout(tp=4, sequence_parallel=True), Layout(dp=2, tp=2)],
                         ids=["tp2", "tp4", "tp2-sp", "tp4-sp", "dp2-tp2"])
def test_training_on_the_grid_equals_one_process(layout, ref, clusters):
    outs = clusters(layout.world_size).run(train.train_job, CFG, layout.check(layout.world_size, CFG))
    row = ch08.compare(CFG, layout, outs, ref)
    assert row["equal"], row
    assert all(row["gaps"][k] < 1e-3 for k in row["gaps"])  # the tolerance itself is small


def test_the_tolerance_catches_a_real_error(ref):
    # a gradient t times too large (a g whose backward all-reduces) moves parameters by a whole step
    tol = tolerances.transformer(CFG, ref)
    wrong = {k: v + CFG.lr * ref["grads"][k] for k, v in ref["params"].items()}
    assert max(float((wrong[k] - ref["params"][k]).abs().max()) for k in wrong) > 10 * tol["params"]


@pytest.mark.parametrize("t", [2, 4])
def test_tensor_parallel_makes_two_all_reduces_per_block_each_way_with_the_formulas_bytes(t, clusters):
    outs = clusters(t).run(train.train_job, CFG, Layout(tp=t))
    want = formulas.tensor_parallel(CFG, t)
    for o in outs:
        for phase in ("forward", "backward"):
            want_op = {"calls": 2 * CFG.layers, "bytes_sent": want[phase]}
            assert o[phase] == {"tp_all_reduce": want_op}, o[phase]
    assert want["per_all_reduce"] == 2 * (t - 1) / t * 4 * CFG.seq * CFG.batch * CFG.d_model


@pytest.mark.parametrize("t", [2, 4])
def test_sequence_parallel_sends_the_same_bytes_as_the_all_reduces_plus_the_regather(t, clusters):
    outs = clusters(t).run(train.train_job, CFG, Layout(tp=t, sequence_parallel=True))
    tp, sp = formulas.tensor_parallel(CFG, t), formulas.sequence_parallel(CFG, t)
    for o in outs:
        step = {op: s["bytes_sent"] for op, s in o["step"].items()}
        assert step["sp_all_gather"] + step["sp_reduce_scatter"] == tp["forward"] + tp["backward"]
        assert step["sp_regather"] == sp["regather"]
        forward = o["forward"]
        assert forward["sp_all_gather"]["calls"] == forward["sp_reduce_scatter"]["calls"] == 2 * CFG.layers
        assert "tp_all_reduce" not in step


def test_data_parallel_gradients_cost_one_all_reduce_of_the_replica(clusters):
    outs = clusters(4).run(train.train_job, CFG, Layout(dp=2, tp=2))
    for o in outs:
        assert o["step"]["dp_grad_all_reduce"] == {"calls": 1,
                                                  "bytes_sent": formulas.data_parallel(o["param_numel"], 2)}
        tp = formulas.tensor_parallel(CFG, 2, dp=2)  # each replica's activations: half the batch
        assert o["step"]["tp_all_reduce"]["bytes_sent"] == tp["forward"] + tp["backward"]


# --------------------------------------------------------------------------- experts and the ring


@pytest.mark.numerics
@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("cf, k", [(1.0, 1), (2.0, 1), (1.0, 2), (2.0, 2)])
def test_expert_parallel_moe_equals_one_process_and_counts_its_all_to_alls(n, cf, k, clusters):
    cfg = moe.MoEConfig(capacity_factor=cf, top_k=k).check(n)
    ref = moe.reference_moe(cfg, n)
    outs = clusters(n).run(moe.moe_job, cfg)
    tol, e = tolerances.moe(cfg, ref), cfg.experts // n
    assert float((torch.stack([o["y"] for o in outs]) - ref["y"]).abs().max()) <= tol["y"]
    assert float((torch.stack([o["x_grad"] for o in outs]) - ref["x_grad"]).abs().max()) <= tol["x_grad"]
    for r, o in enumerate(outs):
        assert float((o["w1_grad"] - ref["w1_grad"][r * e:(r + 1) * e]).abs().max()) <= tol["w1_grad"]
        assert float((o["router_grad"] - ref["router_grad"]).abs().max()) <= tol["router_grad"]
        assert o["dropped"] == ref["dropped"][r]
        one = formulas.all_to_all(cfg.experts, cfg.capacity, cfg.d_model, n)
        assert o["forward"]["ep_all_to_all"]["calls"] == 2 and o["step"]["ep_all_to_all"]["calls"] == 4
        assert o["step"]["ep_all_to_all"]["bytes_sent"] == 4 * one
    assert (sum(ref["dropped"]) > 0) == (cf == 1.0)  # capacity factor 1 drops tokens here, 2 none


def test_top_2_gates_sum_to_one_and_first_choices_take_the_slots_first():
    x = torch.tensor([[2.0, 1.0, 0, 0]] * 3 + [[0, 2.0, 1.0, 0]] * 3)  # 3 tokens prefer expert 0 then 1,
    r = moe.route(x, 10 * torch.eye(4), capacity=3, top_k=2)          # 3 prefer expert 1 then 2
    assert r["tokens"] == 6 and r["token"].tolist() == [0, 1, 2, 3, 4, 5] * 2
    per_token = torch.zeros(6).index_add(0, r["token"], r["gate"])
    assert torch.allclose(per_token, torch.ones(6))
    # expert 1 has 3 slots: the three first choices (tokens 3-5) take them; the second choices of
    # tokens 0-2, which come later, are dropped whatever their token order
    assert r["keep"][:6].all() and not r["keep"][6:9].any() and r["keep"][9:].all()
    assert r["load"].tolist() == [3, 6, 3, 0]


def test_routing_drops_what_exceeds_the_capacity_and_the_balancing_loss_is_one_when_even():
    x = torch.eye(4).repeat(3, 1)  # 12 tokens, 3 for each of 4 experts under an identity router
    r = moe.route(x, 10 * torch.eye(4), capacity=2)
    assert r["load"].tolist() == [3, 3, 3, 3] and int((~r["keep"]).sum()) == 4
    assert abs(float(r["aux"]) - 1.0) < 1e-3  # even load, confident router: E·Σ f·P = 1
    skew = moe.route(torch.zeros(12, 4) + torch.tensor([1.0, 0, 0, 0]), 10 * torch.eye(4), capacity=2)
    assert float(skew["aux"]) > 3.5  # everything to one expert: E·f·P → E


@pytest.mark.numerics
@pytest.mark.parametrize("c", [2, 4])
@pytest.mark.parametrize("causal", [True, False])
def test_ring_attention_equals_full_attention_and_counts_its_blocks(c, causal, clusters):
    outs = clusters(c).run(ring_attention.ring_job, 2, 2, 32, 8, causal)
    ref = ring_attention.full_attention(*ring_attention.qkv(2, 2, 32, 8), causal)
    got = torch.cat([o["out"] for o in outs], 2)
    assert float((got - ref).abs().max()) <= tolerances.attention(32, 8, ref)
    assert all(o["sent"] == formulas.ring_attention(2, 2, 32, 8, c) for o in outs)
    # by hand: c − 1 steps, each passing a K and a V block of 32/c tokens, [2, 2, 32/c, 8] float32
    assert all(o["sent"] == (c - 1) * 2 * 4 * 2 * 2 * (32 // c) * 8 for o in outs)


@pytest.mark.numerics
@pytest.mark.parametrize("causal", [True, False])
def test_the_attention_references_are_torchs_scaled_dot_product_attention(causal):
    # full_attention (the ring's reference above) and the online softmax's block_update, folding K/V
    # blocks in one at a time as the ring does, against torch's own attention: neither shares code
    # with it. catches: a wrong scale, mask or rescaling in either.
    import torch.nn.functional as F

    q, k, v = ring_attention.qkv(2, 2, 32, 8, seed=3)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    tol = dict(rtol=1e-5, atol=1e-5)  # float32 softmax and products, summed in another order
    torch.testing.assert_close(ring_attention.full_attention(q, k, v, causal), want, **tol)
    m = q.new_full((*q.shape[:-1], 1), float("-inf"))
    denom, o = q.new_zeros((*q.shape[:-1], 1)), torch.zeros_like(q)
    for lo in range(0, 32, 8):  # four blocks of 8 keys; causal: query i sees keys j ≤ i
        mask = torch.arange(32)[:, None] < torch.arange(lo, lo + 8)[None, :] if causal else None
        m, denom, o = ring_attention.block_update(q, k[..., lo:lo + 8, :], v[..., lo:lo + 8, :], m, denom, o,
                                                  mask)
    torch.testing.assert_close(o / denom, want, **tol)


# --------------------------------------------------------------------------- memory and PyTorch's stack


@pytest.mark.slow
def test_sequence_parallel_divides_the_blocks_activations_about_t_fold(clusters):
    cfg = Config.memory()
    tp = clusters(4).run(memory_job, cfg, Layout(tp=4))
    sp = clusters(4).run(memory_job, cfg, Layout(tp=4, sequence_parallel=True), False)
    whole = tp[0]["unsharded"]
    assert tp[0]["parallel"]["params"] < whole["params"] / 3  # everything but embeddings, norms, head / 4
    act = [whole["block_activations"], tp[0]["parallel"]["block_activations"],
           sp[0]["parallel"]["block_activations"]]
    assert act[0] > act[1] > act[2] and act[0] / act[2] > 3, act
    peaks = [whole["measured_peak"], tp[0]["parallel"]["measured_peak"], sp[0]["parallel"]["measured_peak"]]
    assert peaks[0] > peaks[1] > peaks[2], peaks
    assert all(o["parallel"]["measured_peak"] >= o["parallel"]["params"] for o in sp)


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.parametrize("sp", [False, True])
def test_pytorchs_device_mesh_stack_equals_ours(sp, ref, clusters):
    layout = Layout(dp=2, tp=2, sequence_parallel=sp)
    theirs = clusters(4).run(dtensor_job, CFG, layout)
    ours = clusters(4).run(train.train_job, CFG, layout)
    tol = tolerances.transformer(CFG, ref)
    for t in theirs:
        gap = max(float((t["params"][k] - ours[0]["params"][k]).abs().max()) for k in ref["params"])
        assert gap <= tol["params"]
        assert t["param_numel"] < ours[0]["param_numel"]  # FSDP2 shards over dp what TP left whole
        assert t["norm_rows"] == CFG.seq // (2 if sp else 1)  # SequenceParallel: each norm sees seq / t


def _moe_by_hand(x, router, w1, w2, capacity, k):
    """A mixture-of-experts layer written out token by token, sharing no code with moe.py: softmax
    router, top-k with GShard's renormalised gates, every token's first choice served before any
    second choice, an expert over capacity drops the assignment; the balancing loss E·Σ f·P with f
    the share of FIRST choices (GShard's convention)."""
    T, E = x.shape[0], router.shape[1]
    probs = torch.softmax(x @ router, dim=-1)
    choices = [sorted(range(E), key=lambda e: (-float(probs[t, e]), e))[:k] for t in range(T)]
    used, out = [0] * E, torch.zeros_like(x)
    for j in range(k):
        for t in range(T):
            e = choices[t][j]
            if used[e] < capacity:
                gate = probs[t, e] / sum(probs[t, c] for c in choices[t]) if k > 1 else probs[t, e]
                out[t] += gate * (torch.nn.functional.gelu(x[t] @ w1[e]) @ w2[e])
            used[e] += 1
    first = torch.tensor([sum(1 for t in range(T) if choices[t][0] == e) / T for e in range(E)])
    return out, E * float((first * probs.mean(0)).sum())


@pytest.mark.parametrize("k, cf", [(1, 1.0), (2, 1.0), (2, 2.0)])
def test_the_single_process_moe_equals_one_written_out_by_hand(k, cf):
    cfg = moe.MoEConfig(capacity_factor=cf, top_k=k).check(2)
    w, xs = moe.weights(cfg), moe.tokens(cfg, 2)
    y, routes = moe.moe_reference(xs, w["router"], w["w1"], w["w2"], cfg)
    # GShard's capacity written out, not the library's: ⌈capacity_factor · k · tokens / experts⌉,
    # 32 tokens a group over 4 experts: ⌈1·1·32/4⌉ = 8, ⌈1·2·32/4⌉ = 16, ⌈2·2·32/4⌉ = 32
    capacity = -(-int(cf * k * cfg.tokens) // cfg.experts)
    assert (cfg.tokens, cfg.experts, capacity) == (32, 4, {(1, 1.0): 8, (2, 1.0): 16, (2, 2.0): 32}[k, cf])
    for g in range(2):
        want, aux = _moe_by_hand(xs[g], w["router"], w["w1"], w["w2"], capacity, k)
        assert torch.allclose(y[g], want, atol=1e-5), (k, cf, g)
        assert abs(float(routes[g]["aux"]) - aux) < 1e-5, (k, g)


def test_the_top_2_balancing_loss_worked_by_hand():
    """4 tokens, 2 experts, router scores chosen so probabilities are exact: every token's first
    choice is expert 0 (f = (1, 0)) and each also picks expert 1 second. P = mean of (0.75, 0.25)
    rows = (0.75, 0.25), so the loss is 2·(1·0.75 + 0·0.25) = 1.5; counting every assignment
    instead (f = (0.5, 0.5)) would give 2·(0.5·0.75 + 0.5·0.25) = 1.0."""
    import math

    x = torch.ones(4, 1)
    router = torch.tensor([[math.log(3.0), 0.0]])  # softmax(log 3, 0) = (0.75, 0.25)
    r = moe.route(x, router, capacity=4, top_k=2)
    assert float(r["aux"]) == pytest.approx(1.5, abs=1e-6)
