"""A collective mismatch is named before Gloo can abort a rank (runtime/checked.py, runtime/ledger.py).

Functions are defined here with ``__module__ = "__main__"`` so they travel by value, as a notebook
cell's do, and their lines are the ones the messages must name.
"""

import inspect
import multiprocessing as mp
import time

import probes
import pytest
import torch
import torch.distributed as dist

from lesson_lib.chapters import ch00_exercises
from lesson_lib.milestones import data_parallel
from lesson_lib.runtime import Cluster, WorkerError, WorkerMismatch, ledger, warm_cluster

pytestmark = pytest.mark.ch0


_cell = probes.as_cell


def _line(fn, text: str) -> int:
    """The file line of ``fn`` whose source contains ``text``."""
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


@_cell
def average_on_rank_0_only(model):  # chapter 0's most natural first mistake
    if dist.get_rank() == 0:
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()


@_cell
def average_gradients(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


@_cell
def uneven_splits():
    splits = [1, 1] if dist.get_rank() == 0 else [2, 2]  # each rank its own idea of the splits
    out = torch.zeros(sum(splits))
    dist.all_to_all_single(out, torch.ones(sum(splits)), splits, splits)
    return out


@_cell
def agreeing_uneven_splits():
    rank = dist.get_rank()
    send = [1, 2] if rank == 0 else [3, 4]  # rank 0 sends 1 to itself and 2 to rank 1 ...
    recv = [1, 3] if rank == 0 else [2, 4]  # ... rank 1 receives 2 from rank 0: they agree
    out = torch.zeros(sum(recv))
    dist.all_to_all_single(out, torch.arange(sum(send), dtype=torch.float32) + 10 * rank, recv, send)
    return out


@_cell
def other_dtype():
    t = torch.ones(4, dtype=torch.float64 if dist.get_rank() == 1 else torch.float32)
    dist.all_reduce(t)


@_cell
def two_tags_out_of_order():  # legitimate: tags keep two streams between the same ranks apart
    if dist.get_rank() == 0:
        works = [dist.isend(torch.ones(3), 1, tag=1), dist.isend(torch.ones(5), 1, tag=2)]
    else:
        a, b = torch.zeros(5), torch.zeros(3)
        works = [dist.irecv(a, 0, tag=2), dist.irecv(b, 0, tag=1)]
    for w in works:
        w.wait()
    return dist.get_rank()


@_cell
def max_on_one_rank():  # three ranks sum, the last takes the maximum: Gloo returns a silent wrong result
    t, last = torch.full((4,), float(dist.get_rank() + 1)), dist.get_rank() == dist.get_world_size() - 1
    dist.all_reduce(t, op=dist.ReduceOp.MAX if last else dist.ReduceOp.SUM)
    return t


@_cell
def chunks_cut_differently():  # 6 elements on each rank, cut [2, 4] on rank 0 and [4, 2] on rank 1
    sizes = [2, 4] if dist.get_rank() == 0 else [4, 2]
    out = torch.zeros(sizes[dist.get_rank()])
    dist.reduce_scatter(out, [torch.ones(n) for n in sizes])
    return out


def _train(average):
    return ch00_exercises.train_with(average, ch00_exercises.TASK)


def test_chapter_0s_gradient_all_reduce_on_rank_0_only_names_both_ranks_calls_and_lines():
    # bug caught: "rank 1: worker process was killed (signal SIGABRT)" in 0.6 s, no cause
    cluster = warm_cluster(2)
    t0 = time.monotonic()
    with pytest.raises(WorkerMismatch) as info:
        cluster.run(_train, average_on_rank_0_only, timeout_s=30)
    assert time.monotonic() - t0 < 10
    head = str(info.value).split("--- traceback", 1)[0]
    assert not info.value.waits and "SIGABRT" not in head, head
    assert "collective mismatch on the default group" in head and "1st calls" in head, head
    cfg = data_parallel.Config(world_size=2, optimizer="sgd", **ch00_exercises.TASK)
    first = cfg.d_in * cfg.hidden  # the first layer's weight
    assert f"rank 0 passes {first:,} elements, rank 1 1 element" in head, head
    assert f"rank 0: all_reduce of {first:,} elements (float32)" in head, head
    assert "rank 1: all_reduce of 1 element (float32)" in head, head  # the loop's loss all-reduce
    line = _line(average_on_rank_0_only, "dist.all_reduce(p.grad)")
    assert f"line {line}, in average_on_rank_0_only: dist.all_reduce(p.grad)" in head, head
    assert "ch00_exercises.py" in head and "in _train" in head, head  # where rank 1's call came from
    assert "some ranks only" in head, head
    # the next run on the same warm cluster works, and agrees across ranks
    outs = cluster.run(_train, average_gradients, timeout_s=30)
    assert outs[0]["losses"] == outs[1]["losses"]


def test_chapter_0s_checker_gives_the_mismatch_as_its_verdict():
    v = ch00_exercises.check_average_gradients(average_on_rank_0_only)
    assert not v.ok and "mismatch on the default group" in v.message, v.message
    assert "rank 1: all_reduce of 1 element" in v.message, v.message
    assert ch00_exercises.check_average_gradients(average_gradients).ok


def test_all_to_all_single_with_splits_that_differ_across_ranks_is_named_pair_by_pair():
    cluster = warm_cluster(2)
    with pytest.raises(WorkerMismatch) as info:
        cluster.run(uneven_splits, timeout_s=30)
    head = str(info.value).split("--- traceback", 1)[0]
    assert "rank 0 sends rank 1 1 element, where rank 1 expects 2 elements from it" in head, head
    assert "rank 0: all_to_all sending [1, 1] and receiving [1, 1] elements" in head, head
    assert "rank 1: all_to_all sending [2, 2] and receiving [2, 2] elements" in head, head
    line = _line(uneven_splits, "dist.all_to_all_single")
    assert f"line {line}, in uneven_splits: dist.all_to_all_single(" in head, head
    # splits that differ across ranks but agree pair by pair are fine, on the same cluster
    outs = cluster.run(agreeing_uneven_splits, timeout_s=30)
    assert outs[0].tolist() == [0.0, 10.0, 11.0, 12.0]
    assert outs[1].tolist() == [1.0, 2.0, 13.0, 14.0, 15.0, 16.0]


def test_a_collective_on_some_ranks_only_is_named_as_the_other_returns_not_at_the_timeout():
    cluster = warm_cluster(2)
    t0 = time.monotonic()
    with pytest.raises(WorkerMismatch) as info:
        cluster.run(probes.barrier_on_rank_0, timeout_s=30)
    assert time.monotonic() - t0 < 10  # not the collective timeout (30 s)
    head = str(info.value).split("--- traceback", 1)[0]
    assert info.value.waits and "unmatched call on the default group" in head, head
    assert "rank 1 returned from the function after 0 calls" in head, head
    assert "rank 0: barrier — " in head, head
    assert f"line {_line(probes.barrier_on_rank_0, 'dist.barrier()')}" in head, head
    assert cluster.run(two_tags_out_of_order, timeout_s=30) == [0, 1]  # and no false alarm on tags


def test_another_dtype_is_named():
    with pytest.raises(WorkerMismatch) as info:
        warm_cluster(2).run(other_dtype, timeout_s=30)
    head = str(info.value).split("--- traceback", 1)[0]
    assert "rank 0's tensor is float32, rank 1's float64" in head, head


@_cell
def to_a_rank_that_does_not_exist(kind, peer):
    if dist.get_rank() == 1:
        getattr(dist, kind)(torch.ones(3), peer)


@pytest.mark.parametrize("kind, peer, words", [("send", 2, "dist.send(..., dst=2): there is no rank 2"),
                                               ("recv", -1, "dist.recv(..., src=-1): there is no rank -1")])
def test_a_send_or_recv_to_a_rank_that_does_not_exist_is_refused_not_a_crash(kind, peer, words):
    # bug caught: Gloo killed the sending rank with SIGSEGV and no word of why
    with pytest.raises(WorkerError) as info:
        warm_cluster(2).run(to_a_rank_that_does_not_exist, kind, peer, timeout_s=30)
    assert info.value.rank == 1 and words in str(info.value), str(info.value)


def test_another_reduction_on_one_rank_is_named():
    # bug caught: SUM on three ranks and MAX on one returned a wrong result with no word
    with pytest.raises(WorkerMismatch) as info:
        warm_cluster(4).run(max_on_one_rank, timeout_s=30)
    head = str(info.value).split("--- traceback", 1)[0]
    assert "reduces with SUM, rank 3 with MAX" in head, head
    assert "all_reduce of 4 elements with MAX (float32)" in head, head
    line = _line(max_on_one_rank, "dist.all_reduce(t, op=")
    assert f"line {line}, in max_on_one_rank" in head, head


def test_the_same_total_cut_into_other_chunks_is_named_by_its_chunks():
    # bug caught: "rank 0 passes 6 elements, rank 1 6 elements": the totals agree, the parts do not
    with pytest.raises(WorkerMismatch) as info:
        warm_cluster(2).run(chunks_cut_differently, timeout_s=30)
    head = str(info.value).split("--- traceback", 1)[0]
    assert "rank 0 passes 6 elements in chunks [2, 4], rank 1 the same total in chunks [4, 2]" in head, head
    assert "rank 0: reduce_scatter of 6 elements in chunks [2, 4]" in head, head


def test_where_gloo_aborts_anyway_the_post_mortem_says_what_each_rank_called(monkeypatch):
    # with the check only recording (as if both ranks had entered the call at once), Gloo aborts a
    # rank: the parent reads what each rank recorded
    monkeypatch.setenv(ledger.ENV, "record")
    with Cluster(2, quiet=True) as c:
        with pytest.raises(WorkerError) as info:
            c.run(_train, average_on_rank_0_only, timeout_s=30)
        said = str(info.value).split("--- traceback", 1)[0]
        assert "SIGABRT" in said and "what each rank called last" in said, said
        assert "rank 0's last call: all_reduce of" in said and "in average_on_rank_0_only" in said, said
        assert "rank 1's last call: all_reduce of 1 element" in said, said
        assert "ranks 0 and 1 disagree on their 1st call" in said, said
        assert c.run(dist.get_rank) == [0, 1]


def test_the_check_can_be_turned_off(monkeypatch):
    monkeypatch.setenv(ledger.ENV, "0")
    with Cluster(2, quiet=True) as c:
        assert c._ledger is None
        assert c.run(agreeing_uneven_splits)[1].tolist() == [1.0, 2.0, 13.0, 14.0, 15.0, 16.0]


def test_disagreement_of_calls_worked_by_hand():
    book = ledger.Ledger(3, mp.get_context("spawn"))
    fields = dict(op="all_reduce", dtype=torch.float32, numel=4, root=-1, peer=-1, grank=0, redop="SUM",
                  sends=(), receives=(), where="", seq=1, job=1, key=7)

    def call(rank, **kw):
        return ledger.Call(rank=rank, **{**fields, "grank": rank, **kw})

    assert ledger.disagreement(call(0), call(1)) is None
    assert ledger.disagreement(call(0), call(2, op="broadcast")) == (
        "rank 0 calls all_reduce, rank 2 calls broadcast")
    assert ledger.disagreement(call(0, op="broadcast", root=0), call(1, op="broadcast", root=1)) == (
        "rank 0 names rank 0 as the root, rank 1 rank 1")
    assert ledger.disagreement(call(0, op="send", numel=3), call(1, op="recv", numel=4)) == (
        "rank 0 sends 3 elements, rank 1 expects 4 elements")
    assert ledger.disagreement(call(0, numel=-1), call(1)) is None  # unknown: never a mismatch
    assert ledger.disagreement(call(0), call(1, redop="MAX")) == "rank 0 reduces with SUM, rank 1 with MAX"
    assert ledger.disagreement(call(0, redop=None), call(1, redop="MAX")) is None  # unknown
    rs = dict(op="reduce_scatter", numel=6)
    assert ledger.disagreement(call(0, sends=(2, 4), **rs), call(1, sends=(4, 2), **rs)) == (
        "rank 0 passes 6 elements in chunks [2, 4], rank 1 the same total in chunks [4, 2]")
    assert ledger.disagreement(call(0, sends=(3, 3), **rs), call(1, sends=(3, 3), **rs)) is None
    a2a = dict(op="all_to_all")
    ok = [call(0, sends=(1, 2, 3), receives=(1, 5, 9), **a2a),
          call(1, sends=(5, 5, 6), receives=(2, 5, 8), **a2a)]
    assert ledger.disagreement(*ok) is None
    bad = call(1, sends=(4, 5, 6), receives=(2, 5, 8), **a2a)  # sends rank 0 four, rank 0 expects five
    assert ledger.disagreement(ok[0], bad) == (
        "rank 1 sends rank 0 4 elements, where rank 0 expects 5 elements from it")
    assert book.postmortem() == ""  # nothing posted yet
