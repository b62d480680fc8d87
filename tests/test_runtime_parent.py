"""A script that dies without closing its cluster leaves nothing behind, even while nobody reaps it.

A dead process that its parent has not waited for yet (a zombie) keeps its pid; workers that took
it for alive held the output pipes of a caller that captures them (``subprocess.run(...,
capture_output=True)``, as CI jobs and test harnesses do), which then waited for end-of-file
forever. Here the test is that caller: it starts the script, does not wait for it, and reads its
output until end-of-file.
"""

import os
import select
import subprocess
import sys
import time

import psutil
import pytest
from conftest import wait_no_workers

pytestmark = [pytest.mark.ch0, pytest.mark.slow]
METHODS = ["forkserver", "spawn"] if sys.platform.startswith("linux") else ["spawn"]

SCRIPT = """
import os
from multiprocessing import forkserver, resource_tracker
from lesson_lib import Cluster

def main():
    c = Cluster(2, quiet=True)
    print("ran", c.run(os.getpid), flush=True)
    helpers = [forkserver._forkserver._forkserver_pid, resource_tracker._resource_tracker._pid]
    print("helpers", *[p for p in helpers if p], flush=True)
    os._exit(0)  # no close(), no atexit: as a SIGKILL or the OOM killer would end it

if __name__ == "__main__":
    main()
"""


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("method", METHODS)
def test_a_script_that_dies_unreaped_releases_its_callers_pipes_and_leaves_no_process(tmp_path, method):
    script = tmp_path / "dies.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "LESSON_LIB_START_METHOD": method}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=env)
    out, died, eof = b"", None, None
    try:
        end = time.monotonic() + 120  # start-up on a loaded machine, then the 10 s that count
        while eof is None and time.monotonic() < end:
            ready, _, _ = select.select([proc.stdout], [], [], 0.1)
            if died is None and _zombie(proc.pid):  # dead, and not reaped: we do not wait() for it
                died = time.monotonic()
                end = min(end, died + 10)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 65536)
                out += chunk
                if not chunk:
                    eof = time.monotonic()
        assert died is not None, out.decode(errors="replace")[-2000:]
        assert _zombie(proc.pid)  # still unreaped while the pipes closed: the case that hung
        text = out.decode(errors="replace")
        lines = dict(line.split(" ", 1) for line in text.splitlines() if line.startswith(("ran", "helpers")))
        workers = [int(p) for p in lines["ran"].strip("[]").split(",")]
        helpers = [int(p) for p in lines.get("helpers", "").split()]
        # caught: workers and the fork server took the zombie for alive and kept the pipes open
        # (still there after 150 s; the caller waited for end-of-file forever)
        assert eof is not None, f"no end-of-file 10 s after the script died; it printed: {text[-2000:]}"
        assert eof - died < 10
        assert not wait_no_workers(workers + helpers, 20.0), "a worker or the fork server outlived it"
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


KERNEL = """
import sys, time
from lesson_lib.runtime import warm_cluster

if __name__ == "__main__":
    pids = [p for n in (1, 2) for p in warm_cluster(n).pids()]  # two warm clusters, as a chapter keeps
    print("pids", *pids, flush=True)
    time.sleep(120)
"""


def test_two_kernels_killed_with_their_process_groups_leave_no_folder(tmp_path):
    """Jupyter ends a kernel by killing its process group (SIGKILL at shutdown): its workers died
    with it, nobody removed the folders, and with two notebooks run at once no later cluster start
    swept them (7 ``/tmp/lesson_lib_*`` folders left). Workers now leave the kernel's group and
    remove all its folders, the fork server's mark's included, when it dies."""
    import glob
    import signal

    script = tmp_path / "kernel.py"
    script.write_text(KERNEL)
    tmp = tmp_path / "tmp"  # their own: no other process's cluster start sweeps it meanwhile
    tmp.mkdir()
    env = {**os.environ, "LESSON_LIB_START_METHOD": "forkserver" if "forkserver" in METHODS else "spawn",
           "TMPDIR": str(tmp)}
    procs = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env,
                              start_new_session=True) for _ in range(2)]
    try:
        lines = [next(line for line in proc.stdout if line.startswith("pids")) for proc in procs]
        workers = [int(p) for line in lines for p in line.split()[1:]]
        assert len(workers) == 6
        mine = [glob.glob(os.path.join(tmp, f"lesson_lib_{p.pid}_*")) for p in procs]
        assert all(len(m) >= 2 for m in mine), mine  # each cluster's, and the mark's under a fork server
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            proc.stdout.close()
    assert not wait_no_workers(workers, 20.0), "workers outlived their killed kernels"
    end = time.monotonic() + 5
    while any(os.path.exists(d) for m in mine for d in m) and time.monotonic() < end:
        time.sleep(0.1)
    assert not [d for m in mine for d in m if os.path.exists(d)], "folders outlived their kernels"
