"""Gloo's I/O threads at the lowest priority (lesson_lib.runtime.iothread) on a rank that own_core pins:
also those of groups a job made, never for GPU ranks or with LESSON_LIB_IO_NICE=0 — read as the
kernel has it when a cluster starts, not as the fork server had it."""

import ctypes
import os
import sys
import threading

import pytest

from lesson_lib import Cluster
from lesson_lib.runtime import iothread
from lesson_lib.runtime.placement import own_core, own_core_reason_off

pytestmark = [pytest.mark.ch0,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux threads only")]


_nices = iothread.nices


def _nices_then_a_new_group() -> list[int]:
    import builtins

    import torch.distributed as dist

    seen = _nices()
    builtins._lesson_lib_test_group = dist.new_group([0, 1])  # Gloo starts another I/O thread for it
    return seen


@pytest.fixture
def named_thread():
    """A thread of this process whose kernel name is Gloo's I/O thread's, at the default priority."""
    ready, stop, tid = threading.Event(), threading.Event(), []

    def body():
        ctypes.CDLL(None).prctl(15, iothread.NAME.encode(), 0, 0, 0)  # PR_SET_NAME
        tid.append(threading.get_native_id())
        ready.set()
        stop.wait()

    t = threading.Thread(target=body)
    t.start()
    ready.wait(5)
    yield tid[0]
    stop.set()
    t.join()


def test_lower_sets_those_threads_to_nice_19_once_and_leaves_the_rest(monkeypatch, named_thread):
    main = threading.get_native_id()
    main_nice = os.getpriority(os.PRIO_PROCESS, main)
    assert iothread.threads() == [named_thread]
    monkeypatch.setenv("LESSON_LIB_IO_NICE", "0")  # first: a lowered priority cannot be raised again
    assert iothread.reason_off("gloo") == "LESSON_LIB_IO_NICE=0"
    assert iothread.lower("gloo") == [] and os.getpriority(os.PRIO_PROCESS, named_thread) == 0
    monkeypatch.delenv("LESSON_LIB_IO_NICE")
    assert iothread.lower("nccl") == [] and iothread.reason_off("nccl") == "GPU ranks"
    assert os.getpriority(os.PRIO_PROCESS, named_thread) == 0
    assert iothread.lower("gloo") == [named_thread]
    assert os.getpriority(os.PRIO_PROCESS, named_thread) == iothread.NICE == 19
    assert os.getpriority(os.PRIO_PROCESS, main) == main_nice  # only Gloo's thread
    assert iothread.lower("gloo") == []  # already there
    monkeypatch.setattr(sys, "platform", "darwin")
    assert iothread.reason_off("gloo") == "not Linux"


_OFF = own_core_reason_off(2, "gloo") or iothread.reason_off("gloo")
needs_own_core = pytest.mark.skipif(_OFF is not None, reason=f"nothing to lower here: {_OFF}")


def _nices_then_own_core() -> list[list[int]]:
    from lesson_lib.runtime import context

    ctx = context()
    before = _nices()
    with own_core(ctx.rank, ctx.world_size, ctx.backend):
        inside = _nices()
    return [before, inside, _nices()]


@needs_own_core
def test_own_core_lowers_its_ranks_io_threads_for_good_and_a_new_groups_too():
    # catches: every job of every world lowered (chapter 4's prefetch, a gather beside the compute,
    # then hid nothing), or chapter 5's pinned loop not lowered
    with Cluster(2, quiet=True) as c:
        assert c.run(_nices) == [[0], [0]]  # a world's own, at first: not lowered
        assert c.run(_nices_then_own_core) == [[[0], [19], [19]]] * 2  # and kept after the block
        c.run(_nices_then_a_new_group)
        assert c.run(_nices) == [[19, 0], [19, 0]]  # a new group's I/O thread starts at 0
        assert c.run(_nices_then_own_core) == [[[19, 0], [19, 19], [19, 19]]] * 2  # the next pinned job


@needs_own_core
def test_a_cluster_reads_the_switch_as_the_kernel_has_it_when_the_cluster_starts(monkeypatch):
    # catches: workers forked from a fork server that started before the learner set the variable
    # (they inherit the server's environment) ignoring it
    with Cluster(2, quiet=True) as c:
        assert c.run(_nices_then_own_core)[0][1] == [19]
    monkeypatch.setenv("LESSON_LIB_IO_NICE", "0")
    with Cluster(2, quiet=True) as c:
        assert c.run(_nices_then_own_core) == [[[0], [0], [0]]] * 2
        assert c.run(os.environ.get, "LESSON_LIB_IO_NICE") == ["0", "0"]
    monkeypatch.delenv("LESSON_LIB_IO_NICE")
    with Cluster(2, quiet=True) as c:
        assert c.run(_nices_then_own_core)[1][1] == [19]


@needs_own_core
def test_bench_io_compares_lowered_io_threads_with_ones_at_their_own_priority():
    """``bench io``'s two columns differ in that alone: its second cluster's I/O threads keep nice 0."""
    from lesson_lib.bench_awake import io_loop

    r = io_loop(rounds=1, epochs=1)
    assert r["why_not"] is None
    assert r["probe"] == {"on": [[19], [19]], "off": [[0], [0]]}
    assert len(r["on"]) == len(r["off"]) == 1 and r["steps"] == 128
    assert all(x["mean_s"] > 0 and x["step_s"] > x["comm_s"] > 0 for x in r["on"] + r["off"])
    assert os.environ.get("LESSON_LIB_IO_NICE") is None  # the kernel's own environment, as it was


def test_without_proc_there_is_nothing_to_lower(monkeypatch):
    # catches: a container without /proc failing every job of every rank (lower runs before each)
    def no_proc(path):
        raise FileNotFoundError(path)

    monkeypatch.setattr(os, "listdir", no_proc)
    assert iothread.threads() == [] and iothread.lower("gloo") == []
