"""Chapter 8's exercises on real ranks: each accepts its reference answer and other right forms,
and rejects plausible wrong answers with a message that points at the mistake."""

import pytest
import torch
import torch.distributed as dist
from torch.distributed import all_reduce, all_to_all_single

from lesson_lib.chapters import ch08_exercises, ch08_plan

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


def g_as_function(x):  # a right answer in another form: a plain function around (the learner's) Function
    return GImported.apply(x)


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


class GFunctional(torch.autograd.Function):  # a right answer: a functional collective, waited for
    @staticmethod
    def forward(ctx, x):
        import torch.distributed._functional_collectives as funcol

        return funcol.all_reduce(x, "sum", dist.group.WORLD).wait()

    @staticmethod
    def backward(ctx, grad):
        return grad


class GCourseRing(torch.autograd.Function):  # a right answer: chapter 2's ring all-reduce, in place
    @staticmethod
    def forward(ctx, x):
        from lesson_lib import comm

        out = x.clone()
        comm.ring_all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad


class GAsyncWaited(torch.autograd.Function):  # a right answer: async_op=True, waited for at once
    @staticmethod
    def forward(ctx, x):
        out = x.clone()
        dist.all_reduce(out, async_op=True).wait()
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad


class GExtraAllReduce(torch.autograd.Function):  # right numbers, and an all-reduce thrown away
    @staticmethod
    def forward(ctx, x):
        dist.all_reduce(x.clone())  # its result is never used: the bytes are sent for nothing
        out = x.clone()
        dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad


class GExtraAfter(torch.autograd.Function):  # right numbers; the sum all-reduced again, result dropped
    @staticmethod
    def forward(ctx, x):
        out = x.clone()
        dist.all_reduce(out)
        dist.all_reduce(out.clone())
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad


class GExtraBroadcast(torch.autograd.Function):  # right numbers, a pointless broadcast of the sum
    @staticmethod
    def forward(ctx, x):
        out = x.clone()
        dist.all_reduce(out)
        dist.broadcast(out, src=0)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad


class GGatherThenSum(torch.autograd.Function):  # right numbers; every partial sum handed to every rank
    @staticmethod
    def forward(ctx, x):
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return torch.stack(parts).sum(0)

    @staticmethod
    def backward(ctx, grad):
        return grad


class GChunked(torch.autograd.Function):  # right: the sum in two all-reduces of halves, same bytes
    @staticmethod
    def forward(ctx, x):
        out = x.clone()
        for half in out.chunk(2):
            dist.all_reduce(half)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad


class GAsyncFuture(torch.autograd.Function):  # a right answer: async_op=True, waited through its future
    @staticmethod
    def forward(ctx, x):
        out = x.clone()
        dist.all_reduce(out, async_op=True).get_future().wait()
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad


class GAsyncNeverWaited(torch.autograd.Function):  # the handle dropped: the sum may not have arrived
    @staticmethod
    def forward(ctx, x):
        out = x.clone()
        dist.all_reduce(out, async_op=True)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad


def test_g_started_asynchronously_and_never_waited_is_told_so():
    # once "rank 0 returned only its own partial sum": the all-reduce was made, its result not awaited
    v = EX["g"].submit(GAsyncNeverWaited)
    assert not v and ("the all-reduce was started with async_op=True but its work was never waited: call "
                      ".wait() before reading the result") in v.message, v.message
    v = EX["g"].submit(GAsyncFuture)
    assert v, v.message


@pytest.mark.parametrize("answer", [GImported, g_as_function, GFunctional, GCourseRing, GAsyncWaited,
                                    GChunked],
                         ids=["imported-by-name", "function", "functional", "course-ring", "async-waited",
                              "chunked-same-bytes"])
def test_g_accepts_other_right_forms(answer):
    v = EX["g"].submit(answer)
    assert v, v.message


@pytest.mark.parametrize("answer, says", [
    (GBothWays, "too large"),
    (g_differentiable_all_reduce, "too large"),
    (GNoReduce, "partial sum"),
    (GAverages, "not averages"),
    (GBackwardDividedBack, "backward is the identity"),
    (GExtraAllReduce, "an extra all-reduce"),
    (GExtraAfter, "an extra all-reduce"),
    (GExtraBroadcast, "broadcast"),
    (GGatherThenSum, "all-gather hands every rank"),
], ids=["all-reduce-backward", "torch-differentiable", "no-reduce", "averages", "backward-communicates",
        "extra-all-reduce", "extra-all-reduce-after", "extra-broadcast", "all-gather-then-sum"])
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


def exchange_flat(buf):  # the right tokens, as one flat vector
    out = torch.empty_like(buf)
    dist.all_to_all_single(out, buf)
    return out.flatten()


def test_dispatch_returning_a_flat_tensor_is_told_both_shapes():
    # once "rank 0's tokens came back wrong": the numbers were right, the shape was not
    v = EX["dispatch"].submit(exchange_flat)
    assert not v and "returned a tensor of shape (640,)" in v.message, v.message
    assert "expected (4, 10, 16), the buffer's shape" in v.message and "came back wrong" not in v.message


def exchange_async_never_waited(buf):
    out = torch.empty_like(buf)
    dist.all_to_all_single(out, buf, async_op=True)
    return out


def exchange_point_to_point_never_waited(buf):  # sends and receives posted, none waited for
    n, r = dist.get_world_size(), dist.get_rank()
    ins, outs = list(buf.chunk(n)), [torch.empty_like(c) for c in buf.chunk(n)]
    outs[r].copy_(ins[r])
    for j in range(n):
        if j != r:
            dist.isend(ins[j].contiguous(), j)
            dist.irecv(outs[j], j)
    return torch.cat(outs)


def exchange_async_wait_all(buf):  # a right answer: the handles' futures waited for together
    out = torch.empty_like(buf)
    torch.futures.wait_all([dist.all_to_all_single(out, buf, async_op=True).get_future()])
    return out


@pytest.mark.parametrize("answer, says", [
    (exchange_async_never_waited, "the all-to-all was started with async_op=True but its work was never "
                                  "waited: call .wait() before reading the result"),
    (exchange_point_to_point_never_waited, "was started by dist.isend but its work was never waited"),
], ids=["all-to-all", "isend"])
def test_dispatch_started_asynchronously_and_never_waited_is_told_so(answer, says):
    # once "rank 0's tokens came back wrong"; the unwaited sends also stalled the next check's ranks
    v = EX["dispatch"].submit(answer)
    assert not v and says in v.message, v.message
    v = EX["dispatch"].submit(exchange_async_wait_all)
    assert v, v.message


@pytest.mark.parametrize("answer", [exchange_imported, exchange_lists, exchange_point_to_point],
                         ids=["imported-by-name", "list-all-to-all", "point-to-point"])
def test_dispatch_accepts_other_right_forms(answer):
    assert EX["dispatch"].submit(answer)


def exchange_all_gather_as_all_to_all(buf):  # a reviewer's: every rank is sent the whole buffer
    n, r = dist.get_world_size(), dist.get_rank()
    big = buf.repeat(n, *[1] * (buf.dim() - 1))
    out = torch.empty_like(big)
    dist.all_to_all_single(out, big)
    return torch.cat([o.chunk(n)[r] for o in out.chunk(n)])


@pytest.mark.parametrize("answer, says", [
    (exchange_nothing, "no tokens left their rank"),
    (exchange_all_gather, "sends more"),
    (exchange_all_gather_as_all_to_all, "sends more"),
    (exchange_reversed, "came back wrong"),
    (exchange_flattened, "buffer's shape"),
], ids=["nothing", "all-gather", "all-gather-as-all-to-all", "reversed", "wrong-shape"])
def test_dispatch_rejects_wrong_answers_saying_why(answer, says):
    v = EX["dispatch"].submit(answer)
    assert not v and says in v.message, v.message


# --------------------------------------------------------------------------- merge (online softmax)


def test_the_new_templates_are_not_answered_yet():
    def merge(m_a, l_a, o_a, m_b, l_b, o_b):
        ...

    def block_plan():
        ...

    for key, answer in (("merge", merge), ("plan", block_plan)):
        v = EX[key].submit(answer)
        assert not v and v.message == "not answered yet"


def merge_lse(out_a, lse_a, out_b, lse_b):  # the log-sum-exp form
    lse = torch.logaddexp(lse_a, lse_b)
    return torch.exp(lse_a - lse) * out_a + torch.exp(lse_b - lse) * out_b, lse


def merge_list(m_a, l_a, o_a, m_b, l_b, o_b):  # a list, the maximum taken with torch.where
    m = torch.where(m_a > m_b, m_a, m_b)
    return [m, l_a * (m_a - m).exp() + l_b * (m_b - m).exp(), o_a * (m_a - m).exp() + o_b * (m_b - m).exp()]


def merge_average(out_a, lse_a, out_b, lse_b):
    return (out_a + out_b) / 2, torch.logaddexp(lse_a, lse_b)


def merge_average_state(m_a, l_a, o_a, m_b, l_b, o_b):
    return torch.maximum(m_a, m_b), torch.ones_like(l_a), (o_a / l_a + o_b / l_b) / 2


def merge_no_rescale(m_a, l_a, o_a, m_b, l_b, o_b):
    return torch.maximum(m_a, m_b), l_a + l_b, o_a + o_b


def merge_one_side(m_a, l_a, o_a, m_b, l_b, o_b):  # the running state rescaled, the new block not
    m = torch.maximum(m_a, m_b)
    a = torch.exp(m_a - m)
    return m, l_a * a + l_b, o_a * a + o_b


def merge_unnormalised(out_a, lse_a, out_b, lse_b):  # unnormalised sums added, never divided
    return torch.exp(lse_a) * out_a + torch.exp(lse_b) * out_b, torch.logaddexp(lse_a, lse_b)


def merge_sum_not_rescaled(m_a, l_a, o_a, m_b, l_b, o_b):
    m = torch.maximum(m_a, m_b)
    a, b = torch.exp(m_a - m), torch.exp(m_b - m)
    return m, l_a + l_b, o_a * a + o_b * b


def merge_unstable(m_a, l_a, o_a, m_b, l_b, o_b):  # right for small scores; exp(200) overflows
    ea, eb = torch.exp(m_a), torch.exp(m_b)
    return torch.zeros_like(m_a), l_a * ea + l_b * eb, o_a * ea + o_b * eb


def merge_unstable_lse(out_a, lse_a, out_b, lse_b):
    lse = torch.log(torch.exp(lse_a) + torch.exp(lse_b))
    return torch.exp(lse_a - lse) * out_a + torch.exp(lse_b - lse) * out_b, lse


def merge_lse_max(out_a, lse_a, out_b, lse_b):  # right output at 2 ranks, a wrong lse carried on
    lse = torch.logaddexp(lse_a, lse_b)
    return torch.exp(lse_a - lse) * out_a + torch.exp(lse_b - lse) * out_b, torch.maximum(lse_a, lse_b)


def merge_output_only(m_a, l_a, o_a, m_b, l_b, o_b):
    m = torch.maximum(m_a, m_b)
    return o_a * torch.exp(m_a - m) + o_b * torch.exp(m_b - m)


def merge_with_default(m_a, l_a, o_a, m_b, l_b, o_b, tiny=0.0):  # right, with an extra defaulted parameter
    m = torch.maximum(m_a, m_b)
    a, b = torch.exp(m_a - m), torch.exp(m_b - m)
    return m, l_a * a + l_b * b + tiny, o_a * a + o_b * b


def merge_star_args(*state):  # a right answer that unpacks its six arguments itself
    m_a, l_a, o_a, m_b, l_b, o_b = state
    m = torch.maximum(m_a, m_b)
    a, b = torch.exp(m_a - m), torch.exp(m_b - m)
    return m, l_a * a + l_b * b, o_a * a + o_b * b


def merge_lse_star_args(*parts, scale=1.0):  # the log-sum-exp form, through *args
    out_a, lse_a, out_b, lse_b = parts
    lse = torch.logaddexp(lse_a, lse_b)
    return scale * (torch.exp(lse_a - lse) * out_a + torch.exp(lse_b - lse) * out_b), lse


def merge_float64(m_a, l_a, o_a, m_b, l_b, o_b):  # right numbers, in float64
    m = torch.maximum(m_a, m_b).double()
    a, b = torch.exp(m_a - m), torch.exp(m_b - m)
    return m, l_a * a + l_b * b, o_a * a + o_b * b


def merge_smaller_max(m_a, l_a, o_a, m_b, l_b, o_b):  # right for close maxima; exp(gap) overflows
    m = torch.minimum(m_a, m_b)
    a, b = torch.exp(m_a - m), torch.exp(m_b - m)
    return m, l_a * a + l_b * b, o_a * a + o_b * b


def merge_onto_b(m_a, l_a, o_a, m_b, l_b, o_b):  # A rescaled to B's maximum, whichever is larger
    a = torch.exp(m_a - m_b)
    return m_b, l_a * a + l_b, o_a * a + o_b


@pytest.mark.parametrize("answer", [merge_lse, merge_list, merge_with_default, merge_star_args,
                                    merge_lse_star_args],
                         ids=["log-sum-exp", "list-where", "extra-default", "star-args", "lse-star-args"])
def test_merge_accepts_other_right_forms(answer):
    v = EX["merge"].submit(answer)
    assert v, v.message


def test_merge_in_float64_is_told_its_dtype():
    v = EX["merge"].submit(merge_float64)
    assert not v and "returned float64" in v.message and "the inputs are float32" in v.message, v.message


@pytest.mark.parametrize("answer", [merge_smaller_max, merge_onto_b], ids=["smaller-max", "onto-b"])
def test_merge_overflowing_by_the_gap_is_told_so_not_that_it_exponentiated_the_scores(answer):
    # once told "exp(209) overflows": these exponentiate the gap between the maxima, never a score
    v = EX["merge"].submit(answer)
    assert not v and "far apart" in v.message and "the smaller one subtracted" in v.message, v.message
    assert "overflows float32" in v.message and "exp(209)" not in v.message, v.message


def test_merge_exponentiating_the_maxima_is_told_so():
    v = EX["merge"].submit(merge_unstable)
    assert not v and "exponentiates the maxima themselves" in v.message, v.message
    v = EX["merge"].submit(merge_unstable_lse)
    assert not v and "exponentiates the log-sum-exps themselves" in v.message, v.message


@pytest.mark.parametrize("answer, says", [
    (merge_average, "plain average"),
    (merge_average_state, "plain average"),
    (merge_no_rescale, "forgot to rescale by exp(m_old − m_new)"),
    (merge_one_side, "right when both blocks have the same maximum"),
    (merge_unnormalised, "do not add up to 1"),
    (merge_sum_not_rescaled, "do not add up to 1"),
    (merge_unstable, "overflows float32"),
    (merge_unstable_lse, "overflows float32"),
    (merge_lse_max, "log-sum-exp"),
    (merge_output_only, "return the merged state (m, l, o)"),
    (lambda a, b: a, "takes 2 arguments"),
], ids=["average", "average-state", "no-rescale", "one-side", "unnormalised", "sum-not-rescaled", "unstable",
        "unstable-lse", "lse-max", "output-only", "two-arguments"])
def test_merge_rejects_wrong_answers_saying_why(answer, says):
    v = EX["merge"].submit(answer)
    assert not v and says in v.message, v.message


# --------------------------------------------------------------------------- plan (parallelize_module)


def plan_sequence_parallel():  # the block's plan written out: extending block_plan() calls the library's
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    gather = PrepareModuleInput(input_layouts=(Shard(0),), desired_input_layouts=(Replicate(),))
    return {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "mlp.fc1": ColwiseParallel(), "ln1": SequenceParallel(sequence_dim=0),
            "ln2": SequenceParallel(sequence_dim=0), "attn": gather, "mlp": gather,
            "attn.o": RowwiseParallel(output_layouts=Shard(0)),
            "mlp.fc2": RowwiseParallel(output_layouts=Shard(0))}


def _block_plan_written_out():  # the right plan, the test's own (calling block_plan() is refused as such)
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "attn.o": RowwiseParallel(), "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel()}


def plan_swapped():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {**_block_plan_written_out(), "attn.q": RowwiseParallel(), "attn.o": ColwiseParallel()}


def plan_o_column():
    from torch.distributed.tensor.parallel import ColwiseParallel

    return {**_block_plan_written_out(), "mlp.fc2": ColwiseParallel()}


def plan_mlp_missing():  # runs and trains right: the MLP stays whole on every rank
    plan = _block_plan_written_out()
    del plan["mlp.fc1"], plan["mlp.fc2"]
    return plan


def plan_partial_output():  # right placements; o's partial sums handed on without the all-reduce
    from torch.distributed.tensor import Partial
    from torch.distributed.tensor.parallel import RowwiseParallel

    return {**_block_plan_written_out(), "attn.o": RowwiseParallel(output_layouts=Partial())}


def plan_full_names():
    from torch.distributed.tensor.parallel import ColwiseParallel

    return {"blocks.0.attn.q": ColwiseParallel()}


@pytest.mark.parametrize("answer", [ch08_plan.block_plan(), plan_sequence_parallel],
                         ids=["dict", "sequence-parallel"])
def test_plan_accepts_other_right_forms(answer):
    assert EX["plan"].submit(answer)


@pytest.mark.parametrize("answer, says", [
    (plan_swapped, "attn.q is row-wise"),
    (plan_o_column, "mlp.fc2 is column-wise"),
    (plan_mlp_missing, "mlp.fc1 is not in your plan"),
    (plan_partial_output, "blocks.0.attn.o's output"),
    (plan_full_names, "not a module of a block"),
    ({"attn.q": "colwise"}, "ParallelStyle"),
], ids=["swapped", "row-as-column", "mlp-missing", "partial-output", "full-names", "strings"])
def test_plan_rejects_wrong_answers_saying_why(answer, says):
    v = EX["plan"].submit(answer)
    assert not v and says in v.message, v.message


# --------------------------------------------------------------------------- the library's own, wrapped


def g_around_the_librarys(x):  # the library's own g, called from the learner's function
    return ch08_exercises.ReduceFromRegion.apply(x)


class GCallingTheLibrarys(torch.autograd.Function):  # the learner's class, the library's g inside
    @staticmethod
    def forward(ctx, x):
        return ch08_exercises.ReduceFromRegion.apply(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


class GInheritingTheLibrarys(ch08_exercises.ReduceFromRegion):  # the library's methods, inherited
    pass


def exchange_around_the_librarys(buf):
    from lesson_lib.milestones.expert_parallel import moe

    return moe._all_to_all(buf, None)


@pytest.mark.parametrize("key, answer, name", [
    ("g", g_around_the_librarys, "ch08_exercises.ReduceFromRegion.forward"),
    ("g", GCallingTheLibrarys, "ch08_exercises.ReduceFromRegion.forward"),
    ("g", GInheritingTheLibrarys, "ch08_exercises.ReduceFromRegion.forward"),
    ("dispatch", exchange_around_the_librarys, "moe._all_to_all"),
], ids=["g-function", "g-class-calls", "g-class-inherits", "dispatch"])
def test_an_answer_calling_the_librarys_own_is_refused(key, answer, name):
    v = EX[key].submit(answer)
    assert not v and v.message == (f"your answer calls lesson_lib's own {name}, the thing this exercise asks "
                                   "you to write: write it yourself"), v.message
