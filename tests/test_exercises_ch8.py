"""Chapter 8's exercises on real ranks: each accepts its reference answer and other right forms,
and rejects plausible wrong answers with a message that points at the mistake."""

import pytest
import torch
import torch.distributed as dist
from torch.distributed import all_reduce, all_to_all_single

from lesson_lib.chapters import ch08_exercises

pytestmark = pytest.mark.ch8
EX = ch08_exercises.exercises()


@pytest.mark.parametrize("key", list(EX))
def test_every_reference_is_accepted(key):
    assert EX[key].submit(EX[key].reference())


def test_the_templates_are_not_answered_yet():
    class MyG(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ...

        @staticmethod
        def backward(ctx, grad):
            ...

    def exchange(buf):
        ...

    for key, answer in (("g", MyG), ("dispatch", exchange)):
        v = EX[key].submit(answer)
        assert not v and v.message == "not answered yet"


# --------------------------------------------------------------------------- g


class GImported(torch.autograd.Function):  # a right answer: all_reduce imported by name, in place
    @staticmethod
    def forward(ctx, x):
        all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


def g_as_function(x):  # a right answer in another form: a plain function around a Function
    return ch08_exercises.ReduceFromRegion.apply(x)


class GBothWays(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = x.clone()
        dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class GNoReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad


class GAverages(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = x.clone()
        dist.all_reduce(out)
        return out / dist.get_world_size()

    @staticmethod
    def backward(ctx, grad):
        return grad


class GBackwardDividedBack(torch.autograd.Function):  # right numbers, a pointless all-reduce backward
    @staticmethod
    def forward(ctx, x):
        out = x.clone()
        dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad / dist.get_world_size()


def g_differentiable_all_reduce(x):  # torch's differentiable all_reduce also all-reduces backward
    import torch.distributed.nn.functional as dnn

    return dnn.all_reduce(x)


@pytest.mark.parametrize("answer", [GImported, g_as_function], ids=["imported-by-name", "function"])
def test_g_accepts_other_right_forms(answer):
    assert EX["g"].submit(answer)


@pytest.mark.parametrize("answer, says", [
    (GBothWays, "too large"),
    (g_differentiable_all_reduce, "too large"),
    (GNoReduce, "partial sum"),
    (GAverages, "not averages"),
    (GBackwardDividedBack, "backward is the identity"),
], ids=["all-reduce-backward", "torch-differentiable", "no-reduce", "averages", "backward-communicates"])
def test_g_rejects_wrong_answers_saying_why(answer, says):
    v = EX["g"].submit(answer)
    assert not v and says in v.message, v.message


# --------------------------------------------------------------------------- dispatch


def exchange_imported(buf):
    out = torch.empty_like(buf)
    all_to_all_single(out, buf)
    return out


def exchange_lists(buf):
    n = dist.get_world_size()
    outs = [torch.empty_like(c) for c in buf.chunk(n)]
    dist.all_to_all(outs, [c.contiguous() for c in buf.chunk(n)])
    return torch.cat(outs)


def exchange_point_to_point(buf):
    n, r = dist.get_world_size(), dist.get_rank()
    ins, outs = list(buf.chunk(n)), [torch.empty_like(c) for c in buf.chunk(n)]
    outs[r].copy_(ins[r])
    works = []
    for j in range(n):
        if j != r:
            works += [dist.isend(ins[j].contiguous(), j), dist.irecv(outs[j], j)]
    for w in works:
        w.wait()
    return torch.cat(outs)


def exchange_nothing(buf):
    return buf


def exchange_all_gather(buf):  # right tokens, every rank handed everything
    n, r = dist.get_world_size(), dist.get_rank()
    parts = [torch.empty_like(buf) for _ in range(n)]
    dist.all_gather(parts, buf)
    return torch.cat([p.chunk(n)[r] for p in parts])


def exchange_reversed(buf):
    out = torch.empty_like(buf)
    dist.all_to_all_single(out, buf)
    return torch.cat(list(reversed(out.chunk(dist.get_world_size()))))


def exchange_flattened(buf):
    out = torch.empty_like(buf)
    dist.all_to_all_single(out, buf)
    return out.reshape(-1)[: buf.numel() // 2]


@pytest.mark.parametrize("answer", [exchange_imported, exchange_lists, exchange_point_to_point],
                         ids=["imported-by-name", "list-all-to-all", "point-to-point"])
def test_dispatch_accepts_other_right_forms(answer):
    assert EX["dispatch"].submit(answer)


@pytest.mark.parametrize("answer, says", [
    (exchange_nothing, "no tokens left their rank"),
    (exchange_all_gather, "sends more"),
    (exchange_reversed, "came back wrong"),
    (exchange_flattened, "buffer's shape"),
], ids=["nothing", "all-gather", "reversed", "wrong-shape"])
def test_dispatch_rejects_wrong_answers_saying_why(answer, says):
    v = EX["dispatch"].submit(answer)
    assert not v and says in v.message, v.message
