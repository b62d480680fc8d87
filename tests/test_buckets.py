"""Gradient buckets reduced during the backward: the plan, the order, the errors, and
data parallel and ZeRO-2 with buckets equal to their one-bucket versions."""

import threading
import time

import pytest
import torch
import torch.nn.functional as F

from lesson_lib import buckets, numerics, run
from lesson_lib.comm import ring_bytes_sent
from lesson_lib.milestones import data_parallel as dp
from lesson_lib.milestones import zero
from lesson_lib.models import mlp

pytestmark = pytest.mark.ch0

SMALL = dp.Config.PRESETS["tiny"]
LAYER_MB = 4 * 33 * 32 / 2**20  # one 32x32 layer with its bias, fp32


def test_plan_groups_in_backward_order_up_to_the_cap():
    assert buckets.plan([4, 4, 4, 4], 8) == [[3, 2], [1, 0]]
    assert buckets.plan([4, 4, 4, 4], 7) == [[3], [2], [1], [0]]
    assert buckets.plan([2, 20, 2, 2], 8) == [[3, 2], [1], [0]]  # too big: a bucket of its own
    assert buckets.plan([1, 2, 3], 0) == [[2, 1, 0]]  # cap 0: one bucket
    assert sum(buckets.plan(list(range(1, 30)), 17), []) == list(reversed(range(29)))


def test_plan_ddp_closes_a_bucket_once_it_reaches_the_cap():
    assert buckets.plan_ddp([4, 4, 4, 4], 8) == [[3, 2], [1, 0]]
    assert buckets.plan_ddp([4, 4, 4, 4], 7) == [[3, 2], [1, 0]]  # passes the cap by its last item
    assert buckets.plan_ddp([2, 20, 2, 2], 8) == [[3, 2, 1], [0]]  # the small ones join the big one
    assert buckets.plan_ddp([1, 2, 3], 0) == [[2, 1, 0]]


def test_plan_ddp_is_torchs_own_bucket_assignment():
    import random

    import torch.distributed as dist

    rng = random.Random(0)
    for _ in range(500):
        n = rng.randint(1, 12)
        sizes = [4 * rng.choice([1, 3, 10, 100, 1000, 5000]) for _ in range(n)]
        cap = 4 * rng.choice([1, 50, 200, 1000, 3000, 10000])
        # DDP hands its parameters over in the order their gradients are ready: backward order
        tensors = [torch.empty(b // 4) for b in reversed(sizes)]
        got, _ = dist._compute_bucket_assignment_by_size(tensors, [cap], [False] * n)
        assert buckets.plan_ddp(sizes, cap) == [[n - 1 - j for j in b] for b in got], (sizes, cap)


def overlap_on(model, cap, reduce=None):
    params = list(model.parameters())
    plan = buckets.plan([p.numel() * 4 for p in params], cap)
    calls = []
    ov = buckets.Overlap([[params[j] for j in b] for b in plan],
                         reduce or (lambda i: calls.append((i, threading.current_thread().name))))
    return ov, plan, calls


def test_buckets_launch_in_order_during_the_backward_on_the_comm_thread():
    model = mlp(8, 16, 3, 4, 0)
    ov, plan, calls = overlap_on(model, 4 * 16 * 17)
    x = torch.randn(5, 8)
    launched_before_end = []
    for _ in range(2):  # reusable step after step
        ov.start()
        loss = F.cross_entropy(model(x), torch.zeros(5, dtype=torch.long))
        loss.backward()
        end = time.perf_counter()
        ov.wait()
        launched_before_end.append(all(e["launched"] < end for e in ov.events))
    ov.close()
    assert len(plan) > 2
    assert [i for i, _ in calls] == list(range(len(plan))) * 2
    assert all(name.startswith("comm") for _, name in calls)
    assert launched_before_end == [True, True]
    # the last layer's bucket is launched before the first layer's gradient exists
    assert [e["bucket"] for e in ov.events] == list(range(len(plan)))


def test_a_parameter_without_gradient_is_named_not_waited_for():
    model = mlp(8, 16, 2, 4, 0)
    ov, plan, _ = overlap_on(model, 1)
    ov.start()
    F.cross_entropy(model[2:](torch.randn(3, 16)), torch.zeros(3, dtype=torch.long)).backward()
    with pytest.raises(RuntimeError, match="never became ready: 2 parameter"):
        ov.wait()
    ov.close()


def test_an_error_in_a_collective_surfaces_on_the_main_thread():
    def reduce(i):
        if i == 1:
            raise ConnectionError("peer 1 closed the connection")

    model = mlp(8, 16, 2, 4, 0)
    ov, _, _ = overlap_on(model, 1, reduce)
    ov.start()
    F.cross_entropy(model(torch.randn(3, 8)), torch.zeros(3, dtype=torch.long)).backward()
    with pytest.raises(ConnectionError, match="peer 1"):
        ov.wait()
    ov.close()


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("allreduce", ["ring", "library"])
def test_data_parallel_with_buckets_equals_single_process_training(clusters, n, allreduce):
    ref = dp.reference(dp.Config(world_size=1, **SMALL))
    r = run("data-parallel", dp.Config(world_size=n, allreduce=allreduce, bucket_mb=LAYER_MB, **SMALL),
            cluster=clusters(n))
    torch.testing.assert_close(torch.tensor(r.losses), torch.tensor(ref), rtol=1e-5, atol=1e-6)
    for t in r["timeline"]:
        assert len(t["buckets"]) == 2  # DDP's rule: last layer + hidden layer, first layer
        assert t["buckets"][0]["launched"] < t["backward"][1]  # launched while the backward ran


def test_bucketed_traffic_is_the_ring_formula_per_bucket(clusters):
    n = 3
    r = run("data-parallel", dp.Config(world_size=n, bucket_mb=LAYER_MB, **SMALL), cluster=clusters(n))
    model = mlp(32, 32, 2, 10, 0)
    params = list(model.parameters())
    plan = buckets.plan_ddp([4 * p.numel() for p in params], int(LAYER_MB * 2**20))
    assert len(plan) > 1
    sizes = [sum(params[j].numel() for j in b) for b in plan]
    for rank, pr in enumerate(r.per_rank):
        grads = pr["ops"]["grad_all_reduce"]
        assert grads["calls"] == SMALL["steps"] * len(plan)
        assert grads["bytes_sent"] == SMALL["steps"] * sum(ring_bytes_sent(s, 4, n, rank) for s in sizes)
        # catches: received bytes miscounted; a rank receives what its left neighbour sends it
        left = (rank - 1) % n
        assert grads["bytes_recv"] == SMALL["steps"] * sum(ring_bytes_sent(s, 4, n, left) for s in sizes)
        assert grads["overlapped"] and not pr["ops"]["loss_all_reduce"]["overlapped"]
        # catches: the communication thread's seconds counted as the step's comm time (comm time is
        # what the main thread waited for: the loss all-reduce and the wait for the buckets)
        waited = pr["ops"]["loss_all_reduce"]["seconds"] + pr["ops"]["grad_wait"]["seconds"]
        assert sum(s["comm_s"] for s in pr["steps"]) == pytest.approx(waited, rel=1e-9, abs=1e-12)
        for s in pr["steps"]:
            assert 0 < s["comm_s"] < s["wall_s"]


def bucketed_gradients(bucket_mb, set_to_none):
    """Each rank's own batch: the bucketed average of the gradients beside the library's (sum, / n)."""
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    model = mlp(32, 64, 3, 10, 0)
    flat = dp.flat_views(model)[1]
    overlap = dp.overlapped(model, flat, bucket_mb, "ring", n)
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(8, 32, generator=gen), torch.randint(0, 10, (8,), generator=gen)
    try:
        for _ in range(2):  # the second step starts from the first one's bucket contents
            model.zero_grad(set_to_none=set_to_none)
            overlap.start()
            F.cross_entropy(model(x), y).backward()
            overlap.wait()
    finally:
        overlap.close()
    expected = torch.cat([g.reshape(-1) for g in torch.autograd.grad(F.cross_entropy(model(x), y),
                                                                     list(model.parameters()))])
    dist.all_reduce(expected)
    starts = [0, *torch.tensor([q.numel() for q in model.parameters()]).cumsum(0).tolist()]
    views = all(p.grad.data_ptr() == flat.data_ptr() + 4 * i for p, i in zip(model.parameters(), starts))
    return flat.clone(), expected / n, views


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("set_to_none", [True, False])
def test_bucketed_gradients_are_the_average_moved_or_divided_in_place(clusters, n, set_to_none):
    # set_to_none: autograd's fresh gradient is divided into its bucket slice; False: the slice
    # itself accumulated it and is divided in place. Either way the average, in the flat buffer.
    for got, expected, views in clusters(n).run(bucketed_gradients, 0.004, set_to_none):
        assert views  # every p.grad is its slice of the flat buffer again, for the optimizer
        scale = float(expected.abs().max())
        torch.testing.assert_close(got, expected, rtol=8 * n * 2**-24, atol=8 * n * 2**-24 * scale)


@pytest.mark.parametrize("options, name", [(dict(bucket_mb=-1), "bucket_mb"),
                                           (dict(bucket_mb="4"), "bucket_mb"),
                                           (dict(bucket_mb=True), "bucket_mb")])
def test_bad_bucket_size_names_the_parameter(options, name):
    with pytest.raises(ValueError, match=name):
        dp.Config(world_size=2, **options).validate()
    with pytest.raises(ValueError, match=name):
        zero.Config(world_size=2, stage=2, **options).validate()


@pytest.mark.parametrize("stage", [0, 1, 3])
def test_zero_buckets_apply_to_stage_2_only(stage):
    with pytest.raises(ValueError, match="bucket_mb=1 applies to stage 2 only"):
        zero.Config(world_size=2, stage=stage, bucket_mb=1).validate()


ZSMALL = zero.Config.PRESETS["tiny"]


@pytest.mark.ch4  # ZeRO-2's buckets: `-m ch4` must see a bucket scattered without its ÷N
@pytest.mark.parametrize("precision", ["fp32", "mixed"])
@pytest.mark.parametrize("n", [2, 3])
def test_zero2_with_buckets_is_the_same_training_holding_one_bucket_and_a_layer(clusters, precision, n):
    base = run("zero", zero.Config(stage=2, world_size=n, precision=precision, **ZSMALL), cluster=clusters(n))
    whole = sum(base["layer_bytes"])
    assert base["full_grads_peak"] == [whole] * n  # without buckets: the whole gradient at once
    for cap_layers in (0.5, 1.2, 2.5):
        mb = cap_layers * max(base["layer_bytes"]) / 2**20
        r = run("zero", zero.Config(stage=2, world_size=n, precision=precision, bucket_mb=mb, **ZSMALL),
                cluster=clusters(n))
        assert r.losses == base.losses and r["final_params"] == base["final_params"]  # bit for bit
        assert r["traffic_per_step"] == [r["traffic_formula_padded"]] * n  # counted = formula
        bound = int(mb * 2**20) + max(r["layer_bytes"])
        assert all(p <= bound for p in r["full_grads_peak"]), (r["full_grads_peak"], bound)
        if cap_layers < 2:  # a bucket smaller than the model: never the whole gradient at once
            assert all(p < whole for p in r["full_grads_peak"])
        for pr in r.per_rank:
            assert pr["ops"]["grad_reduce_scatter"]["overlapped"]


@pytest.mark.ch4
@pytest.mark.numerics
def test_zero2_with_buckets_equals_single_process_adam(clusters):
    cfg = zero.Config(stage=2, world_size=3, bucket_mb=0.005, **ZSMALL)
    r = run("zero", cfg, cluster=clusters(3))
    ref, tol = zero.reference(cfg), numerics.adam_drift(cfg)  # why this tolerance: its docstring
    assert numerics.max_gap(r.losses, ref) <= tol["loss_rel"] * max(ref)


def fail_in_backward(bucket_mb):
    """Data parallel with buckets, where rank 1 raises in the middle of its backward."""
    import torch.distributed as dist

    from lesson_lib.runtime import context

    model = mlp(32, 64, 3, 10, 0)
    flat = dp.flat_views(model)[1]
    overlap = dp.overlapped(model, flat, bucket_mb, "ring", dist.get_world_size())
    if context().rank == 1:
        model[2].weight.register_post_accumulate_grad_hook(lambda p: 1 / 0)
    try:
        overlap.start()
        F.cross_entropy(model(torch.randn(8, 32)), torch.zeros(8, dtype=torch.long)).backward()
        overlap.wait()
    finally:
        overlap.close()


@pytest.mark.slow
def test_a_rank_failing_mid_backward_surfaces_with_its_rank_and_the_cluster_recovers(clusters):
    from lesson_lib import WorkerError

    c = clusters(2)
    with pytest.raises(WorkerError, match="rank 1") as e:
        c.run(fail_in_backward, 0.001, timeout_s=20)
    assert "ZeroDivisionError" in str(e.value)
    assert c.run(lambda: 1 + 1) == [2, 2]
