"""How workers start (lesson_lib.runtime.start): a fork server for CPU ranks on Linux, spawn elsewhere
or when asked. Both paths must give the same workers: the cluster's settings, not the server's."""

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import wait_no_workers, worker_children

from lesson_lib import Cluster
from lesson_lib.runtime import start

pytestmark = pytest.mark.ch0
METHODS = ["forkserver", "spawn"] if sys.platform.startswith("linux") else ["spawn"]


def _settings():
    import torch

    return {"omp": os.environ.get("OMP_NUM_THREADS"), "threads": torch.get_num_threads(),
            "iface": os.environ.get("GLOO_SOCKET_IFNAME"), "pid": os.getpid(), "ppid": os.getppid()}


def test_cpu_ranks_on_linux_use_the_fork_server_and_the_variable_turns_it_off(monkeypatch):
    monkeypatch.delenv("LESSON_LIB_START_METHOD", raising=False)
    assert start.method("gloo") == ("forkserver" if sys.platform.startswith("linux") else "spawn")
    assert start.method("nccl") == "spawn"  # GPU ranks: spawn, until the CUDA path has run on a GPU
    monkeypatch.setenv("LESSON_LIB_START_METHOD", "spawn")
    assert start.method("gloo") == "spawn"


# spawn starts each worker from a fresh interpreter (seconds); the fork server's case stays in the quick loop
@pytest.mark.parametrize("method", [pytest.param(m, marks=pytest.mark.slow)
                                    if m == "spawn" and len(METHODS) > 1 else m for m in METHODS])
def test_each_cluster_gets_its_own_settings_whatever_started_the_server(method, monkeypatch):
    """The fork server was started with one OpenMP thread; a cluster asking for 2 threads per rank
    gets 2 (caught: the variables set in the kernel around the start, which a forked worker never
    sees, as the only way the settings travelled)."""
    monkeypatch.setenv("LESSON_LIB_START_METHOD", method)
    for threads in (2, 1):
        with Cluster(2, quiet=True, threads=threads) as c:
            got = c.run(_settings)
            pids = c.pids()
            assert {p.pid for p in worker_children()} >= set(pids)  # what the orphan checks look for
        assert [g["pid"] for g in got] == pids
        assert {(g["omp"], g["threads"]) for g in got} == {(str(threads), threads)}
        assert {g["iface"] for g in got} == {"lo"}
        if method == "forkserver":  # forked by the server, not by this process
            assert {g["ppid"] for g in got} != {os.getpid()}
        assert not wait_no_workers(pids, 20.0)


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_workers_exit_when_the_kernel_is_killed(method):
    """A SIGKILLed kernel: its fork server exits, and so do the workers it forked (they watch the
    kernel, not their parent alone)."""
    code = ("import sys, time; from lesson_lib import Cluster\n"
            "c = Cluster(3, quiet=True); print(*c.pids(), flush=True); time.sleep(60)\n")
    env = {**os.environ, "LESSON_LIB_START_METHOD": method}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    try:
        pids = [int(x) for x in proc.stdout.readline().split()]
        assert len(pids) == 3
    finally:
        proc.kill()
        proc.wait()
    assert not wait_no_workers(pids, 20.0), "workers outlived a SIGKILLed parent"


@pytest.mark.skipif("forkserver" not in METHODS, reason="Linux only")
def test_the_fork_server_runs_one_thread_so_its_children_fork_safely(monkeypatch):
    """Forking copies one thread; a lock another thread held would stay locked in the child. The
    preloaded modules must start no thread in the server (caught: a preload that starts a pool)."""
    import psutil

    monkeypatch.delenv("LESSON_LIB_START_METHOD", raising=False)
    with Cluster(1, quiet=True) as c:
        c.run(_settings)
        servers = [p for p in psutil.Process().children()
                   if "multiprocessing.forkserver" in " ".join(p.cmdline())]
        assert len(servers) == 1
        assert servers[0].num_threads() == 1
        # and a fresh worker finds what a first optimizer step imports already there (caught: the
        # preload dropped, every rank importing torch._dynamo itself, seconds per fresh world)
        assert c.run(_preloaded, ["torch._dynamo", "torch.distributed.fsdp"]) == [True]


def _preloaded(names):
    import sys

    return all(n in sys.modules for n in names)


@pytest.mark.slow  # a fresh interpreter importing torch and every chapter: 5 s of the quick loop
def test_a_worker_importing_any_chapter_module_pays_for_no_figure_machinery():
    """A rank imports a chapter's module to unpickle a job's function. plotly's FigureWidget pulls in
    its renderers, nbformat and jsonschema: 2.3 s of one core per worker (a whole quick loop went
    from 334 s to 234 s on 2 cores when it stopped, 2026-12-07). Nothing of it may load at import."""
    code = ("import importlib, pkgutil, sys\n"
            "import lesson_lib.chapters as c, lesson_lib.plots, lesson_lib.milestones, lesson_lib.comm\n"
            "for m in pkgutil.iter_modules(c.__path__):\n"
            "    importlib.import_module('lesson_lib.chapters.' + m.name)\n"
            "print(sorted(m for m in ('jsonschema', 'nbformat', 'plotly.basewidget') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


def test_a_live_figure_is_made_on_first_use_and_opens_with_its_whole_figure():
    import plotly.graph_objects as go

    from lesson_lib.plots.live import LiveFigure, _live_class

    fig = LiveFigure({"data": [{"type": "scatter", "y": [1, 2]}], "layout": {"title": {"text": "t"}}})
    assert isinstance(fig, go.FigureWidget) and fig.data[0].y == (1, 2)
    again = fig.fresh()
    assert isinstance(again, _live_class()) and again is not fig and again.layout.title.text == "t"


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="POSIX signal masks")
def test_an_interrupt_while_workers_start_is_kept_for_the_parent_and_spares_what_started():
    # catches: SIGINT ignored while workers start (the learner's interrupt was lost and the job ran
    # on), raised mid-start (workers killed while unpickling, the fork server killed while importing
    # torch), or not kept from the children (each printed its own KeyboardInterrupt)
    code = "import time; print('started', flush=True); time.sleep(1.5); print('alive', flush=True)"
    start._DEFERRED.clear()
    with start._environment({}):
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline() == "started\n"
        os.kill(child.pid, signal.SIGINT)  # as Ctrl-C, which reaches the whole process group
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)  # nothing raised here: the start goes on
    with pytest.raises(KeyboardInterrupt):
        start.raise_deferred_interrupt()
    start.raise_deferred_interrupt()  # kept once: nothing the second time
    assert child.communicate(timeout=30)[0] == "alive\n" and child.returncode == 0


@pytest.mark.skipif("forkserver" not in METHODS, reason="Linux only")
def test_an_interrupt_during_a_cold_start_stops_it_once_the_workers_are_up(tmp_path):
    # catches: the interrupt lost (the job then ran), or raised while the fork server imported torch
    # (it died, and the next start failed with EOFError or a worker that exited with code 1)
    code = ("import os, signal, threading\n"
            "from lesson_lib import Cluster\n"
            "from lesson_lib.runtime.errors import RunInterrupted\n"
            "if __name__ == '__main__':\n"
            "    threading.Timer(0.3, os.killpg, (os.getpgrp(), signal.SIGINT)).start()\n"
            "    try:\n"
            "        Cluster(2, quiet=True).run(print, 'the job ran')\n"
            "    except RunInterrupted as e:\n"
            "        print('interrupted:', e)\n"
            "    print('again', Cluster(2, quiet=True).run(sum, [1, 2]))\n")
    script = tmp_path / "interrupted.py"
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         start_new_session=True, env={**os.environ, "LESSON_LIB_START_METHOD": "forkserver"})
    assert out.stdout.startswith("interrupted: start-up was interrupted"), (out.stdout, out.stderr)
    assert "again [3, 3]" in out.stdout and "the job ran" not in out.stdout, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr


def test_a_kernels_shutdown_closes_the_ranks_and_reaps_the_helpers_before_its_own(monkeypatch):
    """runtime/kernel_exit.py on a stand-in kernel: the order of what runs is the point (the real
    kernel's timing is tests/test_kernel.py)."""
    import multiprocessing.forkserver as forkserver
    import multiprocessing.resource_tracker as resource_tracker
    import types

    import IPython

    from lesson_lib.runtime import kernel_exit

    done = []

    class Kernel:
        def do_shutdown(self, restart):
            done.append(("kernel", restart))
            return {"status": "ok", "restart": restart}

    class Helper:
        def __init__(self, name):
            self.name, self._forkserver_pid = name, None

        def _stop(self):
            done.append(self.name)

    kernel = Kernel()
    monkeypatch.setattr(IPython, "get_ipython", lambda: types.SimpleNamespace(kernel=kernel))
    monkeypatch.setattr(forkserver, "_forkserver", Helper("fork server"))
    monkeypatch.setattr(resource_tracker, "_resource_tracker", Helper("tracker"))
    monkeypatch.setattr(kernel_exit, "_CLOSERS", [lambda: done.append("clusters")])
    assert kernel_exit.install() and kernel_exit.install()  # wrapped once, however often asked
    assert kernel.do_shutdown(True) == {"status": "ok", "restart": True}
    assert done == ["clusters", "fork server", "tracker", ("kernel", True)]
    monkeypatch.setattr(IPython, "get_ipython", lambda: None)  # a script, or IPython in a terminal
    assert not kernel_exit.install()
