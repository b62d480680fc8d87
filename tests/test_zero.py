"""Chapter 4: every ZeRO stage trains the same model; memory and traffic match the paper."""

import json

import pytest
import torch
from conftest import cli_in_process

from lesson_lib import experiments, numerics, run
from lesson_lib.chapters import ch04
from lesson_lib.costmodel import zero_memory, zero_traffic
from lesson_lib.milestones import data_parallel as dp
from lesson_lib.milestones import zero

pytestmark = pytest.mark.ch4

SMALL = zero.Config.PRESETS["tiny"]


@pytest.fixture(scope="module")
def stages(clusters):
    out = {}
    for precision in ("fp32", "mixed"):
        for n in (2, 3):
            for s in range(4):
                cfg = zero.Config(stage=s, world_size=n, precision=precision, **SMALL)
                out[precision, n, s] = run("zero", cfg, cluster=clusters(n))
    return out


@pytest.mark.parametrize("precision", ["fp32", "mixed"])
@pytest.mark.parametrize("n", [2, 3])
def test_every_stage_is_bitwise_the_same_training(stages, precision, n):
    base = stages[precision, n, 0]
    for s in (1, 2, 3):
        assert stages[precision, n, s].losses == base.losses
        assert stages[precision, n, s]["final_params"] == base["final_params"]


@pytest.mark.numerics
@pytest.mark.parametrize("n", [2, 3])
def test_fp32_stages_equal_single_process_adam(stages, n):
    cfg = zero.Config(**SMALL)
    ref, tol = zero.reference(cfg), numerics.adam_drift(cfg)  # why this tolerance: its docstring
    for s in range(4):
        assert numerics.max_gap(stages["fp32", n, s].losses, ref) <= tol["loss_rel"] * max(ref)


def _sgd_for_adam(on: bool) -> None:
    """On every rank: make ZeRO's torch.optim.Adam momentum SGD for one run (and back)."""
    import torch

    if on:
        torch.optim._adam = torch.optim.Adam
        torch.optim.Adam = lambda params, lr: torch.optim.SGD(params, lr=lr, momentum=0.9)
    else:
        torch.optim.Adam = torch.optim._adam


@pytest.mark.numerics
@pytest.mark.parametrize("n", [2, 3])
def test_every_stage_averages_the_gradients(clusters, n):
    # catches: a missing 1/N on the reduce-scattered gradients, which Adam (nearly invariant to the
    # gradient's scale) hides from the test above; SGD's step is proportional to the gradient
    cfg = zero.Config(world_size=n, **SMALL)
    ref = dp.reference(cfg, optimizer="sgd")  # single process, momentum 0.9, the combined batch
    clusters(n).run(_sgd_for_adam, True)
    try:
        losses = [run("zero", cfg.replace(stage=s), cluster=clusters(n)).losses for s in range(4)]
    finally:
        clusters(n).run(_sgd_for_adam, False)
    for s in range(4):
        torch.testing.assert_close(torch.tensor(losses[s]), torch.tensor(ref), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("precision", ["fp32", "mixed"])
@pytest.mark.parametrize("n", [2, 3])
def test_measured_model_states_match_the_paper_within_5_percent(stages, precision, n):
    for s in range(4):
        r = stages[precision, n, s]
        f = zero_memory(r["param_count"], n, s, precision)
        for rank in r.per_rank:
            for cat in ("params", "grads", "optimizer"):
                assert rank["memory"][cat] == pytest.approx(f[cat], rel=0.05), (precision, n, s, cat)


def test_transient_buffers_are_reported_separately(stages):
    # stage 2 builds the full gradient during backward; stage 3 holds one layer's full parameters
    # and gradient at a time (the largest layer here: 48 x 48 weights + 48 biases)
    b = {s: stages["fp32", 2, s].per_rank[0]["memory"]["buffers"] for s in range(4)}
    psi, layer = stages["fp32", 2, 0]["padded_param_count"], 48 * 49
    assert b[1] < 4 * psi <= b[2]
    # catches: stage 3 keeping more than one layer's gathered parameters or gradient at a time
    # (one layer's parameters + its gradient + the ring's scratch chunk of it, 1/N of a layer)
    assert 8 * layer <= b[3] <= 8 * layer + 4 * layer // 2


@pytest.mark.parametrize("precision, esize", [("fp32", 4), ("mixed", 2)])
@pytest.mark.parametrize("n", [2, 3])
def test_stage_3_holds_one_layers_gathered_parameters_at_a_time(stages, precision, esize, n):
    # catches: ZeRO-3 keeping a layer's gathered parameters after its forward (free hook removed),
    # which leaves the traffic at 3 psi and the per-category accounting as it was
    largest = 48 * 49 * esize  # 48 x 48 weights + 48 biases (divisible by N = 2, 3: no padding)
    assert stages[precision, n, 3]["full_params_peak"] == [largest] * n


@pytest.mark.parametrize("precision", ["fp32", "mixed"])
@pytest.mark.parametrize("n", [2, 3])
def test_counted_traffic_is_2_psi_and_3_psi_for_stage_3(stages, precision, n):
    training_ops = ("grad_reduce_scatter", "grad_all_gather", "param_all_gather")
    esize = 4 if precision == "fp32" else 2
    for s in range(4):
        r = stages[precision, n, s]
        assert r["traffic_per_step"] == [r["traffic_formula_padded"]] * n
        # written out (Rajbhandari et al., 2020): reduce-scatter + all-gather, (N−1)/N of the padded
        # elements each; stage 3 gathers the parameters once more
        by_hand = (3 if s == 3 else 2) * (n - 1) / n * r["padded_param_count"] * esize
        assert r["traffic_per_step"] == [by_hand] * n, (s, by_hand)
        # catches: received bytes miscounted: padded to N equal chunks, each rank receives from its
        # left neighbour exactly what it sends on
        for rank in r.per_rank:
            recv = sum(v["bytes_recv"] for k, v in rank["ops"].items() if k in training_ops)
            assert recv / SMALL["steps"] == r["traffic_formula_padded"]
    s1, s3 = (stages[precision, n, s]["traffic_per_step"][0] for s in (1, 3))
    assert s3 == 1.5 * s1


@pytest.mark.numerics
def test_torch_zero_redundancy_optimizer_agrees_with_stage_1(clusters, stages):
    cfg = zero.Config(stage=1, world_size=2, **SMALL)
    outs = clusters(2).run(zero.torch_zero_reference, cfg)
    ours, tol = stages["fp32", 2, 1], numerics.adam_drift(cfg)
    assert numerics.max_gap(outs[0]["losses"], ours.losses) <= tol["loss_rel"] * max(ours.losses)
    assert numerics.max_gap(outs[0]["params"], ours["final_params"]) <= tol["params"]
    assert sum(o["optimizer_bytes"] for o in outs) > 0


def zero1_adam(cfg, bug=None):
    """The notebook's ZeRO-1 loop, with a deliberate bug to show the tolerance catches it."""
    import torch.distributed as dist
    import torch.nn.functional as F

    from lesson_lib import comm

    rank, n = dist.get_rank(), dist.get_world_size()
    model, batch = ch04.task(cfg)
    flat = zero.Flat(list(model.parameters()), n, rank)
    grad = torch.zeros(flat.padded)
    flat.point_grads(grad)
    k = (rank + 1) % n if bug == "wrong slice" else rank
    size = flat.padded // n
    mine = flat.full[k * size:(k + 1) * size]
    adam = torch.optim.Adam([mine], lr=cfg.lr)
    for step in range(cfg.steps):
        x, y = batch(step)
        grad.zero_()
        F.cross_entropy(model(x), y).backward()
        mine.grad = comm.ring_reduce_scatter(grad).div_(n)
        if not (bug == "skipped step" and step == cfg.steps // 2):
            adam.step()
        comm.ring_all_gather(flat.full)
    return flat.full[:flat.numel].tolist()


@pytest.mark.numerics
@pytest.mark.parametrize("bug", [None, "skipped step", "wrong slice"])
def test_the_parameter_tolerance_passes_rounding_and_fails_a_bug(clusters, stages, bug):
    cfg = zero.Config(stage=1, world_size=2, **SMALL)
    got = clusters(2).run(zero1_adam, cfg, bug)[0]
    gap = numerics.max_gap(got, stages["fp32", 2, 1]["final_params"])
    assert (gap <= numerics.adam_drift(cfg)["params"]) is (bug is None), gap


@pytest.mark.parametrize("n", [2, 3])
def test_stage_3_prefetch_trains_the_same_and_holds_at_most_depth_plus_one_layers(clusters, stages, n):
    base = stages["fp32", n, 3]
    lb = base["layer_bytes"]
    for d in (1, 2):
        r = run("zero", zero.Config(stage=3, world_size=n, prefetch=d, **SMALL), cluster=clusters(n))
        assert r.losses == base.losses and r["final_params"] == base["final_params"]
        assert r["traffic_per_step"] == base["traffic_per_step"]
        # catches: no prefetch (one layer), or an unbounded one (every layer at once)
        assert r["full_params_peak"] == [max(sum(lb[i:i + d + 1]) for i in range(len(lb)))] * n


@pytest.mark.numerics
def test_fsdp2_trains_like_our_stage_3_with_the_same_shards(clusters, stages):
    cfg = zero.Config(stage=3, world_size=2, **SMALL)
    ours, theirs = stages["fp32", 2, 3], clusters(2).run(zero.fsdp2_worker, cfg)
    got = zero.fsdp.compare(cfg, ours, theirs)
    assert got["same_training"] and got["same_shards"], got
    # catches: a parameter a skipped step's worth (lr) away, or a shard one element off
    bad = [dict(t, params=[t["params"][0] + cfg.lr, *t["params"][1:]]) for t in theirs]
    assert not zero.fsdp.compare(cfg, ours, bad)["same_training"]
    bad = [dict(t, shard_numel=[t["shard_numel"][0] + 1, *t["shard_numel"][1:]]) for t in theirs]
    assert not zero.fsdp.compare(cfg, ours, bad)["same_shards"]


@pytest.mark.numerics
def test_fsdp2_shards_differ_from_ours_where_dim_0_does_not_split(clusters, stages):
    # 3 ranks: FSDP2 chunks the last layer's 10 rows 4/4/2; our flat slices are a third each
    cfg = zero.Config(stage=3, world_size=3, **SMALL)
    got = zero.fsdp.compare(cfg, stages["fp32", 3, 3], clusters(3).run(zero.fsdp2_worker, cfg))
    assert got["same_training"] and not got["same_shards"], got
    assert got["fsdp2_shards"][0][-1] != got["fsdp2_shards"][2][-1], got


@pytest.mark.parametrize("reshard, stage", [(True, 3), (False, 2)])
def test_fsdp2_on_our_ring_sends_3_psi_or_2_psi_and_its_peak_repeats(clusters, stages, reshard, stage):
    cfg = zero.Config(stage=3, world_size=2, peak_memory=True, **SMALL)
    runs = [clusters(2).run(zero.fsdp2_worker, cfg, reshard, "ring") for _ in range(2)]
    assert zero.fsdp.compare(cfg, stages["fp32", 2, 3], runs[0])["same_training"]
    sent = sum(runs[0][0]["bytes_sent"].values()) / cfg.steps
    assert sent == zero_traffic(2 * sum(runs[0][0]["shard_numel"]), 2, stage)
    if reshard:  # the same bytes as our stage 3 sends
        assert sent == stages["fp32", 2, 3]["traffic_per_step"][0]
    peaks = [[o["memory"]["measured_peak"] for o in r] for r in runs]
    assert peaks[0] == peaks[1] and peaks[0][0] == peaks[0][1], peaks  # the meter sees every byte
    assert all(p >= sum(o["memory"][c] for c in ("params", "grads", "optimizer"))
               for p, o in zip(peaks[0], runs[0])), (peaks, runs[0])


def test_fsdp2_bad_input_names_the_parameter():
    with pytest.raises(ValueError, match="collectives"):
        zero.fsdp2_worker(zero.Config(**SMALL), collectives="nccl")
    with pytest.raises(ValueError, match="fp32"):
        zero.fsdp2_worker(zero.Config(precision="mixed", **SMALL))


def test_paper_example_and_fits():
    gb = [round(zero_memory(7.5e9, 64, s, "mixed")["total"] / 1e9, 1) for s in range(4)]
    assert gb == [120.0, 31.4, 16.6, 1.9]
    assert ch04.first_fitting_stage(13e9, 8, 80) == 1
    assert ch04.first_fitting_stage(175e9, 64, 80) == 3
    assert ch04.first_fitting_stage(1.6e12, 64, 80) is None


@pytest.mark.parametrize("options, name", [
    (dict(stage=4), "stage"), (dict(stage=-1), "stage"), (dict(world_size=0), "world_size"),
    (dict(precision="fp8"), "precision"), (dict(stage=3, prefetch=-1), "prefetch"),
    (dict(stage=2, prefetch=1), "prefetch"), (dict(stage=3, prefetch=True), "prefetch"),
    (dict(world_size=3, global_batch=32), "global_batch"),
    (dict(hidden=1, depth=1, d_in=1, classes=1, world_size=8, global_batch=8), "world_size"),
])
def test_bad_input_names_the_parameter(options, name):
    with pytest.raises((ValueError, TypeError), match=name):
        zero.Config(**{**SMALL, **options}).validate()


def test_zero_memory_bad_input():
    with pytest.raises(ValueError, match="stage"):
        zero_memory(1e9, 8, 5)
    with pytest.raises(ValueError, match="world_size"):
        zero_memory(1e9, 0, 1)


def test_exercises():
    ex = ch04.exercises()
    for key in ex:
        assert ex[key].check(ex[key].reference()), key
    # catches: a checker rejecting for another reason than the mistake (or crashing on it)
    v = ex["stage2"].check(lambda psi, n: 16 * psi / n)
    assert not v and "which parts are replicated and which are split" in v.message, v.message
    v = ex["stage1"].check(lambda params, grads, rank, world_size, lr: params - lr * grads)
    assert not v and "rank 0 returned 10 values; each rank owns ceil(10/4) = 3" in v.message, v.message
    v = ex["fit"].check(2)
    assert not v and v.message.startswith("you said stage 2"), v.message


def test_cli_run_zero_writes_json(tmp_path):
    f = tmp_path / "z.json"
    args = ["run", "zero", "--stage", "3", "--world-size", "2", "--precision", "mixed", "--steps", "3",
            "--global-batch", "16", "--hidden", "16", "--json", str(f)]
    out = cli_in_process(*args)
    assert out.returncode == 0, out.stderr
    d = json.loads(f.read_text())
    assert d["experiment"] == "zero" and d["config"]["stage"] == 3 and len(d["per_rank"]) == 2
    assert d["per_rank"][0]["memory"]["params"] > 0 and d["per_rank"][0]["bytes_sent"] > 0


def test_explorer_offers_only_valid_rank_counts_and_checks_before_starting(monkeypatch):
    sizes = ch04.valid_world_sizes()
    assert sizes == [1, 2, 4]  # the preset's batch of 64 does not split over 3 ranks
    for n in sizes:
        ch04.config(3, n, precision="mixed")
    monkeypatch.setattr(experiments, "warm_cluster", lambda *a, **k: pytest.fail("workers started"))
    with pytest.raises(ValueError, match="global_batch"):
        ch04.stages(world_size=3)
    box = ch04.explorer()
    assert list(box.children[0].options) == sizes


def test_the_prefetch_timeline_records_one_forward_layer_by_layer():
    """Rank 0's last forward: every layer computes once, in order, never while its own gather runs;
    without prefetching every layer is gathered in the forward, with it all but the first on the
    communication thread, and the forward waits only for what had not arrived. The emulated link
    and the recording change nothing in the training or the bytes."""
    job = dict(stage=3, world_size=2, steps=2, link_gbps=1.0)
    plain = experiments.run_warm(zero.Config.laptop(**job))
    layers = len(plain["layer_bytes"])
    for d in (0, 1):
        r = experiments.run_warm(zero.Config.laptop(**job, prefetch=d, timeline=True))
        assert r.losses == plain.losses and r["traffic_per_step"] == plain["traffic_per_step"]
        spans = r["timeline"]
        lane = lambda name, spans=spans: [s for s in spans if s["lane"] == name]
        computes = lane("compute")
        assert [s["layer"] for s in computes] == list(range(layers))
        assert all(a["end"] <= b["start"] for a, b in zip(computes, computes[1:]))
        in_forward, on_thread = lane("gather, in the forward"), lane("gather, communication thread")
        if d == 0:
            assert [s["layer"] for s in in_forward] == list(range(layers)) and not on_thread
        else:
            assert [s["layer"] for s in in_forward] == [0]
            assert sorted(s["layer"] for s in on_thread) == list(range(1, layers))
        gathered = {s["layer"]: s for s in in_forward + on_thread}
        for c in computes:  # a layer computes after its gather ended
            assert c["start"] >= gathered[c["layer"]]["end"] - 1e-9
        assert min(s["start"] for s in spans) == 0.0


@pytest.mark.parametrize("bad, name", [({"timeline": True, "stage": 2}, "timeline"), ({"link_gbps": -1.0},
                                       "link_gbps"), ({"link_gbps": True}, "link_gbps")])
def test_timeline_and_link_are_checked_by_name(bad, name):
    with pytest.raises(ValueError, match=name):
        zero.Config.laptop(**{"stage": 3, **bad})
