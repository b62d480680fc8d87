"""Checks of the NCCL/CUDA path, run by tests/gpu/run.sh on a machine with a GPU.

One GPU means NCCL worlds of one rank; larger worlds fall back to Gloo on CPU (checked here too).
"""

import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # tests/probes.py
import probes

from lesson_lib import Cluster, run
from lesson_lib.milestones import data_parallel as dp
from lesson_lib.milestones import zero
from lesson_lib.peakmem import PeakMemory
from lesson_lib.runtime import choose_placement


def main(out: str) -> int:
    report, ok = {}, True
    gpus = torch.cuda.device_count()
    report["gpus"] = gpus
    assert gpus >= 1, "no GPU visible"
    report["placement_1"] = choose_placement(1).reason
    report["placement_over"] = choose_placement(gpus + 1).reason
    ok &= choose_placement(1).backend == "nccl" and choose_placement(gpus + 1).backend == "gloo"
    with Cluster(1, backend="nccl") as c:
        report["whoami"] = c.run(probes.whoami)
        ok &= report["whoami"][0]["device"] == "cuda:0"
        report["nccl_all_reduce"] = c.run(probes.library_all_reduce, 1024)
        cfg = dp.Config(world_size=1, backend="nccl", steps=10, hidden=1024)
        r = run("data-parallel", cfg, cluster=c)
        z = run("zero", zero.Config(world_size=1, backend="nccl", stage=3, precision="mixed", steps=5,
                                    hidden=1024, peak_memory=True), cluster=c)
    zm = z.per_rank[0]["memory"]
    report["zero3_memory"], report["zero3_formula"] = zm, z["formula"]
    ok &= all(abs(zm[k] / z["formula"][k] - 1) < 0.05 for k in ("params", "grads", "optimizer"))
    ok &= zm["cuda_peak"] > 0
    # the measured peak (lesson_lib.peakmem) on CUDA: the allocator's own peak, above the inventory
    ok &= zm["measured_method"].startswith("CUDA") and \
        zm["measured_peak"] >= zm["params"] + zm["grads"] + zm["optimizer"]
    dev = torch.device("cuda:0")
    with PeakMemory(dev) as peak:
        peak.reset_peak()
        t = torch.ones(16 * 2**20, device=dev)  # 64 MiB, a multiple of the allocator's blocks
        del t
    report["peakmem_64MiB"] = peak.as_dict()
    ok &= peak.peak == 64 * 2**20
    ref = dp.reference(dp.Config(world_size=1, steps=10, hidden=1024))
    gap = max(abs(a - b) for a, b in zip(r.losses, ref))
    mem = r.per_rank[0]["memory"]
    report.update(losses=r.losses, cpu_reference=ref, max_gap_vs_cpu=gap, memory=mem,
                  step_ms=[1e3 * t for t in r.step_times()])
    psi = r["param_count"]
    ok &= mem["params"] == 4 * psi and mem["grads"] == 4 * psi
    ok &= "cuda_allocated" in mem and mem["cuda_peak"] >= mem["params"] + mem["grads"] + mem["optimizer"]
    ok &= gap < 1e-3  # GPU vs CPU kernels: rounding differs, the trajectory must not
    report["ok"] = bool(ok)
    with open(f"{out}/gpu_report.json", "w") as f:
        json.dump(report, f, indent=1, default=str)
    print(json.dumps({k: report[k] for k in ("gpus", "placement_1", "placement_over", "max_gap_vs_cpu",
                                             "memory", "ok")}, indent=1, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
