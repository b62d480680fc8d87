"""A learner's share of a workshop server: JupyterHub's per-user CPU_LIMIT and MEM_LIMIT, the cgroup
memory limit, and warm clusters that give their memory back when idle (runtime/idle.py)."""

import os
import subprocess
import sys
import time

import psutil
import pytest

from lesson_lib.runtime import Cluster, idle, placement, pool

pytestmark = pytest.mark.ch0


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no affinity masks on this platform")
@pytest.mark.parametrize("limit, quota, want", [
    ("1", None, 1), ("1.5", None, 2), ("0.25", None, 1), ("3", 2.0, 2), ("2", 4.0, 2),
    ("", None, 16), ("0", None, 16), ("lots", None, 16), ("inf", None, 16), ("64", None, 16),
])
def test_cpu_limit_caps_the_cores_like_a_quota(monkeypatch, limit, quota, want):
    # catches: a workshop learner's 4 ranks each given the whole 16-core server's threads
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(placement, "cpu_quota", lambda: quota)
    monkeypatch.setenv("CPU_LIMIT", limit)
    assert placement.cpu_count() == want
    assert placement.oversubscribed(4, 1, "gloo") is (4 > want)
    assert placement.threads_per_rank(1) == max(1, want - 1)


def test_the_share_is_named_where_it_caps_the_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(placement, "cpu_quota", lambda: None)
    monkeypatch.setenv("CPU_LIMIT", "2")
    assert placement.share_note() == " (this user's share: CPU_LIMIT=2)"
    with pytest.warns(RuntimeWarning, match=r"4 ranks on 2 CPU cores \(this user's share: CPU_LIMIT=2\)"):
        Cluster(4, start=False, quiet=True)
    monkeypatch.setenv("CPU_LIMIT", "32")  # more than the machine: the cores decide, no share named
    assert placement.share_note() == ""


def _cgroup(tmp_path, membership, files):
    (tmp_path / "self_cgroup").write_text(membership)
    for rel, text in files.items():
        f = tmp_path / "fs" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return str(tmp_path / "fs"), str(tmp_path / "self_cgroup")


@pytest.mark.parametrize("membership, files, env, want, source", [
    ("0::/u\n", {"u/memory.max": "4294967296\n"}, None, 4294967296, "cgroup"),           # v2
    ("0::/u\n", {"u/memory.max": "max\n"}, None, None, "machine"),                        # v2, none
    ("0::/a/b\n", {"a/b/memory.max": "max", "a/memory.max": "1073741824"}, None, 1073741824, "cgroup"),
    ("5:memory:/x\n", {"memory/x/memory.limit_in_bytes": "2147483648"}, None, 2147483648, "cgroup"),  # v1
    ("5:memory:/\n", {"memory/memory.limit_in_bytes": str(2**63 - 4096)}, None, None, "machine"),
    ("0::/u\n", {"u/memory.max": "4294967296"}, "1000000000", 1000000000, "MEM_LIMIT"),  # tighter
    ("0::/u\n", {"u/memory.max": "1000000000"}, "4294967296", 1000000000, "cgroup"),
])
def test_memory_share(tmp_path, monkeypatch, membership, files, env, want, source):
    if env is None:
        monkeypatch.delenv("MEM_LIMIT", raising=False)
    else:
        monkeypatch.setenv("MEM_LIMIT", env)
    root, member = _cgroup(tmp_path, membership, files)
    got = placement.memory_share(root, member)
    assert got["limited_by"] == source
    assert got["bytes"] == (psutil.virtual_memory().total if want is None else want)


@pytest.mark.parametrize("mem_limit, want", [("2000000000", 2), ("1200000000", 1), ("100e9", 12), ("", 12)])
def test_warm_ranks_fit_the_memory_share(monkeypatch, mem_limit, want):
    # 1 GB for the kernel, then 500 MB a rank: (2e9 - 1e9) / 5e8 = 2; at least 1; at most 12
    monkeypatch.setattr(placement, "_cgroup_memory", lambda *a: None)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("M", (), {"total": 64e9})())
    monkeypatch.setenv("MEM_LIMIT", mem_limit)
    assert pool.max_warm_ranks() == want


@pytest.mark.slow
def test_doctor_prints_the_share():
    env = {**os.environ, "CPU_LIMIT": "1", "MEM_LIMIT": "3000000000"}
    out = subprocess.run([sys.executable, "-m", "lesson_lib", "doctor"], env=env, capture_output=True,
                         text=True, timeout=120).stdout
    assert "cpu share:       1 of " in out and "(CPU_LIMIT 1)" in out
    assert "memory share:    3.0 of " in out and "(MEM_LIMIT)" in out


@pytest.mark.parametrize("raw, want", [("", 600.0), ("90", 90.0), ("off", None), ("0.5", 0.5)])
def test_idle_seconds(monkeypatch, raw, want):
    monkeypatch.setenv("LESSON_LIB_IDLE_S", raw)
    assert idle.idle_seconds() == want


@pytest.mark.parametrize("raw", ["soon", "0", "-5"])
def test_idle_seconds_refuses_nonsense_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv("LESSON_LIB_IDLE_S", raw)
    with pytest.raises(ValueError, match="LESSON_LIB_IDLE_S"):
        idle.idle_seconds()


class _Fake:
    """Stands in for a Cluster: the reaper reads only these."""

    def __init__(self, idle_for: float, now: float):
        import threading

        self.running, self._use = True, threading.RLock()
        self.last_used, self.last_used_epoch = now - idle_for, time.time() - idle_for
        self.closed = 0

    def close(self):
        self.running = False
        self.closed += 1


def test_the_reaper_closes_only_what_idled_past_the_limit(monkeypatch, tmp_path):
    monkeypatch.setenv("LESSON_LIB_IDLE_S", "600")
    monkeypatch.setattr(idle.tempfile, "gettempdir", lambda: str(tmp_path))
    now = 1000.0
    fresh, old, busy = _Fake(599, now), _Fake(601, now), _Fake(5000, now)
    busy._use.acquire()  # a job is running on it, however long since the last one ended
    import threading

    t = threading.Thread(target=lambda: idle.reap([fresh, old, busy], now))
    t.start()
    t.join(5)
    assert (fresh.closed, old.closed, busy.closed) == (0, 1, 0)


def test_another_chapter_starting_a_cluster_hands_ours_over(monkeypatch, tmp_path):
    monkeypatch.setenv("LESSON_LIB_IDLE_S", "3600")
    monkeypatch.setattr(idle.tempfile, "gettempdir", lambda: str(tmp_path))
    now = 1000.0
    recent, idle_a_while = _Fake(idle.HANDOVER_S - 1, now), _Fake(idle.HANDOVER_S + 1, now)
    idle.reap([recent, idle_a_while], now)
    assert idle_a_while.closed == 0  # no other kernel has spoken yet
    # another kernel of this user (another pid) starts a warm cluster now
    marker = idle._marker()
    with open(marker, "w") as f:
        f.write(f"{os.getpid() + 1} {time.time()}")
    idle.reap([recent, idle_a_while], now)
    assert (recent.closed, idle_a_while.closed) == (0, 1)
    # our own announcement is not a reason to hand over
    idle.announce()
    again = _Fake(idle.HANDOVER_S + 5, now)
    idle.reap([again], now)
    assert again.closed == 0
    monkeypatch.setenv("LESSON_LIB_IDLE_S", "off")  # off: nothing is closed, handed over or not
    with open(marker, "w") as f:
        f.write(f"{os.getpid() + 1} {time.time()}")
    assert idle.reap([_Fake(10 * idle.HANDOVER_S, now)], now) == []
    assert oct(os.stat(os.path.dirname(marker)).st_mode & 0o777) == "0o700"


def test_a_marker_folder_owned_by_someone_else_is_ignored(monkeypatch, tmp_path):
    monkeypatch.setattr(idle.tempfile, "gettempdir", lambda: str(tmp_path))
    os.symlink(str(tmp_path), str(tmp_path / f"lesson_lib_u{os.getuid()}"))  # planted by another user
    assert idle._marker() is None
    idle.announce()  # does nothing, raises nothing


@pytest.mark.slow
def test_an_idle_warm_cluster_gives_its_ranks_back_and_restarts(monkeypatch):
    monkeypatch.setenv("LESSON_LIB_IDLE_S", "1")
    monkeypatch.setattr(idle, "POLL_S", 0.2)
    cluster = pool.warm_cluster(2)
    pids = cluster.pids()
    assert all(psutil.pid_exists(p) for p in pids)
    deadline = time.monotonic() + 20
    while cluster.running and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not cluster.running, "the reaper did not close a cluster idle for 1 s within 20 s"
    while any(_running(p) for p in pids) and time.monotonic() < deadline:  # close() is still joining
        time.sleep(0.1)
    assert not any(_running(p) for p in pids), "the closed cluster's ranks still run"
    assert pool.warm_cluster(2).run(_rank) == [0, 1]  # the next run starts it again
    monkeypatch.setenv("LESSON_LIB_IDLE_S", "off")


def _running(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _rank():
    import torch.distributed as dist

    return dist.get_rank()
