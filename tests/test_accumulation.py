"""Chapter 5, §7: gradient accumulation on real ranks — k micro-batches and one all-reduce equal the
large batch, send the bytes of one all-reduce per step, hold one micro-batch's activations at a
time, and equal torch DDP with ``no_sync()``; bad ``accumulate`` values; the exercise's checker."""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from conftest import worker_children

from lesson_lib import run
from lesson_lib.chapters.ch05_accumulate import exercise
from lesson_lib.milestones import accumulation
from lesson_lib.milestones import large_batch as lb
from lesson_lib.numerics import max_gap, sum_order_tolerance

pytestmark = pytest.mark.ch5

# SGD, not Adam or LAMB: they divide by the gradient's own scale, so a gradient k times too large
# (a missing 1/k) would train almost the same and pass unnoticed.
# One epoch of 8 steps, so that no evaluation falls inside the measured window.
SMALL = {**lb.Config.PRESETS["tiny"], "samples": 1024, "global_batch": 128, "epochs": 1, "hidden": 64,
         "optimizer": "sgd", "lr": 0.1, "world_size": 2}
STEPS = 8


@pytest.fixture(scope="module")
def runs(clusters):
    """k = 1, 2, 4 at one global batch of 128 on 2 ranks (64 samples a rank), peaks measured."""
    return {k: run("large-batch", lb.Config(**SMALL, accumulate=k, peak_memory=True), cluster=clusters(2))
            for k in (1, 2, 4)}


@pytest.mark.numerics
@pytest.mark.parametrize("k", [2, 4])
def test_k_micro_batches_equal_the_large_batch(runs, k):
    ref = runs[1].losses
    assert len(ref) == STEPS and len(runs[k].losses) == STEPS
    # catches: a missing 1/k (SGD steps k times too long), micro-batches dropped or seen twice
    assert max_gap(runs[k].losses, ref) <= sum_order_tolerance(ref), (runs[k].losses, ref)
    single = lb.reference(lb.Config(**SMALL, accumulate=k))["losses"]  # one process, k micro-batches
    assert max_gap(single, ref) <= sum_order_tolerance(ref)


@pytest.mark.parametrize("k", [2, 4])
def test_one_all_reduce_per_step_whatever_k(runs, clusters, k):
    psi = runs[1]["param_count"]
    one = max(lb.comm.ring_bytes_sent(psi + 1, 4, 2, r) for r in range(2))  # gradients + the loss
    assert runs[k]["grad_bytes_per_step"] == runs[1]["grad_bytes_per_step"] == one  # counted, exact
    for p in runs[k].per_rank:
        assert p["ops"]["grad_all_reduce"]["calls"] == STEPS  # one per step, not one per micro-batch
    # All-reducing every micro-batch is a k times smaller batch per all-reduce: k times the bytes per sample.
    small = run("large-batch", lb.Config(**{**SMALL, "global_batch": 128 // k}), cluster=clusters(2))
    assert small["grad_bytes_per_epoch"] == k * runs[k]["grad_bytes_per_epoch"]


def test_the_measured_peak_falls_as_the_micro_batch_shrinks(runs):
    peak = {k: r.per_rank[0]["memory"]["measured_peak"] for k, r in runs.items()}
    at_reset = {k: r.per_rank[0]["memory"]["measured_at_reset"] for k, r in runs.items()}
    assert peak[1] > peak[2] > peak[4] > at_reset[1] == at_reset[4], (peak, at_reset)
    # what scales with the micro-batch (its activations) halves with it: 64 → 32 → 16 samples
    assert (peak[1] - peak[2]) == pytest.approx(2 * (peak[2] - peak[4]), rel=0.1), peak
    for r in runs.values():  # every rank holds the same
        assert len({p["memory"]["measured_peak"] for p in r.per_rank}) == 1


@pytest.mark.numerics
@pytest.mark.parametrize("no_sync", [True, False])
def test_equal_to_ddp_with_no_sync_which_all_reduces_once_per_step(runs, clusters, no_sync):
    cfg = lb.Config(**SMALL, accumulate=4)
    ddp = clusters(2).run(accumulation.ddp_worker, cfg, lb.lr_at, no_sync)
    ref = runs[1].losses
    assert max_gap(ddp[0]["losses"], ref) <= sum_order_tolerance(ref), (ddp[0]["losses"], ref)
    assert max_gap(ddp[0]["losses"], runs[4].losses) <= sum_order_tolerance(ref)
    grads = 4 * runs[1]["param_count"]
    for out in ddp:  # DDP's all-reduces, counted by its comm hook: one bucket of all the gradients
        assert out["all_reduce_bytes"] == [[grads] * (1 if no_sync else 4)] * STEPS


@pytest.mark.parametrize("value", [0, -2, 3, 128, True, 2.0, "2"])
def test_bad_accumulate_names_it_before_any_worker_starts(value):
    before = len(worker_children())
    with pytest.raises(ValueError, match="accumulate"):
        run("large-batch", **{**SMALL, "accumulate": value})  # 64 samples per rank: 3 and 128 do not divide
    assert len(worker_children()) == before


def test_accumulate_alone_is_the_gradient_of_the_mean():
    from lesson_lib.models import mlp

    x, y = torch.randn(24, 8), torch.randint(0, 3, (24,))
    want = mlp(8, 6, 2, 3, seed=1)
    F.cross_entropy(want(x), y).backward()
    for k in (1, 3, 8):
        model = mlp(8, 6, 2, 3, seed=1)
        loss = accumulation.accumulate(model, x, y, torch.arange(24), k)
        assert float(loss) == pytest.approx(float(F.cross_entropy(want(x), y).detach()), rel=1e-6)
        for a, b in zip(model.parameters(), want.parameters()):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-7)


# --------------------------------------------------------------------------- the exercise


def _flat(model, batches):  # right: one flat all-reduce of all the gradients
    for x, y in batches:
        (F.cross_entropy(model(x), y) / len(batches)).backward()
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    torch.nn.utils.vector_to_parameters(flat, grads)


def _async(model, batches):  # right: every all-reduce started at once, then waited for
    for x, y in batches:
        (F.cross_entropy(model(x), y) / len(batches)).backward()
    handles = [dist.all_reduce(p.grad, async_op=True) for p in model.parameters()]
    for h in handles:
        h.wait()
    for p in model.parameters():
        p.grad /= dist.get_world_size()


def _every_micro_batch(model, batches):  # all-reduces each micro-batch's part: k times the bytes
    for x, y in batches:
        (F.cross_entropy(model(x), y) / len(batches)).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
    for p in model.parameters():
        p.grad /= dist.get_world_size()


def _no_division(model, batches):  # the sum of k means: k times the gradient
    for x, y in batches:
        F.cross_entropy(model(x), y).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


def _twice(model, batches):  # divides the loss by k and the gradient by k again
    k = len(batches)
    for x, y in batches:
        (F.cross_entropy(model(x), y) / k).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size() * k


def _no_all_reduce(model, batches):
    for x, y in batches:
        (F.cross_entropy(model(x), y) / len(batches)).backward()


def _one_pass(model, batches):  # the right gradient, but all micro-batches' activations at once
    x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    F.cross_entropy(model(x), y).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


def _not_waited(model, batches):
    for x, y in batches:
        (F.cross_entropy(model(x), y) / len(batches)).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad, async_op=True)


def _zero_inside(model, batches):  # zero_grad() in the loop: only the last micro-batch survives
    for x, y in batches:
        model.zero_grad()
        (F.cross_entropy(model(x), y) / len(batches)).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


def test_accumulate_exercise_on_real_ranks():
    ex = exercise()
    assert ex.submit(ex.reference())
    for right in (_flat, _async):
        right.__module__ = "__main__"  # as a learner's cell function: sent by value
        assert ex.submit(right), right.__name__
    for wrong, says in ((_every_micro_batch, "before the last one"), (_no_division, "single-process"),
                        (_twice, "single-process"), (_no_all_reduce, "no all-reduce"),
                        (_one_pass, "order FB for"), (_not_waited, "not been waited for"),
                        (_zero_inside, "zero_grad() inside the micro-batch loop")):  # not "divided by k"
        wrong.__module__ = "__main__"
        verdict = ex.submit(wrong)
        assert not verdict and says in verdict.message, (wrong.__name__, verdict.message)
