"""Every exercise of chapters 0–2: the reference answer is accepted, plausible wrong answers are
rejected with a message that points at the mistake, and the notebook's template is "not answered
yet". The ones written as distributed code run on real ranks (warm clusters of this process)."""

import pytest
import torch
import torch.distributed as dist

from lesson_lib import close_all
from lesson_lib.chapters import ch00_exercises

pytestmark = [pytest.mark.numerics]


@pytest.fixture(scope="module", autouse=True)
def _close_clusters():
    yield
    close_all()


def _template(*args):
    ...


# --------------------------------------------------------------------------- chapter 0


@pytest.fixture(scope="module")
def ch0():
    return ch00_exercises.exercises()["average_gradients"]


@pytest.mark.ch0
def test_ch0_reference_is_accepted(ch0):
    v = ch0.check(ch0.reference())
    assert v.ok, v.message


def _forgot_to_divide(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)


def _first_layer_only(model):
    p = next(iter(model.parameters()))
    dist.all_reduce(p.grad)
    p.grad /= dist.get_world_size()


def _does_nothing(model):
    return model


def _divides_twice(model):
    n = dist.get_world_size()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= n * n


def _averages_the_weights(model):  # reduces the parameters, not their gradients
    with torch.no_grad():
        for p in model.parameters():
            dist.all_reduce(p)
            p /= dist.get_world_size()


@pytest.mark.ch0
@pytest.mark.parametrize("wrong, words", [
    (_forgot_to_divide, "whole batch"),
    (_divides_twice, "whole batch"),
    (_first_layer_only, "drifted apart"),
    (_does_nothing, "drifted apart"),
    (_averages_the_weights, "drifted apart"),
])
def test_ch0_wrong_answers_are_rejected(ch0, wrong, words):
    v = ch0.check(wrong)
    assert not v.ok and words in v.message, v.message
    assert "dist.all_reduce(p.grad)" not in v.message  # helps without giving the answer away


@pytest.mark.ch0
def test_ch0_a_deadlock_ends_with_the_timeout_message(ch0, monkeypatch):
    def everyone_receives(model):  # nobody sends: every rank waits
        for p in model.parameters():
            dist.recv(p.grad, src=(dist.get_rank() + 1) % dist.get_world_size())

    monkeypatch.setattr(ch00_exercises, "TIMEOUT_S", 3.0)
    v = ch0.check(everyone_receives)
    assert not v.ok and "did not finish within timeout_s=3 s" in v.message, v.message
    assert "recv" in v.message, v.message  # where the ranks were waiting


@pytest.mark.ch0
def test_ch0_an_error_in_the_answer_names_the_rank(ch0):
    def typo(model):
        for p in model.parameters():
            dist.all_reduce(p.gradient)

    v = ch0.check(typo)
    assert not v.ok and "rank" in v.message and "gradient" in v.message, v.message


@pytest.mark.ch0
def test_ch0_template_is_not_answered_yet(ch0, capsys):
    def average_gradients(model):
        ...  # your code here

    assert ch0.submit(average_gradients).message == "not answered yet"
    assert "not answered yet" in capsys.readouterr().out
