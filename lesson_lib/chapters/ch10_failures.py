"""Chapter 10 §1: what failures cost. A checkpoint measured three ways on real ranks (blocking DCP,
``dcp.async_save``, a copy into a peer's memory), then the goodput model with the checkpoint's cost δ
and the restart's cost R taken apart, priced at Llama 3's storage rate and failure count; every
assumption printed with the answer it flips to."""

from __future__ import annotations

from IPython.display import display

from .. import plots
from ..costmodel import days_from_throughput
from ..milestones.resilience import failures
from ..runtime import warm_cluster

# Llama 3 (Dubey et al., 2024, §3.3.1): Tectonic storage sustains 2 TB/s (peak 7 TB/s).
LLAMA3_STORAGE_BPS = 2e12
STATE_BYTES_PER_PARAM = 16  # bf16 weights and gradients, fp32 master weights and Adam's two moments
RESTARTS_S = (30.0, 180.0, 600.0)  # assumed: the report gives no restart time


def _bisect(f, lo: float, hi: float) -> float:
    """The x in [lo, hi] where the decreasing f crosses 0 (40 halvings)."""
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) > 0 else (lo, mid)
    return lo


def failure_cost(world_size: int = 2, numel: int = 1_000_000) -> dict:
    """§1: δ measured here three ways; Llama 3 405B's δ at its storage's rate; goodput and its waste
    by cause for each assumed restart R; the R at which restarts outweigh checkpoints; the δ beyond
    which no R reaches Llama 3's 90 %."""
    save = failures.measure_save(warm_cluster(world_size), numel)
    L = failures.LLAMA3
    med = save["median_s"]
    print(f"a checkpoint of {numel:,} parameters + momentum per rank on {world_size} ranks "
          f"({save['bytes'] / 1e6:.1f} MB written): the training loop stops for")
    for name in ("blocking dcp.save", "dcp.async_save", "copy to a peer"):
        print(f"  {name:<18} {med[name] * 1e3:>7.1f} ms")
    print(f"  (the async save's write finished {med['written_s'] * 1e3:.1f} ms after it began; read back "
          f"bit-equal: {save['async_equal']}; the peers' copies bit-equal: {save['peer_equal']})")
    device_mtbf = failures.device_mtbf_from(L["unexpected"], L["gpus"], L["days"] * 24)
    m = failures.job_mtbf_h(device_mtbf, L["gpus"]) * 3600
    ckpt = STATE_BYTES_PER_PARAM * L["params"]
    delta = ckpt / LLAMA3_STORAGE_BPS
    print(f"\nLlama 3: {L['unexpected']} unexpected interruptions in {L['days']} days on {L['gpus']:,} "
          f"GPUs → one GPU fails every {device_mtbf:,.0f} h; the job every {m / 3600:.1f} h\n"
          f"its full state, {STATE_BYTES_PER_PARAM} bytes × 405B = {ckpt / 1e12:.2f} TB, at its storage's "
          f"sustained 2 TB/s: δ = {delta:.1f} s if it blocks (an async save stalls only to copy to host)\n"
          f"assumed: restart R (the report gives none); checkpoint at Young's τ = √(2δM)\n")
    print(f"{'R':>7} {'τ':>8} {'goodput':>8}   waste: {'checkpoints':>11} {'lost work':>10} {'restarts':>9}")
    rows = []
    for r in RESTARTS_S:
        tau = failures.young(delta, m)
        w = failures.waste(tau, delta, m, r)
        rows.append({"restart_s": r, "tau_s": tau, "goodput": failures.goodput(tau, delta, m, r), "waste": w})
        print(f"{r / 60:>6.1f}m {tau / 60:>7.1f}m {rows[-1]['goodput']:>8.1%}   {'':>6}"
              f"{w['checkpoints']:>11.2%} {w['lost work']:>10.2%} {w['restarts']:>9.2%}")
    tau = failures.young(delta, m)
    w = failures.waste(tau, delta, m, 0.0)
    r_even = m * (w["checkpoints"] + w["lost work"])  # restarts' share = checkpoints' + lost work's
    need = 0.90
    r_90 = _bisect(lambda r: failures.goodput(failures.young(delta, m), delta, m, r) - need, 0.0, m)
    delta_max = _bisect(lambda d: failures.goodput(failures.young(d, m), d, m, 0.0) - need, 0.0, m)
    print(f"\nonce δ is seconds the restart dominates: restarts waste more than checkpoints and lost work "
          f"together for any R above {r_even / 60:.1f} min (the answer flips below it)\n"
          f"Llama 3's over {need:.0%} holds for any R under {r_90 / 60:.1f} min at δ = {delta:.1f} s; with "
          f"δ above {delta_max:.0f} s no restart, however fast, reaches it")
    table = []
    for n in (8, 512, 16_384, 131_072):
        mn = failures.job_mtbf_h(device_mtbf, n) * 3600
        t = failures.young(delta, mn)
        table.append({"devices": n, "mtbf_h": mn / 3600, "young_s": t, "daly_s": failures.daly(delta, mn),
                      "goodput": failures.goodput(t, delta, mn, RESTARTS_S[-1])})
    print(f"\n{'devices':>8} {'job MTBF':>10} {'Young τ':>9} {'Daly τ':>9} {'goodput':>8}   "
          f"(δ = {delta:.1f} s, R = {RESTARTS_S[-1] / 60:.0f} min)")
    for r in table:
        print(f"{r['devices']:>8,} {r['mtbf_h']:>9,.1f}h {r['young_s'] / 60:>8.1f}m "
              f"{r['daly_s'] / 60:>8.1f}m {r['goodput']:>8.1%}")
    days = days_from_throughput(L["tokens"], L["params"], L["gpus"], 400e12, flops_per_token_per_param=6)
    run = failures.days_with_failures(days, L["gpus"], device_mtbf, delta, RESTARTS_S[-1])
    print(f"\nchapter 7's 6·T·Ψ/(n·X) at 400 TFLOP/s per GPU: {days:.0f} days without failures, "
          f"{run['days']:.0f} with them (δ = {delta:.1f} s, R = 10 min)")
    curve = [{"tau_s": t, "goodput": failures.goodput(t, delta, m, RESTARTS_S[-1])}
             for t in [10 * 1.15 ** k for k in range(50)]]
    marks = {name: (t, failures.goodput(t, delta, m, RESTARTS_S[-1]))
             for name, t in (("Young", failures.young(delta, m)), ("Daly", failures.daly(delta, m)))}
    display(plots.resilience.goodput_curve(
        curve, marks, f"{L['gpus']:,} GPUs failing every {m / 3600:.1f} h, δ = {delta:.1f} s, R = 10 min: "
                      "too rare loses work, too often loses time"))
    return {"save": save, "device_mtbf_h": device_mtbf, "mtbf_s": m, "delta_s": delta, "rows": rows,
            "r_even_s": r_even, "r_90_s": r_90, "delta_max_s": delta_max, "table": table, "llama3": run,
            "days": days}


def calculator(device_mtbf_h: float):
    """§1: devices, checkpoint cost and restart cost → the job's MTBF, Young's interval and goodput."""
    import ipywidgets as W

    n = W.Dropdown(options=[8, 64, 512, 4096, 16_384, 65_536, 131_072], value=16_384, description="devices")
    delta = W.Dropdown(options=[("1 s", 1), ("5 s", 5), ("30 s", 30), ("1 min", 60), ("10 min", 600)],
                       value=5, description="checkpoint δ")
    restart = W.Dropdown(options=[("30 s", 30), ("3 min", 180), ("10 min", 600), ("30 min", 1800)], value=180,
                         description="restart R")
    out = W.HTML()

    def update(*_):
        m = failures.job_mtbf_h(device_mtbf_h, n.value) * 3600
        tau = failures.young(delta.value, m)
        g = failures.goodput(tau, delta.value, m, restart.value)
        w = failures.waste(tau, delta.value, m, restart.value)
        out.value = (f"a failure every <b>{m / 3600:,.1f} h</b>; checkpoint every <b>{tau / 60:,.1f} min</b> "
                     f"(Young; Daly {failures.daly(delta.value, m) / 60:,.1f} min); goodput <b>{g:.1%}</b>; "
                     f"waste: checkpoints {w['checkpoints']:.1%}, lost work {w['lost work']:.1%}, restarts "
                     f"{w['restarts']:.1%}")

    for w in (n, delta, restart):
        w.observe(update, "value")
    update()
    return W.VBox([n, delta, restart, out])

