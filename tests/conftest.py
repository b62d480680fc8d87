import contextlib
import io
import os
import subprocess
import sys
import time
from pathlib import Path

# Bytecode caches, also where the environment turns them off (PYTHONDONTWRITEBYTECODE, as on this
# project's development machines): pytest then rewrote every test module's asserts on each run (7.6 s
# of the quick loop's 12.4 s collection) and every process compiled the course from source. This
# process, and the fork server and kernels it starts, write them under __pycache__ (git ignores it).
# The quick loop on a quiet 2-core machine: 180 s with the variable set, 171 s without it, caches
# written (2026-12-08).
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

import psutil  # noqa: E402
import pytest  # noqa: E402

from lesson_lib.runtime import Cluster  # noqa: E402


def _is_worker(p: psutil.Process) -> bool:
    """Spawned (``spawn_main``), or forked by a fork server (its parent runs the server's loop;
    the server itself is not a worker, nor is the resource tracker)."""
    cmd = " ".join(p.cmdline())
    if "spawn_main" in cmd:
        return True
    parent = p.parent()
    return ("multiprocessing.forkserver" in cmd and parent is not None
            and "multiprocessing.forkserver" in " ".join(parent.cmdline()))


def worker_children() -> list[psutil.Process]:
    """Live worker processes started by this test process."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and _is_worker(p):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_no_workers(pids, timeout=20.0) -> list[int]:
    """PIDs from ``pids`` still alive after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < end:
        alive = [p for p in alive if _running(p)]
        time.sleep(0.05)
    return alive


def _running(pid: int) -> bool:
    try:  # a process may exit between any two questions about it
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def cli_in_process(*args: str) -> subprocess.CompletedProcess:
    """``python -m lesson_lib ARGS`` run in this process: its exit code and what it printed.

    The same ``main``, without a subprocess's ``import torch`` and fork server (seconds each): for
    bad input, help, mistyped names and the chapters' ``run ... --json`` checks, whose ranks fork from
    this process's server. test_cli keeps real ``python -m`` and torchrun runs. An exception that
    escapes ``main`` fails the test, as its traceback would in a shell."""
    from lesson_lib.__main__ import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as e:  # argparse's errors and --help
            code = e.code if isinstance(e.code, int) else 1
    return subprocess.CompletedProcess(["python", "-m", "lesson_lib", *args], code, out.getvalue(),
                                       err.getvalue())


@pytest.fixture(scope="session")
def clusters():
    """Warm clusters of 1–4 ranks shared by the tests that only read results."""
    made = {}

    def get(n: int) -> Cluster:
        c = made.get(n)
        if c is None or not c.running:
            c = made[n] = Cluster(n, quiet=True, timeout_s=20)
        return c

    yield get
    for c in made.values():
        c.close()


@pytest.fixture
def no_orphans():
    """Fails the test if it leaves worker processes behind."""
    before = {p.pid for p in worker_children()}
    yield
    leftover = [p.pid for p in worker_children() if p.pid not in before]
    assert not wait_no_workers(leftover, 20.0), f"orphan workers: {leftover}"


os.environ.setdefault("PYTHONUNBUFFERED", "1")


# Time per test file, written at the end of each run over all of tests/ to
# artifacts/test-times/<selection>.json (`all` without -m, else the -m expression);
# benchmarks/test_times_table.py renders the whole suite's and the quick loop's as test-times.md.
_FILE_SECONDS: dict[str, list] = {}


def pytest_runtest_logreport(report):
    entry = _FILE_SECONDS.setdefault(report.nodeid.split("::")[0], [0.0, 0])
    entry[0] += report.duration
    entry[1] += report.when == "call"


def pytest_sessionfinish(session, exitstatus):
    import json
    import platform
    import re
    import sys

    from workshop_support import stop_background_install

    stop_background_install()
    whole_dir = [Path(a).resolve() for a in session.config.args] == [Path(__file__).parent]
    if not _FILE_SECONDS or not whole_dir:  # only runs over all of tests/: a subset would mislead
        return
    mark = session.config.getoption("markexpr") or "all"
    out = session.config.rootpath / "artifacts" / "test-times" / (re.sub(r"\W+", "-", mark) + ".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "selection": mark, "date": time.strftime("%Y-%m-%d"), "nproc": os.cpu_count(),
        "load_1min": round(os.getloadavg()[0], 2), "machine": platform.machine(),
        "ci": bool(os.environ.get("CI")), "exit_status": int(exitstatus),
        "command": "pytest " + " ".join(sys.argv[1:]),
        "files": {f: {"seconds": round(s, 2), "tests": n} for f, (s, n) in sorted(_FILE_SECONDS.items())},
    }, indent=1) + "\n")


def pytest_collection_modifyitems(session, config, items):
    """The tests of recently changed code first (tests/recent_first.py)."""
    from recent_first import order

    items[:] = order(items)


def pytest_collection_finish(session):
    """When the workshop's tests will run (selected, not deselected), their shared install starts
    building now, in the background (tests/workshop_support.py)."""
    if not session.config.getoption("collectonly") and any(
            "shared_install" in getattr(i, "fixturenames", ()) for i in session.items):
        from workshop_support import start_background_install

        start_background_install()
