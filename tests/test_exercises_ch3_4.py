"""Chapters 3 and 4: every exercise accepts its reference answer and rejects plausible wrong ones
with a message that helps; the write-it-yourself exercises run on real ranks."""

import pytest
import torch
import torch.distributed as dist

from lesson_lib import comm
from lesson_lib.chapters import ch04
from lesson_lib.chapters.ch04_exercises import check_zero1
from lesson_lib.exercises import Exercise

EX4 = ch04.exercises()


def verdict(ex: Exercise, answer):
    """What the notebook's submit returns (exceptions from the answer become a verdict there too)."""
    return ex.submit(answer)


def test_every_reference_is_accepted():
    for key, ex in EX4.items():
        assert verdict(ex, ex.reference()), key


# --------------------------------------------------------------------------- ch4: zero1 (real ranks)


def zero1_all_reduce_everything(params, grad, step):
    comm.ring_all_reduce(grad).div_(dist.get_world_size())
    step(params, grad)  # right numbers, but every rank updates (and would keep state for) everything
    return params


def zero1_sum_not_mean(params, grad, step):
    rank, n = dist.get_rank(), dist.get_world_size()
    mine = comm.ring_reduce_scatter(grad)
    size = params.numel() // n
    step(params[rank * size:(rank + 1) * size], mine)
    comm.ring_all_gather(params)
    return params


def zero1_no_all_gather(params, grad, step):
    rank, n = dist.get_rank(), dist.get_world_size()
    mine = comm.ring_reduce_scatter(grad).div_(n)
    size = params.numel() // n
    step(params[rank * size:(rank + 1) * size], mine)
    return params


def zero1_wrong_slice(params, grad, step):
    rank, n = dist.get_rank(), dist.get_world_size()
    mine = comm.ring_reduce_scatter(grad).div_(n)
    size = params.numel() // n
    k = (rank + 1) % n
    step(params[k * size:(k + 1) * size], mine)
    comm.ring_all_gather(params)
    return params


def zero1_rank0_does_all(params, grad, step):
    comm.ring_all_reduce(grad).div_(dist.get_world_size())
    if dist.get_rank() == 0:
        step(params, grad)
    return params


def zero1_returns_nothing(params, grad, step):
    rank, n = dist.get_rank(), dist.get_world_size()
    mine = comm.ring_reduce_scatter(grad).div_(n)
    size = params.numel() // n
    step(params[rank * size:(rank + 1) * size], mine)
    comm.ring_all_gather(params)


def zero1_raises(params, grad, step):
    return params[dist.get_rank()] + undefined_name  # noqa: F821


@pytest.mark.parametrize("answer, words", [
    (zero1_all_reduce_everything, "exactly its own slice"),
    (zero1_rank0_does_all, "exactly its own slice"),
    (zero1_sum_not_mean, "N times too large"),
    (zero1_no_all_gather, "never arrived"),
    (zero1_wrong_slice, "own slice"),
    (zero1_returns_nothing, "returned None"),
    (zero1_raises, "undefined_name"),
])
def test_zero1_rejects_wrong_answers(answer, words):
    v = verdict(EX4["zero1"], answer)
    assert not v and words in v.message, v.message


def test_zero1_template_is_not_answered_yet():
    def my_zero1_step(params, grad, step):
        # 1. reduce-scatter ...
        ...

    v = verdict(EX4["zero1"], my_zero1_step)
    assert not v and v.message == "not answered yet"


def zero1_deadlock(params, grad, step):
    # every rank receives before anyone sends
    buf = torch.empty_like(grad)
    dist.recv(buf, (dist.get_rank() - 1) % dist.get_world_size())
    return params


def test_zero1_deadlock_ends_with_the_timeout_message():
    v = check_zero1(zero1_deadlock, timeout_s=4)
    assert not v and v.message.startswith("WorkerTimeout"), v.message
    assert "waiting" in v.message and "recv" in v.message, v.message
    assert check_zero1(EX4["zero1"].reference())  # the next check starts fresh workers


# --------------------------------------------------------------------------- ch4: paper and pencil


def whole_update_on_rank0(params, grads, rank, world_size, lr):
    return params - lr * grads if rank == 0 else params[:0]


def tensor_split_shard(params, grads, rank, world_size, lr):
    return torch.tensor_split(params - lr * grads, world_size)[rank]


def floor_sized_last_takes_rest(params, grads, rank, world_size, lr):
    size = params.numel() // world_size
    hi = params.numel() if rank == world_size - 1 else (rank + 1) * size
    return (params - lr * grads)[rank * size:hi]


def wrong_sign(params, grads, rank, world_size, lr):
    size = -(-params.numel() // world_size)
    return (params + lr * grads)[rank * size:(rank + 1) * size]


def forgot_return(params, grads, rank, world_size, lr):
    size = -(-params.numel() // world_size)
    params[rank * size:(rank + 1) * size] -= lr * grads[rank * size:(rank + 1) * size]


@pytest.mark.parametrize("answer, words", [
    (whole_update_on_rank0, "ceil"),
    (tensor_split_shard, "ceil"),
    (floor_sized_last_takes_rest, "ceil"),
    (lambda params, grads, rank, world_size, lr: params - lr * grads, "ceil"),
    (wrong_sign, "params − lr·grads"),
    (forgot_return, "returned None"),
])
def test_stage1_rejects_wrong_answers(answer, words):
    v = verdict(EX4["stage1"], answer)
    assert not v and words in v.message, v.message


@pytest.mark.parametrize("answer", [
    lambda psi, n: 16 * psi / n,  # stage 3
    lambda psi, n: 4 * psi + 12 * psi / n,  # stage 1
    lambda psi, n: 2 * psi + 12 * psi / n,  # gradients forgotten
    lambda psi, n: 16 * psi,  # stage 0
    lambda psi, n: str(2 * psi + 14 * psi / n),
])
def test_stage2_rejects_wrong_formulas(answer):
    v = verdict(EX4["stage2"], answer)
    assert not v and "replicated" in v.message, v.message


@pytest.mark.parametrize("answer, ok", [(1, True), (1.0, True), (1.9, False), (0, False), (2, False),
                                        (3, False), (True, False), ("1", False), (-1, False)])
def test_fit_requires_the_integer_stage(answer, ok):
    v = verdict(EX4["fit"], answer)
    assert bool(v) is ok, (answer, v.message)
    if answer == 1.9:
        assert "whole number" in v.message
