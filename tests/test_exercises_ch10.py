"""Chapter 10's exercises: each accepts its reference answer and other right forms, and rejects
plausible wrong answers with a message that points at the mistake. The numbers below are worked by
hand from the question (4,096 GPUs, one GPU failing every 50,000 h, δ = 300 s)."""

import math

import pytest
import torch
import torch.distributed as dist
from torch.distributed import all_reduce

from lesson_lib.chapters import ch10_exercises

pytestmark = pytest.mark.ch10
EX = ch10_exercises.exercises()
M = 50_000 * 3600 / 4096  # 43,945.3 s: the job's MTBF
YOUNG = math.sqrt(2 * 300 * M)  # 5,135 s


@pytest.mark.parametrize("key", list(EX))
def test_every_reference_is_accepted(key):
    assert EX[key].submit(EX[key].reference())


def test_the_outer_template_is_not_answered_yet():
    def outer_step(local, start, buf, lr, mu):
        ...

    v = EX["outer"].submit(outer_step)
    assert not v and v.message == "not answered yet"


# --------------------------------------------------------------------------- the interval


@pytest.mark.parametrize("answer", [5135, "5,135", 5130.0, 4937], ids=["int", "text", "rounded", "daly"])
def test_interval_accepts_young_or_daly(answer):
    assert EX["interval"].submit(answer)


@pytest.mark.parametrize("answer, says", [
    (YOUNG / 60, "minutes"),
    (math.sqrt(300 * M), "the 2 is missing"),
    (math.sqrt(2 * 300 * 50_000 * 3600), "divided by the number of GPUs"),
    (math.sqrt(2 * 5 * M), "same unit"),  # δ in minutes, M in seconds
    (1000, "work out the job's MTBF"),
], ids=["minutes", "no-2", "device-mtbf", "units", "other"])
def test_interval_rejects_wrong_answers_saying_why(answer, says):
    v = EX["interval"].submit(answer)
    assert not v and says in v.message, v.message


# --------------------------------------------------------------------------- the outer step


def outer_imported(local, start, buf, lr, mu):
    delta = start - local
    all_reduce(delta)
    delta = delta / dist.get_world_size()
    buf = buf * mu + delta
    return start - lr * delta - lr * mu * buf, buf


def outer_with_torch_sgd(local, start, buf, lr, mu):  # torch's own optimizer does the Nesterov step
    p = torch.nn.Parameter(start.clone())
    opt = torch.optim.SGD([p], lr=lr, momentum=mu, nesterov=True)
    opt.state[p]["momentum_buffer"] = buf.clone()
    g = start - local
    dist.all_reduce(g, op=dist.ReduceOp.AVG) if dist.get_backend() != "gloo" else dist.all_reduce(g)
    p.grad = g / dist.get_world_size()
    opt.step()
    return p.detach(), opt.state[p]["momentum_buffer"]


def outer_local_only(local, start, buf, lr, mu):
    delta = start - local
    buf = mu * buf + delta
    return start - lr * (delta + mu * buf), buf


def outer_heavy_ball(local, start, buf, lr, mu):
    delta = start - local
    dist.all_reduce(delta)
    delta /= dist.get_world_size()
    buf = mu * buf + delta
    return start - lr * buf, buf


def outer_wrong_sign(local, start, buf, lr, mu):
    delta = start - local
    dist.all_reduce(delta)
    delta /= dist.get_world_size()
    buf = mu * buf + delta
    return start + lr * (delta + mu * buf), buf


def outer_summed(local, start, buf, lr, mu):
    delta = start - local
    dist.all_reduce(delta)
    buf = mu * buf + delta
    return start - lr * (delta + mu * buf), buf


def outer_halved(local, start, buf, lr, mu):  # right at 2 ranks only
    delta = start - local
    dist.all_reduce(delta)
    delta /= 2
    buf = mu * buf + delta
    return start - lr * (delta + mu * buf), buf


def outer_lr_and_mu_swapped(local, start, buf, lr, mu):  # told apart only when lr ≠ μ (a reviewer's)
    delta = start - local
    dist.all_reduce(delta)
    delta /= dist.get_world_size()
    buf = lr * buf + delta
    return start - mu * (delta + lr * buf), buf


def outer_momentum_of_rank_0_only(local, start, buf, lr, mu):  # the other ranks keep a local buffer
    delta = start - local
    dist.all_reduce(delta)
    delta /= dist.get_world_size()
    new_buf = mu * buf + delta
    mine = new_buf if dist.get_rank() == 0 else mu * buf + start - local
    return start - lr * (delta + mu * new_buf), mine


@pytest.mark.parametrize("answer", [outer_imported, outer_with_torch_sgd], ids=["imported", "torch-sgd"])
def test_outer_accepts_other_right_forms(answer):
    assert EX["outer"].submit(answer)


@pytest.mark.parametrize("answer, says", [
    (outer_local_only, "all-reduce"),
    (outer_heavy_ball, "heavy-ball"),
    (outer_wrong_sign, "wrong way"),
    (outer_summed, "summed, not averaged"),
    (outer_halved, "4 ranks"),
    (outer_lr_and_mu_swapped, "momentum is not μ·buffer + Δ"),
    (outer_momentum_of_rank_0_only, "rank 1's returned momentum"),
], ids=["no-all-reduce", "heavy-ball", "sign", "summed", "halved", "lr-mu-swapped", "local-momentum"])
def test_outer_rejects_wrong_answers_saying_why(answer, says):
    v = EX["outer"].submit(answer)
    assert not v and says in v.message, v.message


# --------------------------------------------------------------------------- the vanished peer
# Each right or wrong answer below runs 2 and 3 replica processes, one SIGKILLed mid-exchange.


def _get(store, key):
    import io

    return torch.load(io.BytesIO(store.get(key)), weights_only=False)


def _put(store, key, t):
    import io

    buf = io.BytesIO()
    torch.save(t, buf)
    store.set(key, buf.getvalue())


def _by_hand(average):
    def exchange(store, rnd, me, grad, members):  # its own serialization, the sum by hand
        import time

        _put(store, f"grad/{rnd}/{me}", grad)
        keys = [f"grad/{rnd}/{m}" for m in members]
        while True:
            if store.check(keys):
                total = torch.zeros_like(grad)
                for k in keys:
                    total = total + _get(store, k)
                return average(total, len(members))
            if store.check([f"dead/{rnd}"]):
                return None
            time.sleep(0.002)
    return exchange


exchange_own_words = _by_hand(lambda total, n: total / n)  # right
exchange_times_the_inverse = _by_hand(lambda total, n: total * (1.0 / n))  # right: once refused (bits)


def exchange_partial(store, rnd, me, grad, members):  # averages whatever arrived once a peer is dead
    import time

    _put(store, f"grad/{rnd}/{me}", grad)
    keys = [f"grad/{rnd}/{m}" for m in members]
    while not store.check(keys):
        if store.check([f"dead/{rnd}"]):
            got = [k for k in keys if store.check([k])]
            return sum(_get(store, k) for k in got) / len(got)
        time.sleep(0.002)
    return sum(_get(store, k) for k in keys) / len(members)


def exchange_halves(store, rnd, me, grad, members):  # right at 2 replicas only
    import time

    _put(store, f"grad/{rnd}/{me}", grad)
    keys = [f"grad/{rnd}/{m}" for m in members]
    while not store.check(keys):
        if store.check([f"dead/{rnd}"]):
            return None
        time.sleep(0.002)
    return sum(_get(store, k) for k in keys) / 2


def exchange_waits_forever(store, rnd, me, grad, members):
    import time

    _put(store, f"grad/{rnd}/{me}", grad)
    keys = [f"grad/{rnd}/{m}" for m in members]
    while not store.check(keys):
        time.sleep(0.01)
    return sum(_get(store, k) for k in keys) / len(members)


@pytest.mark.parametrize("answer", [exchange_own_words, exchange_times_the_inverse],
                         ids=["own-words", "inverse"])
def test_exchange_accepts_another_right_form(answer, no_orphans):
    assert EX["exchange"].submit(answer)


@pytest.mark.parametrize("answer, says", [
    (exchange_partial, "was committed although"),
    (exchange_halves, "by their number"),  # caught when the survivor goes on alone
], ids=["partial", "halves"])
def test_exchange_rejects_wrong_answers_saying_why(answer, says, no_orphans):
    v = EX["exchange"].submit(answer)
    assert not v and says in v.message, v.message


@pytest.mark.slow  # waits out the replicas' 45 s limit
def test_exchange_that_waits_forever_is_told_so(no_orphans):
    v = EX["exchange"].submit(exchange_waits_forever)
    assert not v and "dead/{rnd}" in v.message, v.message


# --------------------------------------------------------------------------- issue 59: forms and verdicts


@pytest.mark.parametrize("answer", ["5135 s", "5,135 seconds", "85.6 min"], ids=["s", "seconds", "min"])
def test_interval_accepts_a_duration_with_its_unit(answer):
    assert EX["interval"].submit(answer)


def test_interval_accepts_a_timedelta():
    import datetime

    assert EX["interval"].submit(datetime.timedelta(seconds=5135))


def test_interval_with_the_mtbf_left_in_hours_is_told_so():
    tau = math.sqrt(2 * 300 * (50_000 / 4096))  # δ in seconds, M in hours: 85.6
    v = EX["interval"].submit(tau)
    assert not v and "M was left in hours" in v.message, v.message


def test_interval_given_as_dalys_first_order_form_is_told_so():
    v = EX["interval"].submit(math.sqrt(2 * 300 * M) - 300)  # 4,835 s
    assert not v and "Daly" in v.message and "work out" not in v.message, v.message


def outer_as_list(local, start, buf, lr, mu):
    delta = start - local
    dist.all_reduce(delta)
    delta /= dist.get_world_size()
    buf = mu * buf + delta
    return [start - lr * (delta + mu * buf), buf]


def outer_from_local(local, start, buf, lr, mu):  # steps from local, not from start
    delta = start - local
    dist.all_reduce(delta)
    delta /= dist.get_world_size()
    buf = mu * buf + delta
    return local - lr * (delta + mu * buf), buf


def test_outer_accepts_a_list():
    assert EX["outer"].submit(outer_as_list)


def test_outer_from_local_is_told_to_start_from_start():
    v = EX["outer"].submit(outer_from_local)
    assert not v and "starts from start" in v.message and "must be averaged" not in v.message, v.message


def exchange_reversed(store, rnd, me, grad, members):  # the average, summed from the last member
    import time

    _put(store, f"grad/{rnd}/{me}", grad)
    keys = [f"grad/{rnd}/{m}" for m in members]
    while not store.check(keys):
        if store.check([f"dead/{rnd}"]):
            return None
        time.sleep(0.002)
    total = torch.zeros_like(grad)
    for k in reversed(keys):
        total = total + _get(store, k)
    return total / len(members)


def test_exchange_summed_in_reverse_order_is_told_so(no_orphans):
    v = EX["exchange"].submit(exchange_reversed)
    assert not v and "reverse member order" in v.message and "by their number" not in v.message, v.message


@pytest.mark.parametrize("kw, says", [
    ({"kill": [(1, 5), (1, 6)]}, "one (replica, step) pair"),
    ({"kill": [(0, 5), (1, 5)]}, "one (replica, step) pair"),
    ({"kill": (2, 5)}, "no replica 2"),
    ({"kill": (1, 11)}, "kill in step 1 … 10"),
], ids=["two-kills", "two-replicas", "no-such-replica", "last-step"])
def test_survive_refuses_other_kills_up_front(kw, says):
    from lesson_lib.chapters import ch10
    from lesson_lib.milestones.resilience import task as T

    with pytest.raises(ValueError, match="kill=") as e:
        ch10.survive(T.Task(steps=12), n=2, **kw)
    assert says in str(e.value)


def test_diloco_survives_refuses_a_kill_in_the_last_round():
    from lesson_lib.chapters import ch10
    from lesson_lib.milestones.resilience import task as T

    with pytest.raises(ValueError, match=r"kill=\(1, 3\).*outer step 1 … 1"):
        ch10.diloco_survives(T.Task(), h=4, kill=(1, 3))  # 12 steps: 3 outer steps, 0 … 2


def outer_flipped_pseudo_gradient(local, start, buf, lr, mu):  # local − start: the step goes backwards
    delta = local - start
    dist.all_reduce(delta)
    delta /= dist.get_world_size()
    buf = mu * buf + delta
    return start - lr * (delta + mu * buf), buf


def test_outer_with_a_flipped_pseudo_gradient_is_told_the_step_goes_the_wrong_way():
    v = EX["outer"].submit(outer_flipped_pseudo_gradient)
    assert not v and "wrong way" in v.message and "momentum" not in v.message, v.message


# --------------------------------------------------------------------------- the library's own, wrapped


def exchange_around_the_librarys(store, rnd, me, grad, members):  # ft_step's own, called on each replica
    from lesson_lib.milestones.resilience import ft_step

    return ft_step.exchange(store, rnd, me, grad, members)


def outer_around_the_reference(local, start, buf, lr, mu):
    return ch10_exercises.outer_step(local, start, buf, lr, mu)


@pytest.mark.parametrize("key, answer, name", [
    ("exchange", exchange_around_the_librarys, "ft_step.exchange"),
    ("outer", outer_around_the_reference, "ch10_exercises.outer_step"),
], ids=["exchange", "outer"])
def test_an_answer_calling_the_librarys_own_is_refused(key, answer, name, no_orphans):
    v = EX[key].submit(answer)
    assert not v and v.message == (f"your answer calls lesson_lib's own {name}, the thing this exercise asks "
                                   "you to write: write it yourself"), v.message
