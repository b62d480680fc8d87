"""The runtime from a real Jupyter kernel: a function defined in a cell runs on real ranks, and its
traceback names the cell and quotes the learner's line, as IPython does for local errors."""

import queue

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
