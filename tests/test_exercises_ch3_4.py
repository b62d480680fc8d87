"""Chapters 3 and 4: every exercise accepts its reference answer and rejects plausible wrong ones
with a message that helps; the write-it-yourself exercises run on real ranks."""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from lesson_lib import comm
from lesson_lib.chapters import ch03_exercises, ch04
from lesson_lib.chapters.ch03_gpipe import check_gpipe
from lesson_lib.chapters.ch04_exercises import check_zero1
from lesson_lib.exercises import Exercise
from lesson_lib.milestones.pipeline.schedules import stage_actions

EX4 = ch04.exercises()
EX3 = ch03_exercises.exercises(stages=4, run=False)  # smallest_m's real run is tested below


def verdict(ex: Exercise, answer):
    """What the notebook's submit returns (exceptions from the answer become a verdict there too)."""
    return ex.submit(answer)


@pytest.mark.parametrize("ex", [*EX3.values(), *EX4.values()], ids=lambda e: e.key)
def test_every_reference_is_accepted(ex):
    assert verdict(ex, ex.reference())


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


def zero1_all_reduce_then_gather(params, grad, step):  # right numbers, no reduce-scatter at all
    rank, n = dist.get_rank(), dist.get_world_size()
    dist.all_reduce(grad)
    size = params.numel() // n
    step(params[rank * size:(rank + 1) * size], grad[rank * size:(rank + 1) * size] / n)
    comm.ring_all_gather(params)
    return params


def zero1_torch_collectives(params, grad, step):  # right, with torch's own collectives
    rank, n = dist.get_rank(), dist.get_world_size()
    size = params.numel() // n
    mine = torch.empty(size)
    dist.reduce_scatter_single(mine, grad)
    step(params[rank * size:(rank + 1) * size], mine / n)
    dist.all_gather_single(params, params[rank * size:(rank + 1) * size].clone())
    return params


def zero1_by_hand(params, grad, step):  # right, a ring of point-to-point exchanges written out
    rank, n = dist.get_rank(), dist.get_world_size()
    size = params.numel() // n
    right, left = (rank + 1) % n, (rank - 1) % n
    g, p = grad.view(n, size), params.view(n, size)
    for s in range(n - 1):  # reduce-scatter: rank ends with the sum of slice `rank`
        send_i, into_i = (rank - s - 1) % n, (rank - s - 2) % n
        incoming = torch.empty(size)
        comm.exchange(g[send_i], right, incoming, left).wait()
        g[into_i] += incoming
    step(p[rank], g[rank] / n)
    for s in range(n - 1):  # all-gather
        send_i, into_i = (rank - s) % n, (rank - s - 1) % n
        comm.exchange(p[send_i].clone(), right, p[into_i], left).wait()
    return params


def zero1_mean_over_four(params, grad, step):  # right at 4 ranks only: the mean divides by a typed 4
    rank, n = dist.get_rank(), dist.get_world_size()
    size = params.numel() // n
    mine = torch.empty(size)
    dist.reduce_scatter_single(mine, grad)
    step(params[rank * size:(rank + 1) * size], mine / 4)
    dist.all_gather_single(params, params[rank * size:(rank + 1) * size].clone())
    return params


def test_zero1_rejects_an_answer_right_at_one_world_size_only():
    v = verdict(EX4["zero1"], zero1_mean_over_four)
    assert not v and v.message.startswith("3 ranks"), v.message  # passes both 4-rank cases first


def zero1_returns_the_neighbours_slice(params, grad, step):  # once told only "its length is wrong"
    params = zero1_torch_collectives(params, grad, step)  # right, then one slice returned
    size = params.numel() // dist.get_world_size()
    k = (dist.get_rank() + 1) % dist.get_world_size()
    return params[k * size:(k + 1) * size]


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
    (zero1_returns_the_neighbours_slice, "rank 1's slice, not the parameters"),
    (zero1_all_reduce_then_gather, "ran dist.all_reduce ×1 (48 bytes) + comm.ring_all_gather"),
])
def test_zero1_rejects_wrong_answers(answer, words):
    v = verdict(EX4["zero1"], answer)
    assert not v and words in v.message, v.message


def zero1_times_the_inverse(params, grad, step):  # right: · (1/N) rounds unlike / N at N = 3 (refused once)
    rank, n = dist.get_rank(), dist.get_world_size()
    mine = comm.ring_reduce_scatter(grad).mul_(1.0 / n)
    size = params.numel() // n
    step(params[rank * size:(rank + 1) * size], mine)
    comm.ring_all_gather(params)
    return params


def zero1_divides_first(params, grad, step):  # right, DDP's order: each rank divides, then the sum
    rank, n = dist.get_rank(), dist.get_world_size()
    grad /= n
    mine = comm.ring_reduce_scatter(grad)
    size = params.numel() // n
    step(params[rank * size:(rank + 1) * size], mine)
    comm.ring_all_gather(params)
    return params


@pytest.mark.parametrize("answer", [zero1_torch_collectives, zero1_by_hand, zero1_times_the_inverse,
                                    zero1_divides_first])
def test_zero1_accepts_right_answers_in_other_forms(answer):
    v = verdict(EX4["zero1"], answer)
    assert v, v.message


def zero1_gather_by_all_reduce(params, grad, step):  # right: the all-gather as an all-reduce of zeros + slice
    rank, n = dist.get_rank(), dist.get_world_size()
    size = params.numel() // n
    mine = comm.ring_reduce_scatter(grad).div_(n)
    step(params[rank * size:(rank + 1) * size], mine)
    padded = torch.zeros_like(params)
    padded[rank * size:(rank + 1) * size] = params[rank * size:(rank + 1) * size]
    dist.all_reduce(padded)
    params.copy_(padded)
    return params


@pytest.mark.ch4
def test_zero1_accepts_an_all_gather_done_as_an_all_reduce_and_says_it_costs_twice():
    v = verdict(EX4["zero1"], zero1_gather_by_all_reduce)  # once "hands every rank the whole summed gradient"
    assert v and "twice the bytes of an all-gather" in v.message, v.message


def zero1_gather_by_all_reduce_unpadded(params, grad, step):  # every rank hands in its whole vector
    rank, n = dist.get_rank(), dist.get_world_size()
    size = params.numel() // n
    mine = comm.ring_reduce_scatter(grad).div_(n)
    step(params[rank * size:(rank + 1) * size], mine)
    dist.all_reduce(params)
    return params


@pytest.mark.ch4
def test_zero1_all_reduce_of_the_whole_parameters_is_told_what_it_summed():
    v = verdict(EX4["zero1"], zero1_gather_by_all_reduce_unpadded)
    assert not v and "summed every rank's whole parameter vector" in v.message, v.message
    assert "plus N−1 copies of the old values" in v.message and "gradient" not in v.message, v.message


def zero1_reduce_each_slice(params, grad, step):  # right: dist.reduce of slice k to its owner k
    rank, n = dist.get_rank(), dist.get_world_size()
    size = params.numel() // n
    for k in range(n):
        dist.reduce(grad[k * size:(k + 1) * size], dst=k)
    step(params[rank * size:(rank + 1) * size], grad[rank * size:(rank + 1) * size] / n)
    dist.all_gather_into_tensor(params, params[rank * size:(rank + 1) * size].clone())
    return params


def zero1_reduce_and_broadcast_each_slice(params, grad, step):  # right: slice k reduced to k, then sent out
    rank, n = dist.get_rank(), dist.get_world_size()
    size = params.numel() // n
    for k in range(n):
        dist.reduce(grad[k * size:(k + 1) * size], dst=k)
    step(params[rank * size:(rank + 1) * size], grad[rank * size:(rank + 1) * size] / n)
    for k in range(n):
        dist.broadcast(params[k * size:(k + 1) * size], src=k)
    return params


@pytest.mark.ch4
@pytest.mark.parametrize("answer", [zero1_reduce_each_slice, zero1_reduce_and_broadcast_each_slice])
def test_zero1_accepts_a_reduce_of_each_slice_to_its_owner(answer):
    v = verdict(EX4["zero1"], answer)  # once "no reduce-scatter of the gradient"
    assert v, v.message


def zero1_reduce_whole_gradient_to_each(params, grad, step):  # the whole gradient reduced N times
    rank, n = dist.get_rank(), dist.get_world_size()
    size = params.numel() // n
    for k in range(n):
        summed = grad.clone()
        dist.reduce(summed, dst=k)
        if k == rank:
            mine = summed[rank * size:(rank + 1) * size] / n
    step(params[rank * size:(rank + 1) * size], mine)
    comm.ring_all_gather(params)
    return params


@pytest.mark.ch4
def test_zero1_reduce_of_the_whole_gradient_to_each_rank_is_named():
    v = verdict(EX4["zero1"], zero1_reduce_whole_gradient_to_each)
    assert not v and "a reduce carried 48 bytes, more than one slice's 12" in v.message, v.message


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


@pytest.mark.slow
def test_zero1_deadlock_ends_with_the_timeout_message():
    v = check_zero1(zero1_deadlock, timeout_s=4)
    assert not v and v.message.startswith("4 ranks, 12 parameters: WorkerTimeout"), v.message
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


def lr_typed_in(params, grads, rank, world_size, lr):  # a reviewer's: right while lr is 0.1 only
    size = -(-params.numel() // world_size)
    lo, hi = min(rank * size, params.numel()), min((rank + 1) * size, params.numel())
    return params[lo:hi] - 0.1 * grads[lo:hi]


@pytest.mark.parametrize("answer, words", [
    (lr_typed_in, "lr = 0.03"),
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


def _stage1_as_list(params, grads, rank, world_size, lr):  # right: a list, the slice found by arithmetic
    size = -(-params.numel() // world_size)
    lo, hi = min(rank * size, params.numel()), min((rank + 1) * size, params.numel())
    return (params[lo:hi] - lr * grads[lo:hi]).tolist()


def _stage1_in_place(params, grads, rank, world_size, lr):  # right: steps its slice in place (a view)
    size = -(-params.numel() // world_size)
    mine = params[rank * size:(rank + 1) * size]
    return mine.sub_(lr * grads[rank * size:(rank + 1) * size])


@pytest.mark.parametrize("answer", [_stage1_as_list, _stage1_in_place])
def test_stage1_accepts_right_answers_in_other_forms(answer):
    v = verdict(EX4["stage1"], answer)
    assert v and "An all-gather joins the slices" in v.message, v.message


def test_stage1_names_the_case_where_a_function_raises():
    def chunked(params, grads, rank, world_size, lr):  # torch.chunk makes 3 chunks of 5 for 4 ranks
        return (params - lr * grads).chunk(world_size)[rank]

    v = verdict(EX4["stage1"], chunked)
    assert not v and v.message.startswith("5 parameters on N = 4 ranks"), v.message
    # once "your function raised IndexError" alone: now which rank, and why it has no chunk
    assert "rank 3's call: your function raised IndexError" in v.message, v.message
    assert "empty slice [5:5]" in v.message, v.message


def test_stage1_accepts_torch_chunk_with_the_empty_slices_filled():
    def chunked(params, grads, rank, world_size, lr):
        parts = list((params - lr * grads).chunk(world_size))
        return parts[rank] if rank < len(parts) else params[:0]

    assert verdict(EX4["stage1"], chunked)


@pytest.mark.parametrize("answer", [
    lambda psi, n: 16 * psi / n,  # stage 3
    lambda psi, n: 4 * psi + 12 * psi / n,  # stage 1
    lambda psi, n: 2 * psi + 12 * psi / n,  # gradients forgotten
    lambda psi, n: 16 * psi,  # stage 0
])
def test_stage2_rejects_wrong_formulas(answer):
    v = verdict(EX4["stage2"], answer)
    assert not v and "replicated" in v.message, v.message
    a, b = v.message.split("returned ")[1].split("; expected ")
    assert a != b.split(";")[0]  # never two equal-looking numbers


@pytest.mark.parametrize("answer", [  # the one normaliser: the same answer in every form is right
    lambda psi, n: str(2 * psi + 14 * psi / n),
    lambda psi, n: torch.tensor(2 * psi + 14 * psi / n, dtype=torch.float64),
    lambda psi, n: (2 * psi * n + 14 * psi) // n,  # whole bytes
])
def test_stage2_accepts_the_formula_in_other_forms(answer):
    v = verdict(EX4["stage2"], answer)
    assert v, v.message


@pytest.mark.ch4
@pytest.mark.parametrize("answer, unit", [
    (lambda psi, n: (2 * psi + 14 * psi / n) / 1e9, "that reads as GB (× 1,000,000,000)"),
    (lambda psi, n: (2 * psi + 14 * psi / n) / 2**30, "that reads as GiB (× 1,073,741,824)"),
], ids=["GB", "GiB"])
def test_stage2_in_gigabytes_is_told_its_unit(answer, unit):
    v = verdict(EX4["stage2"], answer)  # once "think about which parts are replicated": the formula was right
    assert not v and unit in v.message and "replicated" not in v.message, v.message


@pytest.mark.ch4
def test_stage2_reads_bytes_written_with_their_unit():
    v = verdict(EX4["stage2"], lambda psi, n: f"{(2 * psi + 14 * psi / n) / 1e6} MB")  # once "does not read"
    assert v, v.message


@pytest.mark.parametrize("answer, ok", [(1, True), (1.0, True), (1.9, False), (0, False), (2, False),
                                        (3, False), (True, False), ("1", True), (" 1 ", True),
                                        (torch.tensor(1), True), (-1, False), ("one", False),
                                        ("stage 1", True), ("ZeRO-1", True), ("ZeRO-2", False)])
def test_fit_requires_the_integer_stage(answer, ok):
    v = verdict(EX4["fit"], answer)
    assert bool(v) is ok, (answer, v.message)
    if answer == 1.9:
        assert "whole number" in v.message


# --------------------------------------------------------------------------- ch3: gpipe (real ranks)


def gpipe(stage, xs, ys, scale=True, backwards=None, grad_back=True, requires_grad=True, count=None,
          divide=None, last_sends=False):
    """The reference GPipe stage, with one thing changed at a time (the wrong answers below)."""
    k, P = dist.get_rank(), dist.get_world_size()
    last = P - 1
    M, outs = len(xs), []
    n = M if count is None else count
    for i in range(n):
        if k > 0:
            dist.recv(xs[i], k - 1)
            if requires_grad:
                xs[i].requires_grad_()
        out = stage(xs[i])
        if k < last or last_sends:
            dist.send(out.detach(), k + 1)
        outs.append(out)
    for i in (backwards or range)(n):
        if k == last:
            loss = F.cross_entropy(outs[i], ys[i])
            (loss / (divide or M) if scale else loss).backward()
        else:
            g = torch.empty_like(outs[i])
            dist.recv(g, k + 1)
            outs[i].backward(g)
        if k > 0 and grad_back:
            dist.send(xs[i].grad, k - 1)


def gpipe_four_stages_only(stage, xs, ys):  # right at 4 stages only: the loss scaled by P / 4
    gpipe(stage, xs, ys, divide=len(xs) * dist.get_world_size() / 4)


def test_gpipe_rejects_an_answer_right_at_one_world_size_only():
    v = verdict(EX3["gpipe"], gpipe_four_stages_only)
    assert not v and v.message.startswith("2 stages"), v.message  # passes both 4-stage cases first


def gpipe_reverse_backwards(stage, xs, ys):  # also correct: backwards in any order sum the same
    gpipe(stage, xs, ys, backwards=lambda n: reversed(range(n)))


def gpipe_last_stage_sends_on(stage, xs, ys):  # to rank P, which does not exist (Gloo: SIGSEGV)
    gpipe(stage, xs, ys, last_sends=True)


def gpipe_unscaled(stage, xs, ys):
    gpipe(stage, xs, ys, scale=False)


def gpipe_first_microbatch_only(stage, xs, ys):
    gpipe(stage, xs, ys, count=1)


def gpipe_input_without_grad(stage, xs, ys):
    gpipe(stage, xs, ys, requires_grad=False)


def gpipe_last_stage_halves_the_loss(stage, xs, ys):  # a last-stage bug: every stage is wrong
    gpipe(stage, xs, ys, divide=2 * len(xs))


def gpipe_only_the_last_stage_backpropagates(stage, xs, ys):
    k, P = dist.get_rank(), dist.get_world_size()
    outs = []
    for x in xs:
        if k > 0:
            dist.recv(x, k - 1)
        outs.append(stage(x))
        if k < P - 1:
            dist.send(outs[-1].detach(), k + 1)
    if k == P - 1:
        for out, y in zip(outs, ys):
            (F.cross_entropy(out, y) / len(xs)).backward()


@pytest.mark.numerics  # float64 gradients against single-process backprop, within GRAD_RTOL
def test_gpipe_accepts_another_correct_order():
    assert verdict(EX3["gpipe"], gpipe_reverse_backwards)


@pytest.mark.parametrize("answer, words", [
    (gpipe_unscaled, "M times too large"),
    (gpipe_last_stage_sends_on, "there is no rank 4"),
    # catches: a last-stage bug told "stage 0's gradients differ; stages after it agree"
    (gpipe_last_stage_halves_the_loss, "(last) differs by up to"),
    (gpipe_last_stage_halves_the_loss, "Look first at the last stage"),
    (gpipe_first_microbatch_only, "stage 0 sent 1 activation(s) to stage 1"),
    (gpipe_input_without_grad, "rank"),  # x.grad is None: the send fails, the verdict names the rank
    (gpipe_input_without_grad, "requires_grad_()"),  # ... and says why, not only "got NoneType"
    (gpipe_input_without_grad, "TypeError: Invalid function argument"),  # the headline is whole
])
def test_gpipe_rejects_wrong_answers(answer, words):
    v = verdict(EX3["gpipe"], answer)
    assert not v and words in v.message, v.message


def test_gpipe_rejects_a_stage_that_never_backpropagates():
    v = check_gpipe(gpipe_only_the_last_stage_backpropagates)  # finishes: no deadline waited
    assert not v and "0 gradient(s) to stage" in v.message, v.message


def gpipe_one_f_one_b(stage, xs, ys):  # right gradients, but each backward follows its forward at once
    k, P = dist.get_rank(), dist.get_world_size()
    for i in range(len(xs)):
        if k > 0:
            dist.recv(xs[i], k - 1)
            xs[i].requires_grad_()
        out = stage(xs[i])
        if k < P - 1:
            dist.send(out.detach(), k + 1)
            g = torch.empty_like(out)
            dist.recv(g, k + 1)
            out.backward(g)
        else:
            (F.cross_entropy(out, ys[i]) / len(xs)).backward()
        if k > 0:
            dist.send(xs[i].grad, k - 1)


@pytest.mark.numerics
def test_gpipe_rejects_a_schedule_that_is_not_gpipes():
    v = check_gpipe(gpipe_one_f_one_b, timeout_s=10)
    assert not v and "not GPipe's schedule" in v.message, v.message


def gpipe_both_receive_first(stage, xs, ys):
    # every stage but the first waits for a gradient before it has sent anything
    k, P = dist.get_rank(), dist.get_world_size()
    if k < P - 1:
        g = torch.empty(len(xs[0]), 1)
        dist.recv(g, k + 1)
    gpipe(stage, xs, ys)


def gpipe_no_grad_back(stage, xs, ys):
    gpipe(stage, xs, ys, grad_back=False)


@pytest.mark.slow
def test_gpipe_deadlock_ends_with_the_timeout_message():
    v = check_gpipe(gpipe_both_receive_first, timeout_s=4)  # every stage waits: a true deadlock
    assert not v and v.message.startswith("4 stages, M = 4: WorkerTimeout") and "recv" in v.message, v.message


def test_gpipe_that_never_sends_gradients_back_is_named_at_once():
    # once waited out the timeout: a stage waits for a gradient its neighbour returned without sending
    v = check_gpipe(gpipe_no_grad_back)
    assert not v and "WorkerMismatch" in v.message and "never makes" in v.message, v.message
    assert "recv from rank" in v.message, v.message


def test_gpipe_template_is_not_answered_yet():
    def my_gpipe_stage(stage, xs, ys):
        # 1. all forwards ...
        ...

    assert verdict(EX3["gpipe"], my_gpipe_stage).message == "not answered yet"


# --------------------------------------------------------------------------- ch3: paper and pencil


def order(schedule, stage=1, m=6):
    return " ".join(f"{a}{i}" for a, i in stage_actions(schedule, 4, m, stage))


def test_order_accepts_every_form_and_says_what_holds():
    want = stage_actions("1f1b", 4, 6, 1)
    # worked by hand (Narayanan et al., 2021): stage 1 of 4 warms up with P − 1 − 1 = 2 forwards, then
    # alternates one forward, one backward, and drains the last two backwards
    by_hand = "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5"
    for answer in (by_hand, order("1f1b"), order("1f1b").replace(" ", ", "), [f"{a}{i}" for a, i in want],
                   want, [(a.lower(), i) for a, i in want],
                   by_hand.replace(" ", " → "), by_hand.replace(" ", "->") + ".", by_hand.replace(" ", ";")):
        v = verdict(EX3["order"], answer)
        assert v and "that is stage 1's 1F1B order" in v.message and "at most 3" in v.message, v.message


@pytest.mark.parametrize("answer, words", [
    (order("gpipe"), "valid schedule, but it is GPipe's"),
    (order("1f1b", stage=0), "not 1F1B"),  # stage 0's order: one forward more before the first backward
    ("F0 F1 F2 F3 F4 B0 F5 B1 B2 B3 B4 B5", "holds 5 at once"),  # too many in flight (it also deadlocks)
    ("F0 F1 B0 B1 F2 F3 B2 B3 F4 F5 B4 B5", "deadlock"),  # 2 in flight, but B1 waits for stage 2's B1,
    # which waits for this stage's F2
    (order("1f1b", stage=2), "not 1F1B"),  # stage 2's: one forward fewer in flight, a longer step
    (order("1f1b", stage=2), "39 slots against 1F1B's 27"),
    ("F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4", "exactly once"),  # a backward left out
    ("B0 F0 F1 F2 F3 F4 F5 B1 B2 B3 B4 B5", "B0 comes before F0"),
    ("F0 F1 F2 B0", "exactly once"),
    ("F0 F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4", "exactly once"),
    ([0, 1, 2], "each is 'F' or 'B' and a micro-batch"),  # once "your answer raised TypeError"
    ("forward all, then backward", "write the actions in order"),
])
def test_order_rejects_wrong_answers_with_the_right_reason(answer, words):
    v = verdict(EX3["order"], answer)
    assert not v and words in v.message, v.message
    assert "deadlock" not in v.message or words == "deadlock", v.message


@pytest.mark.parametrize("answer, ok", [(28, True), (28.0, True), (28.7, False), (27, False), (29, False),
                                        (True, False), ("28", True), (torch.tensor(28), True), (0, False)])
def test_smallest_m_requires_the_integer(answer, ok):
    v = verdict(EX3["smallest_m"], answer)
    assert bool(v) is ok, (answer, v.message)


def test_smallest_m_reports_a_real_run_when_right(monkeypatch):
    from lesson_lib.chapters import ch03

    monkeypatch.setattr(ch03_exercises, "measured_bubble", lambda m, stages=4: f"measured with M={m}")
    assert ch03.exercises(4)["smallest_m"].check(28).message == "measured with M=28"


@pytest.mark.parametrize("answer, ok", [(4, True), (4.0, True), (4.5, False), (8, False), (3, False),
                                        ("4", True), ("four", False)])
def test_in_flight_requires_a_whole_count(answer, ok):
    assert bool(verdict(EX3["in_flight"], answer)) is ok


@pytest.mark.parametrize("answer, ok", [(0.2727, True), (3 / 11, True), (0.375, False), (3 / 8, False),
                                        (0.27 * 100, False)])
def test_bubble(answer, ok):
    assert bool(verdict(EX3["bubble"], answer)) is ok


# --------------------------------------------------------------------------- ch3: the notebook's claim


def one_f_one_b_with_blocking_sends(cfg):
    """The notebook's stage loop with dist.send instead of dist.isend (one step)."""
    from lesson_lib.chapters import ch03

    k, P, M = dist.get_rank(), dist.get_world_size(), cfg.microbatches
    stage, x_all, y_all, width = ch03.stage_setup(cfg, k)
    mbs, held = ch03.microbatch_indices(cfg, 0), {}
    for kind, i in stage_actions("1f1b", P, M, k):
        if kind == "F":
            x = x_all[mbs[i]] if k == 0 else torch.empty(len(mbs[i]), width)
            if k > 0:
                dist.recv(x, k - 1)
                x.requires_grad_()
            out = stage(x)
            if k == P - 1:
                out = F.cross_entropy(out, y_all[mbs[i]])
            else:
                dist.send(out.detach(), k + 1)
            held[i] = (x, out)
        else:
            x, out = held.pop(i)
            if k == P - 1:
                (out / M).backward()
            else:
                g = torch.empty_like(out)
                dist.recv(g, k + 1)
                out.backward(g)
            if k > 0:
                dist.send(x.grad, k - 1)


@pytest.mark.slow
def test_1f1b_with_blocking_sends_deadlocks_as_the_notebook_says():
    from lesson_lib import WorkerTimeout, warm_cluster
    from lesson_lib.milestones import pipeline as pp

    cfg = pp.Config.tiny(stages=4, microbatches=4, schedule="1f1b")
    with pytest.raises(WorkerTimeout, match="send"):
        warm_cluster(4).run(one_f_one_b_with_blocking_sends, cfg, timeout_s=5)
