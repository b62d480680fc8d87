"""Idle cores kept awake while a job runs (lesson_lib.runtime.awake): spinners that spin only during
jobs, at the lowest priority, in the kernel's own scheduling group, and that leave with it."""

import os
import subprocess
import sys
import time

import psutil
import pytest
from conftest import wait_no_workers

from lesson_lib import Cluster
from lesson_lib.runtime import awake

pytestmark = pytest.mark.ch0
needs_spinners = pytest.mark.skipif(awake.reason_off("gloo") is not None,
                                    reason=f"no spinners here: {awake.reason_off('gloo')}")


def _sleep(seconds):
    time.sleep(seconds)
    return os.getpid()


def _cpu(pids):
    return [psutil.Process(p).cpu_times().user + psutil.Process(p).cpu_times().system for p in pids]


@needs_spinners
def test_spinners_spin_during_jobs_only_at_idle_priority_in_the_kernels_group():
    """One per core; CPU time during a job and none between jobs; SCHED_IDLE, so a rank woken onto
    a spinner's core takes it at once; and in the kernel's session (caught: with a session of its
    own, the scheduler's autogroups gave the spinners half the cores against the ranks, and in
    chapter 5's B₀ loop our ring's all-reduce took 2.7–4.6 ms instead of 2.2 without spinners and
    0.4–0.5 with them)."""
    from lesson_lib.runtime.placement import cpu_count

    with Cluster(2, quiet=True) as c:
        c.run(_sleep, 0.05)
        pids = awake.pids()
        assert len(pids) == cpu_count()
        assert {os.sched_getscheduler(p) for p in pids} == {os.SCHED_IDLE}
        assert {os.getsid(p) for p in pids} == {os.getsid(0)}
        before = _cpu(pids)
        c.run(_sleep, 0.6)
        during = _cpu(pids)
        time.sleep(0.6)
        after = _cpu(pids)
    assert all(b - a > 0.2 for a, b in zip(before, during)), (before, during)
    assert all(b - a < 0.1 for a, b in zip(during, after)), (during, after)


def test_the_variable_turns_them_off_and_gpu_ranks_never_use_them(monkeypatch):
    monkeypatch.setenv("LESSON_LIB_KEEP_AWAKE", "0")
    assert awake.reason_off("gloo") == "LESSON_LIB_KEEP_AWAKE=0"
    monkeypatch.delenv("LESSON_LIB_KEEP_AWAKE")
    assert awake.reason_off("nccl") == "GPU ranks"
    assert awake.reason_off("gloo", oversubscribed=True).startswith("more rank threads than cores")
    awake.stop()
    with awake.off():
        with awake.during("gloo"):
            assert awake.pids() == []  # none started for a job inside off()


@pytest.mark.slow
@needs_spinners
def test_spinners_exit_when_the_kernel_is_killed():
    code = ("import os, time; from lesson_lib import Cluster; from lesson_lib.runtime import awake\n"
            "c = Cluster(2, quiet=True); c.run(os.getpid); print(*awake.pids(), flush=True)\n"
            "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(x) for x in proc.stdout.readline().split()]
        assert pids and all(psutil.pid_exists(p) for p in pids)
    finally:
        proc.kill()
        proc.wait()
    assert not wait_no_workers(pids, 5.0), "spinners outlived a SIGKILLed parent"


@needs_spinners
def test_off_keeps_them_asleep_for_the_jobs_inside_and_the_bench_takes_turns():
    """``bench awake`` compares its two columns only if ``off`` really stops the spinning."""
    from lesson_lib.bench_awake import awake_loop

    with Cluster(2, quiet=True) as c:
        c.run(_sleep, 0.05)
        pids = awake.pids()
        before = _cpu(pids)
        with awake.off():
            c.run(_sleep, 0.6)
        assert all(b - a < 0.1 for a, b in zip(before, _cpu(pids)))
    r = awake_loop(rounds=1, epochs=1)
    assert r["why_not"] is None and len(r["on"]) == len(r["off"]) == 1 and r["steps"] == 128
    assert all(x["step_s"] > x["comm_s"] > 0 for x in r["on"] + r["off"])


@needs_spinners
def test_ranks_that_outnumber_the_cores_run_without_them():
    """No core idles for long then, and the spinners slowed chapter 2's 4-rank measurement by a third."""
    from lesson_lib.runtime.placement import cpu_count

    awake.stop()
    with Cluster(cpu_count() + 1, quiet=True) as c:
        assert c.oversubscribed
        c.run(_sleep, 0.05)
    assert awake.pids() == []
