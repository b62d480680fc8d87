"""The runtime from a real Jupyter kernel: a function defined in a cell runs on real ranks, and its
traceback names the cell and quotes the learner's line, as IPython does for local errors."""

import queue
import time

import pytest

pytestmark = [pytest.mark.ch0, pytest.mark.slow]  # starts a Jupyter kernel

CELLS = [
    "import torch, torch.distributed as dist\nfrom lesson_lib import Cluster\n"
    "cluster = Cluster(world_size=2, quiet=True)",
    "def my_all_reduce(t):\n    dist.all_reduce(t)\n    return t\n"
    "print(cluster.run(my_all_reduce, torch.ones(2)))",
    "def my_all_reduce(t):   # redefined: the next run uses this one\n    return t * 0\n"
    "print(cluster.run(my_all_reduce, torch.ones(2)))",
    "def broken(t):\n    if dist.get_rank() == 1:\n        t = t + undefined_name  # learner's typo\n"
    "    return t\ncluster.run(broken, torch.ones(1))",
    "print(cluster.run(lambda: dist.get_rank()))\ncluster.close()",
]


def _execute(kc, code: str, timeout: float = 120) -> tuple[str, list[str]]:
    msg_id = kc.execute(code)
    out, err = [], []
    while True:
        try:
            msg = kc.get_iopub_msg(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no answer from the kernel for {code!r}") from None
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            out.append(content["text"])
        elif kind == "error":
            err += content["traceback"]
        elif kind == "status" and content["execution_state"] == "idle":
            return "".join(out), err


def test_a_cell_function_runs_on_real_ranks_and_its_traceback_names_the_cell():
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        outs = [_execute(kc, cell) for cell in CELLS]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert outs[0] == ("", [])
    assert outs[1] == ("[tensor([2., 2.]), tensor([2., 2.])]\n", [])
    assert outs[2] == ("[tensor([0., 0.]), tensor([0., 0.])]\n", [])
    text = "\n".join(outs[3][1])
    assert "WorkerError: rank 1: NameError: name 'undefined_name' is not defined" in text, text
    assert "Cell In[4], line 3" in text and "t = t + undefined_name  # learner's typo" in text, text
    assert "multiprocessing" not in text and "lesson_lib/runtime/" not in text, text
    assert outs[4] == ("[0, 1]\n", [])


# ipykernel's shutdown SIGTERMs the children in its process group and waits, 0.01 s up to 10 s at a
# time, until none is left, then does the same with SIGKILL: 28.9 s of waits in all. A fork server
# that died unreaped, or a resource tracker (which ignores SIGTERM), kept it waiting to the end.
IPYKERNEL_LADDER_S = 2 * (0.01 + 0.03 + 0.1 + 0.3 + 1 + 3 + 10)


def test_a_kernel_with_warm_ranks_shuts_down_at_once_and_closes_them():
    import os

    import psutil
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    km.shutdown_wait_time = 4 * IPYKERNEL_LADDER_S  # never cut short here: the kernel's own time
    try:
        out, err = _execute(kc, "import os, torch\nfrom lesson_lib.runtime import warm_cluster\n"
                                "c = warm_cluster(2)\nprint('ranks', *c.pids(), c._tmp)")
        assert not err, err
        *ranks, folder = next(line for line in out.splitlines() if line.startswith("ranks ")).split()[1:]
        ranks = [int(p) for p in ranks]
        started = time.monotonic()
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    took = time.monotonic() - started
    assert took < IPYKERNEL_LADDER_S / 2, f"the kernel took {took:.1f} s to shut down: ipykernel waited"
    assert not os.path.exists(folder), f"the cluster's folder {folder} was left: its close never ran"
    for pid in ranks:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid
