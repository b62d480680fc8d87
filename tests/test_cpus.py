"""Cores the runtime plans with: the affinity mask capped by a container's CPU quota (JupyterHub on
Kubernetes, Binder), read from cgroup v2 or v1 files."""

import os

import pytest

from lesson_lib.runtime import placement


def _tree(tmp_path, membership: str, files: dict[str, str]):
    (tmp_path / "self_cgroup").write_text(membership)
    for rel, text in files.items():
        f = tmp_path / "fs" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return {"root": str(tmp_path / "fs"), "membership": str(tmp_path / "self_cgroup")}


@pytest.mark.parametrize("membership, files, want", [
    ("0::/\n", {"cpu.max": "200000 100000\n"}, 2.0),                             # v2, a 2-CPU pod
    ("0::/\n", {"cpu.max": "max 100000\n"}, None),                                # v2, no limit
    ("0::/kubepods/pod1/c1\n", {"kubepods/pod1/c1/cpu.max": "max 100000",         # v2, the pod's
                                "kubepods/pod1/cpu.max": "150000 100000"}, 1.5),  # parent limits it
    ("4:cpu,cpuacct:/docker/abc\n", {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "300000",
                                     "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000"}, 3.0),  # v1
    ("1:cpu:/\n", {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, None),  # v1, none
    ("0::/\n", {}, None),                                                          # nothing to read
])
def test_cpu_quota_from_cgroup_files(tmp_path, membership, files, want):
    assert placement.cpu_quota(**_tree(tmp_path, membership, files)) == want


def test_a_missing_membership_file_means_no_quota(tmp_path):
    assert placement.cpu_quota(str(tmp_path), str(tmp_path / "absent")) is None


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no affinity masks on this platform")
@pytest.mark.parametrize("quota, want", [(None, 64), (2.0, 2), (1.5, 2), (0.5, 1), (128.0, 64)])
def test_the_quota_caps_the_cores_and_the_threads(monkeypatch, quota, want):
    # catches: a 2-CPU pod on a 64-core node planning 64 cores: 4 ranks with 15 threads each,
    # stretched timings and no oversubscription note
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setattr(placement, "cpu_quota", lambda: quota)
    assert placement.cpu_count() == want
    assert placement.threads_per_rank(4) == max(1, (want - 1) // 4)
    assert placement.oversubscribed(4, 1, "gloo") is (4 > want)
