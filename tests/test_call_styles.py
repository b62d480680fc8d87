"""Right answers written another way are accepted by every checker that takes code: collectives
imported by name (``from torch.distributed import all_reduce``), point-to-point messages batched with
``dist.P2POp`` and ``dist.batch_isend_irecv``, functional collectives
(``torch.distributed._functional_collectives``). The checkers observe the process group, through which
every torch.distributed call passes (lesson_lib.exercises.observe)."""

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed import all_reduce, batch_isend_irecv, irecv, isend, recv, send

from lesson_lib import close_all
from lesson_lib.chapters import (
    ch00_exercises,
    ch01,
    ch02_exercises,
    ch05_exercises,
    ch06_exercises,
    ch07_exercises,
)


@pytest.fixture(scope="module", autouse=True)
def _close_clusters():
    yield
    close_all()


def _as_cell(fn):
    fn.__module__ = "__main__"  # as a learner's cell function: sent by value, with its globals
    return fn


def start_overlap(model):  # chapter 0, the all-reduce imported by name
    world, in_flight = dist.get_world_size(), []
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda p: in_flight.append(all_reduce(p.grad, async_op=True)))

    def finish():
        for work in in_flight:
            work.wait()
        in_flight.clear()
        for p in model.parameters():
            p.grad /= world

    return finish


def worker_step(grads, params, bounds):  # chapter 1, pushes and pulls batched with P2POp
    pushes = [dist.P2POp(isend, grads[lo:hi], k) for k, (lo, hi) in enumerate(bounds)]
    for work in batch_isend_irecv(pushes):
        work.wait()
    for work in batch_isend_irecv([dist.P2POp(irecv, params[lo:hi], k) for k, (lo, hi) in enumerate(bounds)]):
        work.wait()


def my_reduce_scatter(chunks):  # chapter 2, each step's send and receive as one batch of P2POps
    rank, n = dist.get_rank(), dist.get_world_size()
    for s in range(n - 1):
        send_i, into_i = (rank - s) % n, (rank - s - 1) % n
        incoming = torch.empty_like(chunks[into_i])
        ops = [dist.P2POp(dist.isend, chunks[send_i], (rank + 1) % n),
               dist.P2POp(dist.irecv, incoming, (rank - 1) % n)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        chunks[into_i] += incoming


def sharded_trust_ratio(w_shard, u_shard):  # chapter 5, by name
    sq = torch.stack([w_shard.square().sum(), u_shard.square().sum()])
    all_reduce(sq)
    return (sq[0].sqrt() / sq[1].sqrt()).item()


def randomk_step(grad, residual, k, step):  # chapter 6, by name, through distributed_c10d
    acc = grad + residual
    idx = torch.randperm(acc.numel(), generator=torch.Generator().manual_seed(step))[:k]
    vals = acc[idx]
    dist.distributed_c10d.all_reduce(vals)
    avg = torch.zeros_like(acc)
    avg[idx] = vals / dist.get_world_size()
    residual = acc.clone()
    residual[idx] = 0
    return avg, residual


def sharded_trust_ratio_functional(w_shard, u_shard):  # chapter 5, a functional collective
    sq = funcol.all_reduce(torch.stack([w_shard.square().sum(), u_shard.square().sum()]), "sum",
                           dist.group.WORLD)
    return (sq[0].sqrt() / sq[1].sqrt()).item()


def randomk_step_functional(grad, residual, k, step):  # chapter 6, a functional collective
    acc = grad + residual
    idx = torch.randperm(acc.numel(), generator=torch.Generator().manual_seed(step))[:k]
    vals = funcol.wait_tensor(funcol.all_reduce(acc[idx], "sum", dist.group.WORLD))
    avg = torch.zeros_like(acc)
    avg[idx] = vals / dist.get_world_size()
    residual = acc.clone()
    residual[idx] = 0
    return avg, residual


def ping_pong(buf_send, buf_recv):  # chapter 7, by name
    if dist.get_rank() == 0:
        send(buf_send, 1)
        recv(buf_recv, 1)
    else:
        recv(buf_recv, 0)
        send(buf_recv, 0)


CASES = {
    "ch0 start_overlap": (lambda: ch00_exercises.exercises()["start_overlap"], start_overlap),
    "ch1 worker_step": (lambda: ch01.exercises(param_bytes=1000)["worker_step"], worker_step),
    "ch2 reduce_scatter": (lambda: ch02_exercises.exercises(alpha=1e-4, beta=1e-9)["reduce_scatter"],
                           my_reduce_scatter),
    "ch5 sharded": (lambda: ch05_exercises.exercises()["sharded"], sharded_trust_ratio),
    "ch5 sharded functional": (lambda: ch05_exercises.exercises()["sharded"], sharded_trust_ratio_functional),
    "ch6 randomk": (lambda: ch06_exercises.exercises()["randomk"], randomk_step),
    "ch6 randomk functional": (lambda: ch06_exercises.exercises()["randomk"], randomk_step_functional),
    "ch7 pingpong": (lambda: ch07_exercises.exercises()["pingpong"], ping_pong),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_a_right_answer_written_another_way_is_accepted(case):
    # catches: "your code ran no communication" for `from torch.distributed import all_reduce`, and
    # "ValueError: Invalid op" for P2POp(dist.isend, ...) under a checker that replaced dist.isend
    exercise, answer = CASES[case]
    verdict = exercise().submit(_as_cell(answer))
    assert verdict.ok, verdict.message


def returns_its_handle(model):  # chapter 0: the hook hands back the handle instead of keeping it
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda p: dist.all_reduce(p.grad, async_op=True))
    return lambda: None


def test_a_hook_returning_its_handle_is_told_what_a_hook_may_return():
    # catches: the verdict naming the checker's own wrapper class (`_Handle`) and giving no advice
    verdict = ch00_exercises.exercises()["start_overlap"].submit(_as_cell(returns_its_handle))
    assert not verdict.ok and "must return None" in verdict.message and "_Handle" not in verdict.message, \
        verdict.message
