"""What one learner holds after a walk through the whole course: one kernel per chapter, as JupyterLab
starts them (jupyter_client), every code cell of every chapter run in order, all kernels left open.

    python benchmarks/learner_memory.py --idle off      # warm clusters kept for each kernel's life
    python benchmarks/learner_memory.py                 # the default: idle clusters are released

Prints, and with --json writes, the memory of every kernel's process tree (the kernel, its fork
server and ranks): PSS (shared pages split between the processes that share them, so the sum is
what the machine gives) and RSS, at the end of the walk and again after --wait seconds. Record a run
in benchmarks/learner-memory.md.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time

import psutil
from jupyter_client.manager import KernelManager


def tree_memory(pid: int) -> dict:
    """PSS and RSS in bytes of ``pid`` and every process below it, and how many there are."""
    procs = [psutil.Process(pid)]
    procs += procs[0].children(recursive=True)
    pss = rss = 0
    for p in procs:
        try:
            full = p.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        pss += getattr(full, "pss", full.uss)
        rss += full.rss
    return {"pss": pss, "rss": rss, "processes": len(procs)}


def run_chapter(path: str, env: dict, timeout_s: float) -> tuple[KernelManager, float, list[str]]:
    """Start a kernel as JupyterLab would and run every code cell of ``path`` in it (left running)."""
    with open(path, encoding="utf-8") as f:
        nb = json.load(f)
    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=os.path.dirname(os.path.abspath(path)), env=env)
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=120)
    errors, t0 = [], time.monotonic()

    def hook(msg):
        if msg["msg_type"] == "error":
            errors.append(f"{msg['content']['ename']}: {msg['content']['evalue']}"[:300])

    for cell in nb["cells"]:
        if cell["cell_type"] == "code" and "".join(cell["source"]).strip():
            kc.execute_interactive("".join(cell["source"]), timeout=timeout_s, output_hook=hook)
            if errors:
                break
    kc.stop_channels()
    return km, time.monotonic() - t0, errors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--idle", default=None, help="LESSON_LIB_IDLE_S for the kernels (default: unset)")
    ap.add_argument("--wait", type=float, default=45.0, help="seconds to wait before measuring again")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds a cell may take")
    ap.add_argument("--json", help="write the measurements here")
    args = ap.parse_args()
    env = {**os.environ}
    if args.idle is not None:
        env["LESSON_LIB_IDLE_S"] = args.idle
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    chapters = sorted(glob.glob(os.path.join(root, "notebooks", "[0-9]*.ipynb")))
    kernels, rows = [], []
    try:
        for path in chapters:
            km, took, errors = run_chapter(path, env, args.timeout)
            kernels.append((os.path.basename(path), km))
            rows.append({"chapter": os.path.basename(path), "run_s": round(took, 1), "errors": errors})
            print(f"{os.path.basename(path):<34} ran in {took:6.1f} s"
                  + (f"  ERRORS: {errors}" if errors else ""), flush=True)
        snapshots = {}
        for label, delay in (("end of the walk", 0.0), (f"{args.wait:g} s later", args.wait)):
            time.sleep(delay)
            per = {name: tree_memory(km.provisioner.process.pid) for name, km in kernels}
            snapshots[label] = per
            total = {k: sum(m[k] for m in per.values()) for k in ("pss", "rss", "processes")}
            print(f"\n{label}: {total['pss'] / 1e9:.2f} GB PSS ({total['rss'] / 1e9:.2f} GB RSS) in "
                  f"{total['processes']} processes")
            for name, m in per.items():
                print(f"  {name:<34} {m['pss'] / 1e9:5.2f} GB PSS  {m['processes']:>2} processes")
    finally:
        for _, km in kernels:
            km.shutdown_kernel(now=True)
    out = {"date": time.strftime("%Y-%m-%d"), "nproc": os.cpu_count(), "idle": args.idle,
           "load_1min": os.getloadavg()[0], "chapters": rows, "snapshots": snapshots}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
