"""Chapter 9 §5: chapter 7's cost model with FP8 (:mod:`lesson_lib.costmodel.fp8`), a 70B model on
H100s priced on H100's own links (InfiniBand NDR between nodes, NVLink 4 inside one). Every
assumption is printed, with the answer it flips to."""

from __future__ import annotations

from IPython.display import display

from .. import plots
from ..costmodel import Plan
from ..costmodel.fp8 import STATE_BYTES, fp8_step, matmul_share_for

# NeMo's performance summary (NVIDIA, 2024): Nemotron-4 340B on H100s, FP8 steps 0.69–0.72 of bf16's.
NEMO_340B_STEP_RATIO = (0.69, 0.72)
SHARES = [k / 100 for k in range(101)]


def _plan(n: int, params: float, overlap: float, link: str, intra: str) -> Plan:
    return Plan(params=params, tokens=1.4e12, devices=n, device="h100-sxm", tensor=8, zero=3, micro_batch=0,
                overlap=overlap, link=link, intra_link=intra)


def flip_share(plan: Plan, recipe: str = "tensorwise") -> float | None:
    """The smallest matmul share (in steps of 0.01) at which FP8's largest term is no longer compute;
    None if compute stays the largest at every share."""
    return next((s for s in SHARES if fp8_step(plan, s, recipe)["fp8"]["dominant"] != "compute"), None)


def at_scale(devices_list=(1024, 1536), params: float = 70e9, overlap: float = 0.0) -> dict:
    """§5: bf16 against FP8 with only the matmul share s sped up (s from NeMo's measured step ratio,
    and s = 1, the datasheet's bound), on H100's links; where the dominant term would flip."""
    lo, hi = (matmul_share_for(r) for r in reversed(NEMO_340B_STEP_RATIO))
    share = round((lo + hi) / 2, 2)
    print(f"assumed: overlap {overlap:g} (none of the data-parallel traffic hidden), tensorwise scaling "
          f"(weights gathered in FP8), links ib-ndr between nodes and nvlink4 inside one (H100's)\n"
          f"assumed: the share s of bf16 compute that FP8 speeds up 1979/989 = {1979 / 989:.2f}×; the rest "
          f"(attention, norms, embedding, head, the casts) unchanged.\n"
          f"  NeMo's measured FP8 step at {NEMO_340B_STEP_RATIO[0]}–{NEMO_340B_STEP_RATIO[1]} of bf16's "
          f"(340B) is s = {lo:.2f}–{hi:.2f} if the step were all compute; s = {share} here, and s = 1 "
          "(every FLOP at the FP8 peak) as the bound\n")
    rows = []
    for n in devices_list:
        plan = _plan(n, params, overlap, "ib-ndr", "nvlink4")
        for label, s in (("bf16", None), (f"fp8, s = {share}", share), ("fp8, s = 1", 1.0)):
            out = fp8_step(plan, s or 0.0)
            t = out["bf16" if s is None else "fp8"]
            rows.append({"label": f"{n} GPUs, {label}", "devices": n, "share": s,
                         "terms": {k: t[k] for k in ("compute", "bandwidth", "latency", "tensor")},
                         "step": t["step"], "dominant": t["dominant"]})
    print(f"{'plan':<24}{'compute s':>10}{'bandwidth s':>12}{'latency s':>10}{'tensor s':>9}{'step s':>8}"
          f"{'× bf16':>8}  dominant")
    base = {r["devices"]: r["step"] for r in rows if r["share"] is None}
    for r in rows:
        t = r["terms"]
        print(f"{r['label']:<24}{t['compute']:>10.2f}{t['bandwidth']:>12.2f}{t['latency']:>10.2f}"
              f"{t['tensor']:>9.2f}{r['step']:>8.2f}{base[r['devices']] / r['step']:>8.2f}  {r['dominant']}")
    n = devices_list[-1]
    flips = {(link, ov): flip_share(_plan(n, params, ov, link, intra))
             for link, intra in (("ib-ndr", "nvlink4"), ("ib-hdr", "nvlink3")) for ov in (0.0, 1.0)}
    print(f"\nwhere the answer flips, at {n} GPUs: the smallest s at which FP8's largest term is no longer "
          "compute")
    for (link, ov), s in flips.items():
        said = f"s ≥ {s:.2f}" if s is not None else "never (compute stays largest)"
        print(f"  {link:<7} overlap {ov:g}: {said}")
    rowwise = fp8_step(_plan(n, params, overlap, "ib-ndr", "nvlink4"), share, "rowwise")["fp8"]
    print(f"with row-wise scaling the weights travel in bf16 (torchao gathers FP8 only for tensorwise): "
          f"bandwidth {rowwise['bandwidth']:.2f} s at {n} GPUs, s = {share}")
    print("\nbytes per parameter that FP8 does not shrink:")
    for name, b in STATE_BYTES.items():
        print(f"  {name:<36}" + ", ".join(f"{k} {v}" for k, v in b.items()) + f" = {sum(b.values())}")
    display(plots.fp8.terms(rows, f"A 70B model's step on H100s (NDR, overlap {overlap:g}): only the matmuls "
                                  "speed up"))
    return {"rows": rows, "share": share, "share_range": (lo, hi), "flips": flips, "rowwise": rowwise}
