"""Chapter 10's fault tolerance off the beaten path (issue 58). test_resilience.py always kills
replica 1 in the middle of a run; here replica 0 dies (the one every returner would otherwise heal
from, so the heal must come from replica 1), and a replica dies in the first and in the last step or
round. §2's exchange is run in one process on a store written by hand, with its average worked out;
the replay the exchange checker judges by is held to SGD written out; and DiLoCo's replicas equal two
replicas written out in one process (the outer Nesterov step by hand, ``_diloco_by_hand``)."""

import io
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from test_resilience import _diloco_by_hand, _replay, _without_it_until_healed

from lesson_lib.milestones.resilience import ft_diloco, ft_step
from lesson_lib.milestones.resilience import task as T
from lesson_lib.runtime import replicas

pytestmark = pytest.mark.ch10


def _put(store, key, t):
    buf = io.BytesIO()
    torch.save(t, buf)
    store.set(key, buf.getvalue())


@pytest.fixture
def store(tmp_path):
    s = dist.FileStore(str(tmp_path / "store"), -1)
    s.set_timeout(timedelta(seconds=5))
    return s


def test_the_exchange_averages_every_members_gradient_worked_by_hand(store):
    # round 7, members 0, 1, 2: 1 and 2 have sent; replica 0 sends (1, 1, 1) and gets the mean of three
    _put(store, "grad/7/1", torch.tensor([3.0, 5.0, -1.0]))
    _put(store, "grad/7/2", torch.tensor([2.0, 0.0, 3.0]))
    avg = ft_step.exchange(store, 7, 0, torch.tensor([1.0, 1.0, 1.0]), [0, 1, 2])
    assert avg.tolist() == [2.0, 2.0, 1.0]  # (1 + 3 + 2)/3, (1 + 5 + 0)/3, (1 − 1 + 3)/3
    # round 8: replica 2 is flagged dead before it sent: no average, the step is discarded
    _put(store, "grad/8/1", torch.tensor([3.0, 5.0, -1.0]))
    store.set("dead/8", "1")
    assert ft_step.exchange(store, 8, 0, torch.tensor([1.0, 1.0, 1.0]), [0, 1, 2]) is None
    # round 9: flagged dead, but every member's gradient is already there: whoever sees them all commits
    _put(store, "grad/9/1", torch.tensor([4.0, -2.0, 0.0]))
    store.set("dead/9", "1")
    assert ft_step.exchange(store, 9, 0, torch.tensor([2.0, 2.0, 2.0]), [0, 1]).tolist() == [3.0, 0.0, 1.0]


def test_the_replay_the_exchange_checker_judges_by_is_sgd_written_out():
    # the exchange checker holds a survivor's weights to ft_step.replay of its log: a step with both
    # members, one discarded, one the survivor took alone (its own gradient, not half of it), both again
    task = T.Task(steps=4, hidden=16)
    log = [{"step": 0, "members": [0, 1]}, {"discarded": 1, "members": [0, 1]}, {"step": 1, "members": [0]},
           {"step": 2, "members": [0, 1]}, {"step": 3, "members": [0, 1, 2]}]
    torch.testing.assert_close(ft_step.replay(task, log), _replay(task, log), rtol=1e-6, atol=1e-7)


def _killed(n, kill, steps=16):
    task = T.Task(steps=steps)
    out = replicas.run(ft_step.replica, n, task, kill, restart=(kill[0],), timeout_s=120, restart_after_s=0.3,
                       watch=lambda s, a, st: ft_step.lighthouse(s, a, st, n, task.steps - 1))
    assert [d["exitcode"] for d in out["deaths"]] == [-9]
    res = out["results"]
    assert all(torch.equal(r["params"], res[0]["params"]) for r in res)  # the returner bit-equal
    survivor = res[(kill[0] + 1) % n]
    assert {"discarded": kill[1], "members": list(range(n))} in survivor["log"]
    torch.testing.assert_close(_replay(task, survivor["log"]), survivor["params"], rtol=1e-6, atol=1e-7)
    healed = next(e for e in res[kill[0]]["log"] if "healed_at" in e)
    return survivor, healed


@pytest.mark.parametrize("n", [2, 3])
def test_replica_0_killed_heals_from_replica_1(n, no_orphans):
    # replica 0 is the heal source whenever it is alive; dead, the lowest healthy member takes over
    survivor, healed = _killed(n, (0, 4))
    assert healed["from"] == 1
    _without_it_until_healed(survivor["log"], 0, 4, healed["healed_at"])  # went on without it


def test_a_replica_killed_in_the_first_step(no_orphans):
    survivor, healed = _killed(2, (1, 0))
    assert survivor["log"][0] == {"discarded": 0, "members": [0, 1]}  # nothing committed before it
    assert healed["from"] == 0


@pytest.mark.slow  # the last step waits for the returner
def test_a_replica_killed_in_the_last_step(no_orphans):
    survivor, healed = _killed(2, (1, 11), steps=12)
    assert healed == {"healed_at": 11, "from": 0}  # the whole run but its last step, from replica 0
    assert survivor["log"][-1] == {"step": 11, "members": [0, 1]}  # redone with the returner


def _single_threaded(fn, *args):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each replica runs: the matmuls add in the same order, bit for bit
    try:
        return fn(*args)
    finally:
        torch.set_num_threads(threads)


def test_ft_diloco_without_failures_equals_two_replicas_written_out(no_orphans):
    # 8 inner steps, H = 4: two outer steps; the second applies Nesterov momentum μ·buf from the first
    task, h = T.Task(steps=8, hidden=16), 4
    watch = lambda s, a, st: ft_step.lighthouse(s, a, st, 2, task.steps // h - 1)
    res = replicas.run(ft_diloco.replica, 2, task, h, 0.5, 0.5, watch=watch, timeout_s=60)["results"]
    want, sent = _single_threaded(_diloco_by_hand, task, h, 0.5, 0.5)
    assert all(torch.equal(r["params"], want) for r in res)
    assert [e["outer_step"] for e in res[0]["log"]] == [0, 1]
    assert res[0]["floats_sent"] == sent == 2 * want.numel()  # one exchange per round


SLOW = pytest.mark.slow  # about 1.5 s each: two of the four in the quick loop


@pytest.mark.parametrize("kill", [(0, 0), pytest.param((1, 0), marks=SLOW), pytest.param((0, 2), marks=SLOW),
                                  (1, 2)], ids=["0-first", "1-first", "0-last", "1-last"])
def test_ft_diloco_survives_a_death_in_the_first_and_the_last_round(kill, no_orphans):
    task, h = T.Task(steps=12, hidden=16), 4  # rounds 0, 1, 2
    watch = lambda s, a, st: ft_step.lighthouse(s, a, st, 2, task.steps // h - 1)
    out = replicas.run(ft_diloco.replica, 2, task, h, 0.5, 0.5, kill, restart=(kill[0],), restart_after_s=0.1,
                       watch=watch, timeout_s=120)
    assert [d["exitcode"] for d in out["deaths"]] == [-9]
    victim, other = kill[0], 1 - kill[0]
    res = out["results"]
    assert {"discarded": kill[1], "members": [0, 1]} in res[other]["log"]
    healed = next(e for e in res[victim]["log"] if "healed_at" in e)
    assert healed["from"] == other
    assert torch.equal(res[0]["params"], res[1]["params"])
    assert sorted(e["outer_step"] for e in res[other]["log"] if "outer_step" in e) == [0, 1, 2]
    _without_it_until_healed(res[other]["log"], victim, kill[1], healed["healed_at"], key="outer_step")


def test_a_replica_that_raises_is_named_with_its_cell_and_line():
    # bug caught: a learner's replica job that raised printed its traceback to the kernel's terminal,
    # at <dynamic-code>, and the notebook got only "replica 1 died (exit code 1)"
    import linecache

    from lesson_lib.runtime.errors import ReplicaError

    src = ("def bad_replica(replica, n, store_path):\n"
           "    if replica == 1:\n"
           "        raise ValueError('my bug on replica 1')\n"
           "    return replica\n")
    name = "/nonexistent/cell_42.py"  # as IPython names a cell: a file that is not on disk
    linecache.cache[name] = (len(src), None, src.splitlines(True), name)
    ns = {"__name__": "__main__"}
    exec(compile(src, name, "exec"), ns)
    try:
        with pytest.raises(ReplicaError) as e:
            replicas.run(ns["bad_replica"], 2, timeout_s=60)
    finally:
        linecache.cache.pop(name, None)
    msg = str(e.value)
    assert e.value.rank == 1 and msg.startswith("replica 1: ValueError: my bug on replica 1"), msg
    assert 'cell_42.py", line 3' in msg and "raise ValueError('my bug on replica 1')" in msg, msg
    assert "<dynamic-code>" not in msg


def test_a_second_fault_on_the_same_replica_says_the_one_spare_is_spent():
    # a learner SIGKILLs the spare that replaced replica 1: the run ends, saying why (issue 59 item 7)
    def dies_on_replica_1(replica, n, store_path):
        import os
        import signal

        if replica == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return replica

    with pytest.raises(RuntimeError) as e:
        replicas.run(dies_on_replica_1, 2, restart=(1,), restart_after_s=0.05, timeout_s=60)
    assert str(e.value).startswith("replica 1 died (exit code -9) and is not restarted: it had been "
                                   "restarted once already"), str(e.value)
    assert "restart=(1,)" in str(e.value)


def test_torchfts_logged_errors_are_kept_as_one_line_each_not_printed_raw():
    # issue 59 item 9: chapter 10 printed torchft's raw "Connection reset by peer ... GLHF!" tracebacks
    import logging

    from lesson_lib.milestones.resilience import torchft_glue

    raw = ("[r0:d8a50bdc-058c-4d21-a54e-f31c9973f34a/0 - step 4] got exception waiting for work "
           "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
           "[127.0.0.1]:37510. This is typically caused by a remote worker crashing. Check the logs of the "
           "remote worker before reporting an error. GLHF! \U0001f3d6\ufe0f\n"
           "Traceback (most recent call last):\n")
    log = logging.getLogger("torchft.manager")
    before = list(torchft_glue.CAUGHT)
    saved = (logging.getLogger("torchft").level, list(logging.getLogger("torchft").handlers),
             logging.getLogger("torchft").propagate)
    try:
        torchft_glue._keep_torchft_errors()
        log.error(raw)
        log.info("a per-step note")  # below ERROR: dropped
        assert torchft_glue.CAUGHT[len(before):] == [
            "step 4: got exception waiting for work: Connection closed by peer [127.0.0.1]:37510"]
    finally:
        top = logging.getLogger("torchft")
        top.setLevel(saved[0])
        top.handlers[:] = saved[1]
        top.propagate = saved[2]
        torchft_glue.CAUGHT[:] = before


def _dies_once_then_waits(replica, n, store_path):
    import os
    import signal
    import time

    import torch.distributed as dist

    store = dist.FileStore(store_path, -1)
    if replica == 1 and store.add("lives/1", 1) == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(2.5)  # both alive a while: the spare's process, too
    return replica


@pytest.mark.slow  # both replicas live 2.5 s
def test_a_spare_takes_the_dead_ones_place_only_once_the_watcher_has_seen_it_die():
    # CI's busy machine: the lighthouse's thread slept through a restart, saw replica 1 alive again
    # (its spare) and waited for the dead one's gradient forever. A watcher that looks only once a
    # second must still see replica 1 dead, however soon its spare is started.
    seen = []

    def slow_watcher(store, alive, stop):
        import time

        while not stop.is_set():
            seen.append(alive(1))
            time.sleep(1.0)

    out = replicas.run(_dies_once_then_waits, 2, restart=(1,), restart_after_s=0.0, watch=slow_watcher,
                       timeout_s=60)
    assert [d["exitcode"] for d in out["deaths"]] == [-9]
    assert False in seen, seen  # it saw the death ...
    assert seen[seen.index(False) + 1:][:1] == [True], seen  # ... and then the spare, alive
