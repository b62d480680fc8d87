"""How many learners a workshop server holds: each chapter run by 1, 2 and 3 learners at once.

    python benchmarks/capacity.py > benchmarks/capacity.md              # every chapter: 42 min on 2 cores
    python benchmarks/capacity.py --chapters 00 02 04 > capacity.md    # some of them

Each learner is a kernel started as JupyterLab starts one (jupyter_client) that runs every code cell
of the chapter, with the share the workshop hub gives it: ``CPU_LIMIT`` = cores / learners (at least
1), so each learner's ranks plan with their share of the cores. Measured per chapter and number of
learners: the slowest learner's Run All (wall clock), its slowdown against one learner alone, and the
peak memory of all learners' process trees together (PSS, sampled every 0.5 s), per learner.
From these: learners per core and per GB at that slowdown. Times depend on the machine and its
load; bytes do not.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import threading
import time
from pathlib import Path

import psutil
from jupyter_client.manager import KernelManager

ROOT = Path(__file__).resolve().parent.parent


def _run(path: str, env: dict, out: dict, key: int, kernels: list) -> None:
    with open(path, encoding="utf-8") as f:
        nb = json.load(f)
    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=os.path.dirname(path), env=env)
    kernels.append(km)
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=180)
    errors, t0 = [], time.monotonic()

    def hook(msg):
        if msg["msg_type"] == "error":
            errors.append(msg["content"]["ename"])

    for cell in nb["cells"]:
        if cell["cell_type"] == "code" and "".join(cell["source"]).strip():
            kc.execute_interactive("".join(cell["source"]), timeout=900, output_hook=hook)
    out[key] = {"run_s": time.monotonic() - t0, "errors": errors}
    kc.stop_channels()


def _pss(kernels: list) -> int:
    total = 0
    for km in kernels:
        try:
            procs = [psutil.Process(km.provisioner.process.pid)]
            procs += procs[0].children(recursive=True)
        except (psutil.Error, AttributeError):
            continue
        for p in procs:
            try:
                total += p.memory_full_info().pss
            except psutil.Error:
                pass
    return total


def measure(path: str, learners: int) -> dict:
    cores = os.cpu_count() or 1
    env = {**os.environ, "CPU_LIMIT": str(max(1, cores // learners))}
    out, kernels, peak = {}, [], 0
    threads = [threading.Thread(target=_run, args=(path, env, out, i, kernels)) for i in range(learners)]
    for t in threads:
        t.start()
    try:
        while any(t.is_alive() for t in threads):
            peak = max(peak, _pss(kernels))
            time.sleep(0.5)
    finally:
        for t in threads:
            t.join()
        for km in kernels:
            km.shutdown_kernel(now=True)
    return {"learners": learners, "slowest_s": max(r["run_s"] for r in out.values()),
            "errors": sorted({e for r in out.values() for e in r["errors"]}), "peak_pss": peak,
            "cpu_limit": env["CPU_LIMIT"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chapters", nargs="*", default=None, help="two-digit chapter numbers (default: all)")
    ap.add_argument("--learners", nargs="*", type=int, default=[1, 2, 3])
    ap.add_argument("--slowdown", type=float, default=2.0, help="the slowdown a learner accepts")
    ap.add_argument("--json", help="write the measurements here too")
    args = ap.parse_args()
    paths = sorted(glob.glob(str(ROOT / "notebooks" / "[0-9][0-9]_*.ipynb")))
    if args.chapters:
        paths = [p for p in paths if os.path.basename(p)[:2] in args.chapters]
    cores, mem = os.cpu_count(), psutil.virtual_memory().total
    load0 = os.getloadavg()[0]
    rows = {}
    for path in paths:
        rows[os.path.basename(path)] = [measure(path, n) for n in args.learners]
    print("# Workshop capacity: learners per core and per GB, chapter by chapter\n")
    chapters = f"--chapters {' '.join(args.chapters)} " if args.chapters else ""
    print(f"Generated on {time.strftime('%Y-%m-%d')} by `python benchmarks/capacity.py "
          f"{chapters}--slowdown {args.slowdown:g}` on {cores} cores "
          f"and {mem / 2**30:.0f} GiB (1-minute load {load0:.1f} before it began; "
          f"{os.getloadavg()[0]:.1f} at the end). Each learner a kernel running every code cell, with "
          "CPU_LIMIT = cores / learners; "
          "*slowest* is the last learner's Run All; memory the peak PSS of all learners' kernels and ranks "
          "together, per learner.\n")
    print(f"| chapter | learners | CPU_LIMIT | slowest Run All (s) | slowdown | peak GB per learner | "
          f"learners per core at ≤ {args.slowdown:g}× | learners per GB | errors |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for name, ms in rows.items():
        alone = ms[0]["slowest_s"]
        for m in ms:
            slow = m["slowest_s"] / alone
            per_learner = m["peak_pss"] / m["learners"] / 1e9
            fits = f"{m['learners'] / cores:.1f}" if slow <= args.slowdown else "–"
            print(f"| {name[:-6]} | {m['learners']} | {m['cpu_limit']} | {m['slowest_s']:.1f} | "
                  f"{slow:.2f}× | {per_learner:.2f} | {fits} | {1 / per_learner:.1f} | "
                  f"{', '.join(m['errors']) or 'none'} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
