"""Elastic restarts with ``torchrun`` (chapter 10 §2, "fault tolerance in practice"): a job of 2
workers on this machine, rendezvous on 127.0.0.1, one worker crashing once; ``--max-restarts``
restarts every worker and each resumes from the last checkpoint; ``--nnodes MIN:MAX`` lets the job
start with as few as MIN machines. :func:`run` launches it; :func:`worker` is what each process runs
(``python -m lesson_lib.milestones.resilience.elastic`` under torchrun). The workers' process group
meets in a fresh FileStore per attempt: with torchrun's env:// store, the restarted workers here
sometimes failed to connect Gloo to each other (connection refused) on a loaded 2-core machine."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist


def worker(folder: str, steps: int, crash_at: int) -> None:
    """One worker: resume from ``folder``'s checkpoint if there is one, then per step all-reduce a
    gradient (each rank's is rank + 1) and take an SGD step of lr 0.1, checkpointing after each. On
    torchrun's first attempt rank 1 crashes at step ``crash_at``, before the exchange."""
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])  # 0, then 1 after torchrun's restart
    store = os.path.join(folder, f"store{attempt}")  # each attempt its own keys, nothing stale
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
    rank = dist.get_rank()
    path = os.path.join(folder, "checkpoint.pt")
    state = torch.load(path) if os.path.exists(path) else {"step": 0, "w": torch.zeros(4)}
    ran = []
    for step in range(state["step"], steps):
        if attempt == 0 and rank == 1 and step == crash_at:
            os._exit(1)  # a crash: torchrun stops every worker and starts them all again
        grad = torch.full((4,), float(rank + 1))
        dist.all_reduce(grad)
        state = {"step": step + 1, "w": state["w"] - 0.1 * grad / dist.get_world_size()}
        dist.barrier()
        if rank == 0:
            torch.save(state, path + ".tmp")
            os.replace(path + ".tmp", path)  # whole or not at all
        dist.barrier()
        ran.append(step)
    with open(os.path.join(folder, f"attempt{attempt}_rank{rank}.json"), "w") as f:
        json.dump({"attempt": attempt, "rank": rank, "ran": ran, "w": state["w"].tolist()}, f)
    dist.destroy_process_group()


def run(steps: int = 6, crash_at: int = 3, max_restarts: int = 1, nnodes: str = "1:2",
        timeout_s: float = 120.0) -> dict:
    """``torchrun --nnodes MIN:MAX --max-restarts K`` with 2 workers on this machine; returns each
    attempt's steps per rank, the final weights, torchrun's exit code and the command."""
    folder = tempfile.mkdtemp(prefix=f"lesson_lib_ch10_{os.getpid()}_elastic_")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", "--nproc-per-node=2",
           f"--max-restarts={max_restarts}", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0",
           "--rdzv-conf=last_call_timeout=1", "--local-addr=127.0.0.1", "--monitor-interval=0.1",
           "-m", __name__, folder, str(steps), str(crash_at)]
    try:  # the folder goes whatever happens: an interrupt, a crash reading the attempts
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                # torchrun's own log folders (torchelastic_*) land in ours, and go with it
                                env={**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": folder})
        try:
            log, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:  # torchrun and every worker it started (they hold our pipe too)
            import psutil

            tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            for p in tree:
                with contextlib.suppress(psutil.Error):
                    p.kill()
            log, _ = proc.communicate()
        runs = []
        for name in sorted(os.listdir(folder)):
            if name.startswith("attempt"):
                with open(os.path.join(folder, name)) as f:
                    runs.append(json.load(f))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {"returncode": proc.returncode, "runs": runs, "wall_s": time.perf_counter() - t0,
            "command": " ".join(["torchrun", *cmd[3:]]), "log": log}


if __name__ == "__main__":
    worker(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
