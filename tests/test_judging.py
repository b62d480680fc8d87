"""The one judging mechanism every exercise uses: the answer normaliser, the log of what ran on
the ranks, and property-by-property verdicts."""

from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.distributed as dist

from lesson_lib import comm
from lesson_lib.exercises import (
    AnswerError,
    Exercise,
    Property,
    Verdict,
    assess,
    choice,
    close_to,
    compare,
    judge,
    mismatch,
    number,
    numbers_of,
    observe,
    pair,
    whole_number,
)
from lesson_lib.runtime import warm_cluster

THE_SAME_NUMBER = [1500000, 1.5e6, "1.5e6", " 1500000 ", "1_500_000", "1,500,000", np.float32(1.5e6),
                   np.int64(1500000), np.array(1.5e6), torch.tensor(1.5e6), torch.tensor([1500000]),
                   torch.tensor(1.5e6, dtype=torch.float64), Fraction(3000000, 2), Decimal("1.5e6"),
                   "3000000/2", " 3000000 / 2 "]


@pytest.mark.parametrize("answer", THE_SAME_NUMBER, ids=lambda a: f"{type(a).__name__}:{a!r}")
def test_every_form_of_a_number_reads_the_same(answer):
    assert number(answer) == 1.5e6
    assert whole_number(answer) == 1500000
    assert close_to(1.5e6)(answer)


@pytest.mark.parametrize("answer, says", [
    (True, "truth value"), ("fast", "does not read"), ("1,5", "point for decimals"), ([1, 2], "one value"),
    (torch.ones(2), "shape (2,)"), (float("nan"), "finite"), (float("inf"), "finite"), (None, "NoneType"),
    ({"a": 1}, "dict"),
])
def test_what_is_not_a_number_says_what_was_given(answer, says):
    with pytest.raises(AnswerError, match=None) as e:
        number(answer, "the bandwidth in Gbit/s")
    assert says in str(e.value) and "the bandwidth in Gbit/s" in str(e.value), str(e.value)


def test_a_fraction_typed_as_text_is_a_number_and_a_near_miss_is_shown_as_typed():
    # once refused: "3/11" for a bubble fraction; once told "you said 354624 bytes" for 354,624.4
    assert number("3/11") == 3 / 11 and number("-3 / 4") == -0.75
    with pytest.raises(AnswerError, match="division by zero"):
        number("1/0")
    v = close_to(354_624, rel=0)(354_624.4)
    assert not v and "354,624.4" in v.message, v.message


def test_whole_numbers_pairs_and_choices():
    assert whole_number("2") == whole_number(2.0) == whole_number(torch.tensor(2)) == 2
    with pytest.raises(AnswerError, match="whole"):
        whole_number(2.5, "a whole number of steps")
    assert numbers_of(("0.8", torch.tensor(12)), 2, "a pair") == [0.8, 12.0]
    assert numbers_of("0.8, 12", 2, "a pair") == [0.8, 12.0]  # a pair written as text reads too
    for bad in (0.8, "0.8", "0.8, 12, 3", (1, 2, 3)):
        with pytest.raises(AnswerError, match="2 values"):
            numbers_of(bad, 2, "a pair")
    assert all(choice(a, ("a", "b")) == "b" for a in ("b", "B", " (b) ", "b)", "b."))
    with pytest.raises(AnswerError, match="one letter of a, b"):
        choice("e", ("a", "b"))


def test_compare_and_mismatch_never_show_equal_looking_numbers():
    assert compare(4e6 // 3, 4e6 / 3)  # floor division: a millionth apart, right
    assert not compare(1.05, 1.0, rel=0.02) and compare(1.01, 1.0, rel=0.02)
    for a, b in ((1333333.0, 1333333.3), (0.1 + 0.2, 0.3), (1e-9, 1.0000001e-9), (2.0, 2.5)):
        x, y = pair(a, b)
        assert x != y and float(x.replace(",", "")) == pytest.approx(a)
        assert float(y.replace(",", "")) == pytest.approx(b)
        msg = mismatch(a, b, said="f(4) returned")
        assert msg.startswith("f(4) returned ") and f"{x};" in msg and msg.endswith(y)


def test_submit_turns_an_unreadable_answer_into_a_verdict(capsys):
    ex = Exercise(key="k", title="t", prompt="p", check=close_to(3.0), hint="h", solution="s")
    v = ex.submit("three")
    assert not v and "does not read as a number" in v.message
    assert "✗ not yet" in capsys.readouterr().out
    assert assess(ex.check, ...) is None and assess(ex.check, "3") and ex.submit(torch.tensor(3.0))


def test_judge_reports_the_first_property_that_fails_in_the_first_case_it_fails():
    seen = []

    def case(where, value):
        return where, lambda: seen.append(where) or value

    props = [Property("it is positive", lambda v: None if v > 0 else f"it is {v}"),
             Property("it is even", lambda v: None if v % 2 == 0 else f"{v} is odd")]
    v = judge([case("N = 2", 4), case("N = 3", 3), case("N = 4", -1)], props)
    assert not v and v.message == "N = 3: it is even — but 3 is odd" and seen == ["N = 2", "N = 3"]
    v = judge([case("N = 2", 4), case("N = 4", 8)], props, done="Well done.")
    assert v and v.message == "it is positive; it is even (N = 2, N = 4). Well done."
    failed = Verdict(False, "on 3 ranks the run did not finish")
    assert judge([("N = 3", lambda: failed)], props) is failed


def _observed_job():
    x, y = torch.ones(8), torch.ones(2)
    reduce, ring = dist.all_reduce, comm.ring_all_reduce  # taken before observe: not in the log
    methods = dict(vars(dist.ProcessGroup))  # the process group's own methods, to be put back
    with observe() as log:
        dist.all_reduce(x)
        comm.ring_all_reduce(x)  # one call: its point-to-point messages inside are not listed
        h = dist.all_reduce(y, async_op=True)
        log.mark("before wait")
        h.wait()
        log.mark("after wait")
        out = torch.empty(4)
        dist.reduce_scatter_single(out, x)
    reduce(y)
    dist.all_reduce(y)  # after the block: not in the log either
    data = log.as_data()
    marks = {m["label"]: m["at"] for m in data["marks"]}
    return {"calls": data["calls"],
            "in_flight_before": [c["api"] for c in log.in_flight(marks["before wait"])],
            "in_flight_after": [c["api"] for c in log.in_flight(marks["after wait"])],
            "restored": dist.all_reduce is reduce and comm.ring_all_reduce is ring
            and all(vars(dist.ProcessGroup)[k] is methods[k] for k in ("allreduce", "send", "recv"))}


def _every_call_style_job():
    """The same messages written every way a learner might: each must be seen and counted."""
    import torch.distributed._functional_collectives as funcol
    from torch.distributed import all_reduce  # bound before observe: the old checker missed it
    from torch.distributed.distributed_c10d import all_gather_into_tensor

    rank, other = dist.get_rank(), 1 - dist.get_rank()
    x, got = torch.ones(4), torch.empty(4)
    with observe() as log:
        all_reduce(x)
        dist.distributed_c10d.all_reduce(x)
        all_gather_into_tensor(torch.empty(8), x)
        ops = [dist.P2POp(dist.isend, x, other), dist.P2POp(dist.irecv, got, other)]
        for work in dist.batch_isend_irecv(ops if rank == 0 else ops[::-1]):
            work.wait()
        dist.send(x, other) if rank == 0 else dist.recv(got, other)
        funcol.wait_tensor(funcol.all_reduce(x, "sum", dist.group.WORLD))  # reaches Gloo from C++
        funcol.all_gather_tensor(x, 0, dist.group.WORLD).sum()
    calls = log.as_data()["calls"]
    assert all(c["done"] is not None for c in calls[-2:]), calls[-2:]  # waited for: wait_tensor, .sum()
    return [(c["api"], c["op"], c["bytes"], c["peer"], c["async"]) for c in calls]


def test_every_way_of_calling_torch_distributed_is_seen_and_counted():
    # catches: `from torch.distributed import all_reduce` unseen ("your code ran no communication"),
    # `P2POp(dist.isend, ...)` refused ("Invalid op") because the module's function was replaced, and
    # functional collectives, which pass no Python method of the process group, unseen
    zero, one = warm_cluster(2).run(_every_call_style_job, timeout_s=20)
    head = [("dist.all_reduce", "all_reduce", 16, None, False)] * 2 + \
        [("dist.all_gather_into_tensor", "all_gather", 48, None, False)]
    batch = "dist.batch_isend_irecv"
    functional = [("funcol.all_reduce", "all_reduce", 16, None, True),  # asynchronous by design
                  ("funcol.all_gather_into_tensor", "all_gather", 16, None, True)]
    assert zero == head + [(batch, "send", 16, 1, True), (batch, "recv", 16, 1, True),
                           ("dist.send", "send", 16, 1, False)] + functional
    assert one == head + [(batch, "recv", 16, 0, True), (batch, "send", 16, 0, True),
                          ("dist.recv", "recv", 16, 0, False)] + functional


@pytest.mark.slow
def test_observe_records_each_outermost_call_with_its_bytes_and_whether_it_was_waited_for():
    outs = warm_cluster(2).run(_observed_job, timeout_s=20)
    for o in outs:
        assert [(c["api"], c["op"], c["bytes"], c["async"]) for c in o["calls"]] == [
            ("dist.all_reduce", "all_reduce", 32, False), ("comm.ring_all_reduce", "all_reduce", 32, False),
            ("dist.all_reduce", "all_reduce", 8, True),
            ("dist.reduce_scatter_single", "reduce_scatter", 48, False)]
        assert all(c["done"] is not None and c["done"] >= c["start"] for c in o["calls"])
        assert o["in_flight_before"] == ["dist.all_reduce"] and o["in_flight_after"] == []
        assert o["restored"]


def _exchanges_job():
    rank, other = dist.get_rank(), 1 - dist.get_rank()
    x, y = torch.ones(8), torch.empty(8)
    with observe() as log:
        comm.exchange(x, other, y, other).wait()  # both ways
        if rank == 0:
            comm.exchange(x[:2], 1, None, None).wait()  # a push alone
        else:
            comm.exchange(None, None, y[:2], 0).wait()  # its receive alone
    return [(c["op"], c["peer"], c["bytes"]) for c in log.as_data()["calls"]]


@pytest.mark.slow
def test_an_exchange_is_a_send_and_a_receive_each_with_its_own_bytes_and_peer():
    # catches: an exchange's bytes split in two, or a receive invented for a push-only exchange
    zero, one = warm_cluster(2).run(_exchanges_job, timeout_s=20)
    assert zero == [("send", 1, 32), ("recv", 1, 32), ("send", 1, 8)], zero
    assert one == [("send", 0, 32), ("recv", 0, 32), ("recv", 0, 8)], one


def _local_function_exercises():
    """Every exercise whose answer is a function run in this process (a formula, an update, a quantizer)."""
    from lesson_lib.chapters import ch01, ch02_exercises, ch04, ch05_exercises, ch06_exercises
    return {"ch1 average": ch01.exercises(param_bytes=1000)["average"],
            "ch2 bytes": ch02_exercises.exercises(alpha=100e-6, beta=1 / 1.5e9)["bytes"],
            "ch4 stage2": ch04.exercises()["stage2"], "ch4 stage1": ch04.exercises()["stage1"],
            "ch5 lamb": ch05_exercises.exercises()["lamb"], "ch6 qsgd": ch06_exercises.exercises()["qsgd"]}


@pytest.mark.parametrize("name", list(_local_function_exercises()))
def test_every_local_function_exercise_is_judged_case_by_case(name):
    """The same mechanism for answers run here as for answers run on ranks: the reference holds every
    property; a function that raises, or returns nonsense, gets a verdict naming the case it failed."""
    ex = _local_function_exercises()[name]
    right = assess(ex.check, ex.reference())
    assert right.ok, right.message

    def raises(*args):
        raise KeyError("boom")

    v = assess(ex.check, raises)
    assert not v.ok and ": your function raised KeyError: 'boom'" in v.message, v.message
    assert not v.message.startswith("your function raised"), v.message  # the case comes first
    v = assess(ex.check, lambda *args: "not an answer")
    assert not v.ok and v.message, v.message
