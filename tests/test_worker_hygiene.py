"""Whatever a learner's function does to its worker, the next run works.

Each test plants one way a cell function can leave its worker unusable or changed, then checks
that the *next, unrelated* run sees a clean worker: restored in place where that is possible,
replaced (new PIDs, with a one-line note naming the cause) where it is not. Functions are defined
here with ``__module__ = "__main__"`` so they travel by value, as a notebook cell's do.
"""

import os
import subprocess
import sys
import tempfile
import threading
import time

import probes
import pytest
import torch
import torch.distributed as dist
from conftest import wait_no_workers

from lesson_lib import Cluster, WorkerError
from lesson_lib.runtime import folders

pytestmark = pytest.mark.ch0


def _cell(fn):
    fn.__module__ = "__main__"  # travels by value, like a function defined in a notebook cell
    return fn


def _state():
    return {"dtype": str(torch.get_default_dtype()), "threads": torch.get_num_threads(),
            "grad": torch.is_grad_enabled(), "device": str(torch.get_default_device()),
            "env": os.environ.get("LEARNER_VAR"), "cwd": os.getcwd(), "pid": os.getpid(),
            "world": dist.is_initialized() and dist.get_world_size()}


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(2, quiet=True, timeout_s=20)
    yield c
    c.close()


@pytest.mark.parametrize("change", [
    # bug caught: a worker keeps float64 as default dtype for the next learner's tensors
    lambda: torch.set_default_dtype(torch.float64),
    # bug caught: intra-op threads left at 7 oversubscribe the next run
    lambda: torch.set_num_threads(7),
    # bug caught: grad mode left off makes the next run's backward fail
    lambda: torch.set_grad_enabled(False),
    # bug caught: tensors of the next run created on the meta device
    lambda: torch.set_default_device("meta"),
    # bug caught: an environment variable leaks into the next job
    lambda: os.environ.__setitem__("LEARNER_VAR", "1"),
    # bug caught: relative paths of the next run resolve elsewhere
    lambda: os.chdir(tempfile.gettempdir()),
], ids=["dtype", "threads", "grad", "device", "env", "cwd"])
def test_settings_a_job_changed_are_restored_for_the_next_run_in_the_same_worker(cluster, change):
    before = cluster.run(_cell(_state))
    cluster.run(_cell(lambda: change()))
    after = cluster.run(_cell(_state))
    assert after == before  # same PIDs too: restored in place, not replaced


def test_an_emulated_link_a_job_set_is_gone_for_the_next_job_on_the_same_workers(cluster):
    # bug caught: comm.set_link called in a rank stayed in force for the next library run on those
    # warm workers (129 ms a step instead of 7.7 ms, and no word of it)
    from lesson_lib import comm

    pids = cluster.pids()
    assert cluster.run(_cell(lambda: (comm.set_link(0.5, 1e-3), comm.link())[1])) == [(0.5e9 / 8, 1e-3)] * 2
    assert cluster.run(_cell(lambda: comm.link())) == [None, None]  # the workers' module, by reference
    assert cluster.pids() == pids  # restored in place, not replaced


def test_a_destroyed_process_group_replaces_the_workers_and_the_next_run_works(capsys):
    with Cluster(2, quiet=True, timeout_s=20) as c:
        pids = c.pids()

        def leave():
            dist.destroy_process_group()
            return dist.is_initialized()

        assert c.run(_cell(leave)) == [False, False]  # the job itself returns normally
        out = capsys.readouterr().out
        assert "ranks 0, 1: its function destroyed the process group" in out, out
        assert "replaced for the next run" in out
        assert c.run(probes.library_all_reduce, 3) == [3.0, 3.0]  # an unrelated run works
        assert set(c.pids()).isdisjoint(pids)
        assert not wait_no_workers(pids, 20.0)


def test_a_thread_left_running_replaces_the_workers(capsys):
    with Cluster(2, quiet=True, timeout_s=20) as c:
        pids = c.pids()

        def start_thread():
            threading.Thread(target=time.sleep, args=(30,), name="learner-thread").start()

        c.run(_cell(start_thread))
        out = capsys.readouterr().out
        assert "left thread(s) running: learner-thread" in out, out
        assert c.run(probes.library_all_reduce, 1) == [3.0, 3.0]
        assert set(c.pids()).isdisjoint(pids)


def test_an_idle_thread_pool_left_behind_does_not_replace_the_workers(cluster):
    # the library's own communication thread (buckets.Overlap) is an idle ThreadPoolExecutor
    from concurrent.futures import ThreadPoolExecutor
    pids = cluster.pids()

    def pool():
        ThreadPoolExecutor(1).submit(int).result()

    cluster.run(_cell(pool))
    assert cluster.pids() == pids


def test_a_value_that_cannot_travel_back_names_the_rank_and_the_cause_within_seconds(cluster):
    def lock():
        return threading.Lock()

    t0 = time.monotonic()
    with pytest.raises(WorkerError) as info:
        cluster.run(_cell(lock))
    assert time.monotonic() - t0 < 10
    assert "cannot be sent back to the notebook" in str(info.value) and "lock" in str(info.value)
    assert cluster.run(probes.library_all_reduce, 1) == [3.0, 3.0]


def test_prints_from_ranks_are_marked_with_the_rank_and_arrive_before_the_result(cluster, capsys):
    def talk():
        print("hello from", dist.get_rank())
        print("partial line", end="")
        print("to stderr", file=sys.stderr)
        return dist.get_rank()

    assert cluster.run(_cell(talk)) == [0, 1]
    got = capsys.readouterr()  # printed by the parent inside run(), so before run() returned
    for r in (0, 1):
        assert f"[rank {r}] hello from {r}\n" in got.out, got.out
        assert f"[rank {r}] partial line" in got.out
        assert f"[rank {r}] to stderr\n" in got.err, got.err


def test_folders_of_processes_that_are_gone_are_swept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    gone = tmp_path / f"lesson_lib_{dead}_abc"
    alive = tmp_path / f"lesson_lib_{os.getppid()}_def"  # our parent still runs
    mine = tmp_path / f"lesson_lib_{os.getpid()}_ghi"
    other = tmp_path / "lesson_lib_notapid"
    for d in (gone, alive, mine, other):
        d.mkdir()
    assert folders.sweep(str(tmp_path)) == [str(gone)]
    assert not gone.exists() and alive.exists() and mine.exists() and other.exists()


def test_a_killed_kernel_leaves_no_rendezvous_folder():
    code = ("import sys, time; from lesson_lib import Cluster\n"
            "c = Cluster(2, quiet=True); print(c._tmp, flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        folder = proc.stdout.readline().strip()
        assert os.path.isdir(folder)
    finally:
        proc.kill()
        proc.wait()
    end = time.monotonic() + 5
    while os.path.exists(folder) and time.monotonic() < end:
        time.sleep(0.1)
    assert not os.path.exists(folder), "the rendezvous folder outlived a SIGKILLed parent"


@_cell
def _seed_and_draw(seed):
    import random

    torch.manual_seed(seed)
    random.seed(seed)
    return torch.rand(4), random.random()


@_cell
def _draw():
    import random

    return torch.initial_seed(), torch.rand(4), random.random()


def _fresh_process_draws(_):
    return torch.initial_seed(), torch.rand(4).tolist()


def test_each_job_draws_as_a_fresh_process_would_not_from_the_jobs_before_it(cluster):
    # bug caught: a torch.manual_seed in one job carried into the next, and every rank of a warm
    # cluster drew the same numbers (all forked from one fork server, which seeded torch once)
    seeded = cluster.run(_seed_and_draw, 123)
    after = cluster.run(_draw)
    torch.manual_seed(123)
    first, then = torch.rand(4), torch.rand(4)  # the seed's draws, and what would have followed
    assert all(torch.equal(t, first) for t, _ in seeded)
    for seed, t, r in after:
        assert seed != 123 and not torch.equal(t, first) and not torch.equal(t, then)
        assert r != seeded[0][1]  # Python's random too
    # torch seeds each fresh process's CPU generator non-deterministically: two spawned processes
    # (no code of ours) draw differently, and so do the ranks
    import multiprocessing as mp

    with mp.get_context("spawn").Pool(2) as pool:
        fresh = pool.map(_fresh_process_draws, range(2))
    assert fresh[0][0] != fresh[1][0] and fresh[0][1] != fresh[1][1], fresh
    assert after[0][0] != after[1][0] and not torch.equal(after[0][1], after[1][1]), after
    again = cluster.run(_draw)
    assert again[0][0] != after[0][0]  # each job afresh, not one stream carried on


def test_ranks_that_seed_alike_draw_alike(cluster):
    # what a tensor-parallel group with one seed does (the bug chapter 8 warns of), on purpose
    outs = cluster.run(_seed_and_draw, 7)
    assert torch.equal(outs[0][0], outs[1][0])
    assert torch.equal(outs[0][0], torch.rand(4, generator=torch.Generator().manual_seed(7)))
