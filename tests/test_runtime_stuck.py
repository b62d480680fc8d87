"""A job that goes quiet or waits for a rank that never comes says so, and a rank cannot start a cluster.

Functions are defined here with ``__module__ = "__main__"`` so they travel by value, as a notebook
cell's do, and their lines are the ones the messages must name.
"""

import os
import time

import probes
import pytest
import torch.distributed as dist

from lesson_lib import Cluster, WorkerError, WorkerTimeout
from lesson_lib.runtime import ledger, silence

pytestmark = pytest.mark.ch0


_cell = probes.as_cell


@_cell
def quiet_loop(seconds, until=None):
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # loops without a word: no collective, no print, no event
        if until is not None and os.path.exists(until):
            break
    return dist.get_rank()


def progressing_quietly(seconds):  # a long computation that emits nothing, but moves: phases of work
    def phase_a():
        time.sleep(0.011)

    def phase_b():
        time.sleep(0.013)

    def phase_c():
        time.sleep(0.017)

    def phase_d():
        time.sleep(0.007)

    def phase_e():
        time.sleep(0.005)

    def phase_f():
        time.sleep(0.019)

    phases = (phase_a, phase_b, phase_c, phase_d, phase_e, phase_f)
    end, i = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        phases[i % len(phases)]()
        i += 1
    return dist.get_rank()


@_cell
def nested_cluster():
    with Cluster(1, quiet=True) as c:
        return c.run(int)


def test_a_silent_job_gets_one_line_naming_the_busy_ranks_where_they_are_and_how_to_stop(
        clusters, monkeypatch, capsys, tmp_path):
    # bug caught: a function looping without communicating ran 60 s with nothing in the cell
    # event-driven, not a race against the clock (a 1.6 s loop lost it at load 32): the ranks loop
    # until the notice has been printed (the parent touches a file then), or 120 s at most
    monkeypatch.setattr(silence, "SILENCE_S", 0.4)
    said = tmp_path / "said"
    tick = silence.Silence.tick

    def tick_then_mark(self, pending):
        tick(self, pending)
        if self.said:
            said.touch()

    monkeypatch.setattr(silence.Silence, "tick", tick_then_mark)
    assert clusters(2).run(quiet_loop, 120.0, str(said)) == [0, 1]
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "has sent nothing" in line]
    assert len(lines) == 1, out  # once per job, not every half second
    line = lines[0]
    assert "the run of quiet_loop" in line and "ranks 0, 1 still busy" in line, line
    assert "rank 0: running test_runtime_stuck.py, line" in line, line  # its own line, not os.path's
    assert "while time.monotonic() < end:" in line or "os.path.exists(until):" in line, line
    assert "interrupt the kernel" in line and "timeout_s=" in line, line
    assert clusters(2).run(quiet_loop, 0.0) == [0, 1]  # a quick job: no word
    assert "has sent nothing" not in capsys.readouterr().out


def test_a_quiet_job_that_is_moving_gets_no_notice(clusters, monkeypatch, capsys):
    # bug caught: "has sent nothing for 20 s ... interrupt the kernel" printed in chapter 2's Run All on
    # a cell that was computing and then finished: its stacks changed between samples
    # six samples, not three: three phases sampled 3 times could land on the same phase on both ranks
    # by chance (about 1 run in 50 here); a job that really stands still is still named after 0.75 s
    monkeypatch.setattr(silence, "SILENCE_S", 0.5)
    monkeypatch.setattr(silence, "SAMPLES", 6)
    assert clusters(2).run(progressing_quietly, 1.5) == [0, 1]
    assert "has sent nothing" not in capsys.readouterr().out


@pytest.mark.slow
def test_a_barrier_called_on_rank_0_only_names_the_rank_that_never_arrived(no_orphans, monkeypatch):
    # bug caught: Gloo's raw "Timed out waiting 30000ms for recv", nothing about rank 1. With the
    # collective check on, rank 1 says so as it returns (test_collective_mismatch.py); off, the timeout
    monkeypatch.setenv(ledger.ENV, "0")
    with Cluster(2, quiet=True, timeout_s=2) as c:
        t0 = time.monotonic()
        with pytest.raises(WorkerError) as info:
            c.run(probes.barrier_on_rank_0)
        assert time.monotonic() - t0 < 2 + 6
        head = str(info.value).split("--- traceback", 1)[0]
        assert info.value.rank == 0 and "Timed out waiting" in head, head
        assert "rank 1 never arrived: it had returned from the function without making the matching " \
               "call" in head, head


@pytest.mark.slow
def test_a_collective_timeout_names_where_the_rank_that_never_arrived_was_busy(no_orphans, monkeypatch):
    # the silence notice asks the ranks first (0.5 s), then the failure asks again, after rank 0 has
    # exited: caught, a question that waited for a dead rank's answer forever (multiprocessing.Event)
    monkeypatch.setattr(silence, "SILENCE_S", 0.5)
    with Cluster(2, quiet=True, timeout_s=2) as c:
        t0 = time.monotonic()
        with pytest.raises(WorkerError) as info:
            c.run(probes.stall_on, 1)
        assert time.monotonic() - t0 < 2 + 6
        head = str(info.value).split("--- traceback", 1)[0]
        assert info.value.rank == 0, head
        assert "rank 1 never arrived: it was running probes.py, line" in head, head
        assert "time.sleep(3600)" in head, head


@pytest.mark.slow
def test_a_cluster_started_inside_a_rank_is_a_clear_error(no_orphans):
    # bug caught: "AssertionError: daemonic processes are not allowed to have children"
    with Cluster(1, quiet=True, timeout_s=20) as c:
        with pytest.raises(WorkerError) as info:
            c.run(nested_cluster)
        text = str(info.value)
        assert "a Cluster cannot be started from inside a rank" in text and "rank 0" in text, text
        assert "daemonic" not in text
        assert c.run(_cell(lambda: 5)) == [5]  # the next run works


class _SlowToLoad:
    """An argument that takes ``seconds`` to unpickle on each rank, as a function from a module with
    heavy imports does (a test file importing plotly took 15 s on 4 ranks of a busy 2-core machine)."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __reduce__(self):
        return time.sleep, (self.seconds,)  # unpickled: sleeps, then the rank receives None


@_cell
def rank_of(_):
    return dist.get_rank()


@pytest.mark.slow
def test_timeout_counts_from_the_function_not_from_its_loading():
    with Cluster(2) as c:
        assert c.run(rank_of, _SlowToLoad(2.0), timeout_s=1) == [0, 1]


@pytest.mark.slow
def test_a_job_whose_loading_outlasts_the_grace_is_named(monkeypatch):
    from lesson_lib.runtime import cluster

    monkeypatch.setattr(cluster, "LOAD_S", 0.5)
    with Cluster(2) as c, pytest.raises(WorkerTimeout, match=r"ranks \[0, 1\] were still loading"):
        c.run(rank_of, _SlowToLoad(10.0), timeout_s=0.5)


@_cell
def new_group_on_rank_0_only():
    if dist.get_rank() == 0:
        dist.new_group([0, 1])  # rank 1 never makes the matching call
    return dist.get_rank()


@pytest.mark.slow
def test_new_group_on_some_ranks_only_ends_within_the_cluster_timeout():
    """torch's new_group waits 30 min by default, not the process group's timeout; a worker's
    groups made later wait as long as its first (issue 59 item 7: it hung for 673 s)."""
    start = time.monotonic()
    with Cluster(2, timeout_s=3) as c, pytest.raises(WorkerError) as e:
        c.run(new_group_on_rank_0_only, timeout_s=15)  # bounded even where the fix fails
    assert not isinstance(e.value, WorkerTimeout)
    assert time.monotonic() - start < 3 + 20  # the timeout, and start-up on a busy machine
    assert e.value.rank == 0 and "dist.new_group([0, 1])" in str(e.value)
    assert "rank 1 never arrived" in str(e.value)


def test_a_cell_function_passed_to_a_library_job_keeps_its_lines_in_the_traceback():
    # bug caught: a checker runs the learner's function as an argument of an importable job; the cells'
    # lines travelled only with a cell's own job, so the rank's traceback could not quote the line
    import linecache

    from lesson_lib.chapters.ch02_exercises import run_reduce_scatter

    src = ("def my_reduce_scatter(chunks):\n"
           "    raise ValueError('my bug in the ring')\n")
    name = "/nonexistent/cell_43.py"
    linecache.cache[name] = (len(src), None, src.splitlines(True), name)
    ns = {"__name__": "__main__"}
    exec(compile(src, name, "exec"), ns)
    try:
        with Cluster(2) as c, pytest.raises(WorkerError) as e:
            c.run(run_reduce_scatter, ns["my_reduce_scatter"], 8, 0, timeout_s=60)
    finally:
        linecache.cache.pop(name, None)
    assert "raise ValueError('my bug in the ring')" in str(e.value), str(e.value)


def test_where_a_rank_is_names_its_own_line_not_pythons_helpers_below_it():
    # caught: a loop calling os.path.exists was reported as "running <frozen genericpath>, line 19"
    import json

    from lesson_lib.runtime.diagnosis import TORCH_DIR, where

    mine = ("/home/me/train.py", 12, "step", "if os.path.exists(flag):")
    frozen = ("<frozen genericpath>", 19, "exists", "")
    on_disk = (json.__file__, 231, "dumps", "return _default_encoder.encode(obj)")
    assert where([mine, frozen]) == "running train.py, line 12: if os.path.exists(flag):"
    assert where([mine, on_disk]) == "running train.py, line 12: if os.path.exists(flag):"
    recv = (TORCH_DIR + "/distributed/distributed_c10d.py", 2800, "recv", "work.wait()")
    waiting = "waiting in torch.distributed recv(), called from train.py, line 12"
    assert where([mine, recv]).startswith(waiting)
