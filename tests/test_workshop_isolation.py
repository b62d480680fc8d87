"""Two learners of the workshop, two Unix users, one job each at the same time: neither can read, write
or kill the other's work, and both finish.

Each learner runs a small ``lesson_lib.Cluster`` job as their own user, in the environment their
kernels get (``start.py --run``). While both jobs hold mid-run, a probe run as each learner tries the
other's rendezvous folder, fork server's socket, record file (written in their copy of the course,
as chapters write records), shared-memory segment, home, temp folder and rank processes, and the
shared install; the
same probe run as the owner on their own things is the reference that shows it can reach them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from workshop_support import learners, owned_in, uid_pids, wait_until
from workshop_support import shared_install as shared_install  # a fixture

pytestmark = [pytest.mark.slow, pytest.mark.ch0]
NAMES = ["lw-iso-ada", "lw-iso-bob"]
JOB_TIMEOUT_S = 180

JOB = textwrap.dedent('''
    import glob, json, os, sys, time
    from multiprocessing import shared_memory
    from pathlib import Path
    import torch, torch.distributed as dist
    from lesson_lib import Cluster

    def work():
        t = torch.ones(1) * (dist.get_rank() + 1)
        dist.all_reduce(t)
        return {"pid": os.getpid(), "sum": t.item()}

    if __name__ == "__main__":
        tmp = os.environ["TMPDIR"]
        record = Path(os.environ["HOME"], "course", "my-record.json")  # as a chapter writes a record
        shm = shared_memory.SharedMemory(create=True, size=4096)
        shm.buf[:6] = b"secret"
        with Cluster(2) as cluster:
            first = cluster.run(work, timeout_s=60)
            record.write_text(json.dumps(first))
            ready = {"pids": [r["pid"] for r in first], "shm": "/dev/shm/" + shm.name.lstrip("/"),
                     "record": str(record), "rendezvous": glob.glob(os.path.join(tmp, "lesson_lib_*")),
                     "forkserver": glob.glob(os.path.join(tmp, "pymp-*", "listener-*")),
                     "tmp": tmp, "home": os.environ["HOME"]}
            Path(tmp, "ready.json.part").write_text(json.dumps(ready))
            os.rename(Path(tmp, "ready.json.part"), Path(tmp, "ready.json"))
            deadline = time.monotonic() + 120
            while not Path(tmp, "go").exists():
                if time.monotonic() > deadline:
                    sys.exit("no go within 120 s")
                time.sleep(0.1)
            second = cluster.run(work, timeout_s=60)
        shm.close()
        shm.unlink()
        print(json.dumps({"first": first, "second": second}))
''')

PROBE = textwrap.dedent('''
    import json, os, signal, socket, sys
    t, own, install = json.loads(sys.argv[1]), sys.argv[2] == "own", sys.argv[3]
    out = {}
    def attempt(name, fn):
        try:
            fn()
            out[name] = "allowed"
        except PermissionError:
            out[name] = "denied"
    attempt("list home", lambda: os.listdir(t["home"]))
    attempt("list temp folder", lambda: os.listdir(t["tmp"]))
    for i, folder in enumerate(t["rendezvous"]):
        attempt(f"list rendezvous {i}", lambda: os.listdir(folder))
    for i, sock in enumerate(t["forkserver"]):  # the fork server's socket: it forks ranks on request
        def connect(path=sock):
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(path)
            finally:
                s.close()
        attempt(f"connect to fork server {i}", connect)
    attempt("read record", lambda: open(t["record"]).read())
    attempt("write beside record", lambda: open(os.path.join(os.path.dirname(t["record"]),
                                                             "probe.txt"), "w").close())
    attempt("read shared memory", lambda: open(t["shm"], "rb").read(6))
    for rank, pid in enumerate(t["pids"]):  # the owner asks (signal 0); the other tries to end it
        attempt(f"kill rank {rank}", lambda: os.kill(pid, 0 if own else signal.SIGTERM))
    attempt("write into the install", lambda: open(os.path.join(install, "probe.txt"), "w").close())
    print(json.dumps(out))
''')


def _as(user, venv: Path, course: Path, *cmd: str, **kw) -> subprocess.Popen:
    """``cmd`` as learner ``user`` in the environment their kernels get (start.py --run)."""
    env = {"HOME": user.pw_dir, "USER": user.pw_name, "PATH": f"{venv}/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    start = course / "lesson_lib" / "workshop" / "start.py"
    return subprocess.Popen([str(venv / "bin" / "python"), str(start), "--run", *cmd], user=user.pw_uid,
                            group=user.pw_gid, extra_groups=[], env=env, cwd=user.pw_dir,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _probe(user, venv, course, scripts: Path, targets: dict, own: bool) -> dict:
    p = _as(user, venv, course, str(venv / "bin" / "python"), str(scripts / "probe.py"), json.dumps(targets),
            "own" if own else "other", str(course / "lesson_lib"))
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, f"the probe as {user.pw_name} failed:\n{err[-2000:]}"
    return json.loads(out)


def test_two_learners_cannot_reach_each_others_work(shared_install):
    from lesson_lib.workshop import serve

    venv, course = shared_install
    scripts = Path(tempfile.mkdtemp(prefix="workshop-isolation-"))
    try:
        os.chmod(scripts, 0o755)  # the learners read the two scripts, nothing else of root's
        (scripts / "job.py").write_text(JOB)
        (scripts / "probe.py").write_text(PROBE)
        for f in scripts.iterdir():
            os.chmod(f, 0o644)
        with learners(NAMES) as users:
            for u in users:  # their copy of the course, made as on a first login
                serve.run_as(u.pw_name, venv, course, "--reset")
            started = time.monotonic()
            jobs = {u.pw_name: _as(u, venv, course, str(venv / "bin" / "python"), str(scripts / "job.py"))
                    for u in users}
            try:
                targets = {}
                for u in users:
                    ready = Path(u.pw_dir, ".cache", "lesson-workshop", "tmp", "ready.json")
                    wait_until(f"{u.pw_name}'s job to hold mid-run ({ready})",
                               lambda r=ready, n=u.pw_name: r.exists() or jobs[n].poll() is not None,
                               JOB_TIMEOUT_S)
                    assert jobs[u.pw_name].poll() is None, jobs[u.pw_name].communicate()[1][-3000:]
                    targets[u.pw_name] = json.loads(ready.read_text())
                    assert targets[u.pw_name]["rendezvous"], f"{u.pw_name}'s rendezvous is not in TMPDIR"
                    assert targets[u.pw_name]["forkserver"], f"{u.pw_name}'s fork server is not in TMPDIR"
                    shm_owner = os.stat(targets[u.pw_name]["shm"]).st_uid
                    assert shm_owner == u.pw_uid and os.stat(targets[u.pw_name]["shm"]).st_mode & 0o077 == 0
                a, b = users
                for me, other in ((a, b), (b, a)):
                    own = _probe(me, venv, course, scripts, targets[me.pw_name], own=True)
                    assert {k: v for k, v in own.items() if k != "write into the install"} == \
                        {k: "allowed" for k in own if k != "write into the install"}, own
                    assert own["write into the install"] == "denied", own
                    theirs = _probe(me, venv, course, scripts, targets[other.pw_name], own=False)
                    assert set(theirs) == set(own) and set(theirs.values()) == {"denied"}, \
                        f"{me.pw_name} reached {other.pw_name}'s work: {theirs}"
                for u in users:
                    Path(targets[u.pw_name]["tmp"], "go").touch()
                results = {}
                for name, job in jobs.items():
                    out, err = job.communicate(timeout=JOB_TIMEOUT_S)
                    assert job.returncode == 0, f"{name}'s job failed:\n{err[-3000:]}"
                    results[name] = json.loads(out.strip().splitlines()[-1])
                print(f"two learners' jobs, probes included: {time.monotonic() - started:.1f} s")
                for name, r in results.items():  # 1 + 2 on both ranks, before and after the probes
                    assert [x["sum"] for x in r["first"] + r["second"]] == [3.0] * 4, (name, r)
                for u in users:  # their ranks ended; nothing of theirs in /dev/shm or their temp folder
                    wait_until(f"{u.pw_name}'s processes to end", lambda uid=u.pw_uid: not uid_pids(uid), 30)
                    assert not owned_in("/dev/shm", u.pw_uid), owned_in("/dev/shm", u.pw_uid)
                    left = [p.name for p in Path(targets[u.pw_name]["tmp"]).iterdir()
                            if p.name.startswith("lesson_")]
                    assert not left, f"{u.pw_name}'s rendezvous folders outlived the job: {left}"
                written = [str(p) for p in course.rglob("*") if p.stat().st_uid in {u.pw_uid for u in users}]
                assert not written, f"learners wrote into the install: {written[:5]}"
            finally:
                for job in jobs.values():
                    if job.poll() is None:
                        job.kill()
                        job.communicate(timeout=30)
    finally:
        shutil.rmtree(scripts, ignore_errors=True)
