"""Chapter 7 — putting it all together (notebooks/07_impact.ipynb).

The talk's chart from the cost model (:mod:`lesson_lib.costmodel`), a what-if calculator, and the
measured dashboard: one model through every milestone on real ranks
(:mod:`lesson_lib.milestones.impact`), with the cost model's predictions beside the measurements.
"""

from __future__ import annotations

from IPython.display import display

from .. import costmodel, plots
from ..costmodel import claims
from ..experiments import Result, run_warm
from ..milestones import impact
from .ch07_exercises import exercises
from .ch07_published import (
    CHAPTER_RUNS,
    LACKS,
    TORCHTITAN_8B,
    efficiency_curve,
    every_run,
    new_held_out,
    published_check,
    torchtitan_llama3_8b,
    weak_scaling,
)

# The talk's named model on a named cluster: GPT-3 (Brown et al., 2020: 175B parameters, 300B
# tokens) on 1,024 A100s with one HDR InfiniBand port each, as Narayanan et al. (SC21) trained it.
GPT3 = {"params": 175e9, "tokens": 300e9, "devices": 1024, "device": "a100-80gb", "link": "ib-hdr"}

__all__ = ["CHAPTER_RUNS", "GPT3", "LACKS", "OVERLAPS", "TORCHTITAN_8B", "compression_bound", "conclusions",
           "torchtitan_llama3_8b", "efficiency_curve", "every_run", "exercises", "new_held_out",
           "weak_scaling",
           "lamb_microbatches", "measured", "months_to_days", "ps_sharding", "published_check", "run_impact",
           "talk_chart", "table", "validation_table", "what_if"]
# The chart's two bounds on overlap: nothing hidden, and everything that compute can cover hidden
# (chapters 0 and 4 measure buckets and prefetch hiding part of it, on this machine).
OVERLAPS = (0.0, 1.0)


def talk_chart(names=costmodel.MILESTONES, overlaps=OVERLAPS, **overrides) -> dict[float, list[dict]]:
    """Every milestone for GPT-3 (or ``overrides``) on the named cluster, once per overlap: the figure
    (paired bars), one table per overlap, and {overlap: rows}."""
    job = {**GPT3, **overrides}
    options = {k: v for k, v in job.items() if k not in ("params", "tokens", "devices")}
    by = claims.chart(job["params"], job["tokens"], job["devices"], overlaps, names=names, **options)
    rows = by[overlaps[0]]
    dev = costmodel.devices()[job["device"]]["name"]
    title = (f"{job['params']:.3g} parameters, {job['tokens']:.3g} tokens on {job['devices']:,} × {dev}: "
             "modelled time and memory per device, milestone by milestone, with no and with full overlap")
    notes = costmodel.assumptions(rows[0]["plan"])  # what every bar shares, then what each adds
    for r in rows[1:]:
        notes += [a for a in costmodel.assumptions(r["plan"])
                  if a not in notes and "tokens per step" not in a]
    notes = [a for a in notes if "hidden behind compute" not in a] + [
        "overlap: " + " and ".join(f"{ov:.0%}" for ov in overlaps) + " of the data-parallel communication "
        "hidden behind compute (at most the compute's own time; chapters 0 and 4 measure buckets and "
        "prefetch hiding it); pipeline messages never hidden; the chart has no tensor parallelism (t = 1)",
        "pipeline: the fewest stages (dividing the devices) at which the model fits; "
        "ps-sharded: as many server machines as workers; lamb and compression build on ZeRO-3"]
    display(plots.impact.talk_chart(by, title, notes))
    for ov in overlaps:
        print(f"overlap {ov:g}:\n{costmodel.table(by[ov])}")
    return by


def conclusions(by_overlap: dict[float, list[dict]]) -> list[dict]:
    """Which of the chart's conclusions hold at every overlap, which flip: printed, and returned."""
    rows = claims.conclusions(by_overlap)
    print(claims.conclusions_table(rows))
    return rows


def compression_bound(extra_steps=(0.0, 0.05, 0.1, 0.25), **overrides) -> dict:
    """The compression bar's days at several assumed shares of extra steps, beside LAMB's, at each
    overlap; where it stops beating LAMB; and the N from which all-gathered top-k 1 % (chapter 6)
    sends more bytes than the uncompressed ring."""
    from ..milestones import compression

    job = {**GPT3, **overrides}
    options = {k: v for k, v in job.items() if k not in ("params", "tokens", "devices")}
    out = claims.compression_days(job["params"], job["tokens"], job["devices"], extra_steps, OVERLAPS,
                                  **options)
    print(f"{'overlap':>8} {'extra steps':>12} {'compression days':>17} {'lamb days':>10}")
    for r in out["rows"]:
        print(f"{r['overlap']:>8g} {r['extra_steps']:>12.0%} {r['days']:>17.1f} {r['lamb_days']:>10.1f}")
    for ov, e in out["break_even_extra_steps"].items():
        print(f"overlap {ov:g}: compression stops beating LAMB at {e:.1%} more steps")
    numel = 10**6  # top-k 1 %: k (int32 index, fp32 value) pairs all-gathered, against a fp32 ring
    even = compression.all_gather_break_even(8 * numel // 100, numel)
    d = out["d"] = costmodel.plan_for("compression", job["params"], job["tokens"], job["devices"],
                                      **options).data_parallel
    ratio = (d - 1) * 8 * numel / 100 / compression.ring_busiest_bytes(numel, 4, d)
    print(f"all-gathered top-k 1 % (chapter 6) stops saving bytes at N = {even}; at the chart's "
          f"N = {d:,} it sends {ratio:.1f}× the uncompressed ring's bytes")
    out.update(topk_break_even=even, topk_ratio_at_d=ratio)
    return out


def months_to_days(**overrides) -> dict:
    """"From months to days", in the chart's own numbers (printed, and returned)."""
    job = {**GPT3, **overrides}
    options = {k: v for k, v in job.items() if k not in ("params", "tokens", "devices")}
    out = claims.months_to_days(job["params"], job["tokens"], job["devices"], OVERLAPS, **options)
    for ov, f in out["fixed"].items():
        print(f"overlap {ov:g}: {job['params']:.3g} parameters — plain ring (if it fitted) "
              f"{f['ring_days']:.1f} days, fastest bar that fits ({f['best']}) {f['best_days']:.1f} days: "
              f"{f['ring_days'] / f['best_days']:.2f}× faster")
    small = out["ring_largest"]
    print(f"the largest model a plain ring fits on these devices: {small['params']:.3g} parameters, "
          + ", ".join(f"{d:.1f} days at overlap {ov:g}" for ov, d in small["days"].items())
          + f"; with the milestones {job['params'] / small['params']:.0f}× more parameters fit")
    return out


def ps_sharding(servers=(1, 8, 64, 256, 1024), **overrides) -> list[dict]:
    """Chapter 1's parameter server for GPT-3 (or ``overrides``) with K server machines, beside the
    ring: days, machines, bytes per server and per worker, the step's latency and bandwidth terms."""
    job = {**GPT3, **overrides}
    options = {k: v for k, v in job.items() if k not in ("params", "tokens", "devices")}
    args = job["params"], job["tokens"], job["devices"]
    rows = [costmodel.estimate(costmodel.plan_for("parameter-server", *args, **options, servers=k))
            for k in servers] + [costmodel.estimate(costmodel.plan_for("ring", *args, **options))]
    print("K: the parameter server's machines (ring: none); latency, bandwidth: the step's terms\n"
          f"{'K':>6} {'machines':>9} {'GB/server':>10} {'GB/worker':>10} {'latency s':>10} "
          f"{'bandwidth s':>12} {'step s':>9} {'days':>9}")
    for r in rows:
        name = f"{r['servers']:,}" if r["servers"] else "ring"
        print(f"{name:>6} {r['machines']:>9,} "
              f"{format(r['memory']['server'] / 1e9, ',.1f') if r['servers'] else '-':>10} "
              f"{r['memory']['total'] / 1e9:>10,.1f} {r['terms']['latency']:>10.3g} "
              f"{r['terms']['bandwidth']:>12.4g} {r['step_s']:>9.4g} {r['days']:>9,.1f}")
    return rows


def offload(params: float = 1e12, devices: int = 1024, pipelines=(8, 16, 32, 64), tokens: float = 300e9,
            **options) -> list[dict]:
    """Which of ZeRO-2, ZeRO-2 with ZeRO-Offload and ZeRO-3 fits ``params`` on ``devices`` A100s, at
    each pipeline depth: memory per device and per device on the host, fits, days. Prints the table."""
    rows = []
    print(f"{'pipeline P':>10} {'milestone':<17} {'GB/device':>10} {'GB on host':>11} {'fits':>5} "
          f"{'days':>7}")
    for p in pipelines:
        for name, choice in (("zero-2", {"zero": 2}), ("zero-2 + offload", {"zero": 2, "offload": True}),
                             ("zero-3", {"zero": 3})):
            e = costmodel.estimate(costmodel.Plan(params, tokens, devices, pipeline=p, **choice, **options))
            rows.append({"pipeline": p, "milestone": name, **e})
            mem = e["memory"]
            print(f"{p:>10} {name:<17} {mem['total'] / 1e9:>10,.1f} {mem['host'] / 1e9:>11,.1f} "
                  f"{'yes' if e['fits'] else 'NO':>5} {e['days']:>7,.1f}")
    return rows


def lamb_microbatches(**overrides) -> dict:
    """LAMB's bar with its micro-batches explicit: each replica's 6 sequences as one micro-batch (the
    chart's bar: ZeRO-3 gathers the parameters once per step, activations of 6 sequences held) or as 6
    micro-batches of 1 (gathered 6 times), against the chart's ZeRO-3 bar, at each overlap. Prints the
    table; returns {(micro_batch, overlap): {"lamb": estimate, "zero-3": estimate}} (0: one micro-batch)."""
    job = {**GPT3, **overrides}
    options = {k: v for k, v in job.items() if k not in ("params", "tokens", "devices")}
    args, out = (job["params"], job["tokens"], job["devices"]), {}
    print(f"{'overlap':>7} {'LAMB micro-batches':>19} {'gathers/step':>12} {'GB/device':>9} {'LAMB days':>9} "
          f"{'ZeRO-3 days':>11}  LAMB")
    for ov in OVERLAPS:
        zero3 = costmodel.estimate(costmodel.plan_for("zero-3", *args, overlap=ov, **options))
        for mb in (0, 1):
            plan = costmodel.plan_for("lamb", *args, overlap=ov, micro_batch=mb, **options)
            lamb = costmodel.estimate(plan)
            out[mb, ov] = {"lamb": lamb, "zero-3": zero3}
            p = lamb["plan"]
            print(f"{ov:>7g} {f'{p.microbatches:g} of {p.sequences_per_microbatch:g}':>19} "
                  f"{p.microbatches:>12g} {lamb['memory']['total'] / 1e9:>9.1f} {lamb['days']:>9.1f} "
                  f"{zero3['days']:>11.1f}  {'faster' if lamb['days'] < zero3['days'] else 'slower'}")
    return out



def what_if():
    """Model size, tokens, number and kind of device, interconnect, milestones → a table, at once
    (the model is arithmetic: nothing starts). A milestone the model cannot plan for the choice
    (more data-parallel replicas than the batch has sequences) gets a line saying why; the others
    still get their rows."""
    import ipywidgets as W

    # A fine step, so that the sliders keep GPT-3's values (175e9, not 10^11.24 = 1.74e11).
    params = W.FloatLogSlider(value=175e9, base=10, min=8, max=13, step=0.001, description="parameters",
                              readout_format=".3g", layout={"width": "520px"})
    tokens = W.FloatLogSlider(value=300e9, base=10, min=9, max=13.5, step=0.001, description="tokens",
                              readout_format=".3g", layout={"width": "520px"})
    count = W.Dropdown(options=[2**k for k in range(3, 15)], value=1024, description="devices")
    device = W.Dropdown(options=list(costmodel.devices()), value="a100-80gb", description="device")
    link = W.Dropdown(options=[k for k in costmodel.links() if not k.startswith("nvlink")], value="ib-hdr",
                      description="link")
    overlap = W.FloatSlider(value=0.0, min=0, max=1, step=0.1, description="overlap")
    tensor = W.Dropdown(options=[1, 2, 4, 8], value=1, description="tensor t")  # within one node
    sp = W.Checkbox(value=False, description="sequence parallel")
    chosen = W.SelectMultiple(options=list(costmodel.MILESTONES), value=list(costmodel.MILESTONES),
                              description="milestones", rows=len(costmodel.MILESTONES))
    out = W.HTML()

    def update(*_):
        rows, cannot = [], {}
        for m in chosen.value or ("ring",):
            try:
                rows += costmodel.milestones(params.value, tokens.value, count.value, (m,),
                                             device=device.value, link=link.value, overlap=overlap.value,
                                             tensor=tensor.value, sequence_parallel=sp.value)
            except ValueError as e:  # e.g. more replicas than sequences in the batch: said, not raised
                cannot.setdefault(str(e), []).append(m)
        cells = "".join(
            f"<tr><td>{r['milestone']}</td><td>{r['plan'].pipeline}</td>"
            f"<td>{'yes' if r['fits'] else '<b>does not fit</b>'}</td>"
            f"<td style='text-align:right'>{r['memory']['total'] / 1e9:,.1f}</td>"
            f"<td style='text-align:right'>{r['terms']['tensor']:,.3g}</td>"
            f"<td style='text-align:right'>{r['days']:,.3g}</td><td>{r['dominant']}</td></tr>" for r in rows)
        table = ("<table><tr><th>milestone</th><th>stages</th><th>fits</th><th>GB/device</th><th>tensor "
                 f"s/step</th><th>days</th><th>dominant term</th></tr>{cells}</table>") if rows else ""
        out.value = table + "".join(f"<p><b>cannot model {', '.join(ms)} here:</b> {why}</p>"
                                    for why, ms in cannot.items())

    controls = (params, tokens, count, device, link, overlap, tensor, sp, chosen)
    for w in controls:
        w.observe(update, "value")
    update()
    return W.VBox([*controls, out])


def run_impact(preset: str = "quick", live: plots.common.LiveRuns | None = None, **options) -> Result:
    """The impact experiment on a warm cluster, one live trace per milestone."""
    cfg = impact.Config(preset=preset, **options).validate()
    on_event, tracks = None, {}
    if live is not None:
        current: dict[int, object] = {}
        subs = impact.plans(cfg)

        def on_event(ev: dict) -> None:
            if ev.get("kind") == "milestone":
                name = ev["name"]
                if name not in tracks:
                    sub = subs[name][1]
                    reporting = cfg.world_size - (1 if name == "parameter-server" else 0)
                    loss_rank = {"parameter-server": 1, "pipeline": cfg.world_size - 1}.get(name, 0)
                    tracks[name] = live.track(impact.LABELS[name], sub.steps, reporting, loss_rank)
                current[ev["rank"]] = tracks[name]
            elif ev.get("kind") == "step" and ev.get("rank") in current:
                current[ev["rank"]](ev)

    result = run_warm(cfg, on_event=on_event)
    for name in tracks:
        live.finish(impact.LABELS[name])  # each milestone drawn in full, as it ended
    return result


def measured(preset: str = "quick", **options) -> Result:
    """Train every milestone live, then the dashboard, the table and the cost model's predictions."""
    live = plots.common.LiveRuns("One model through every milestone: loss per step, live")
    display(live)
    r = run_impact(preset, live, **options)
    note = plots.common.oversubscription_note([r], busy_shown=False)
    display(plots.impact.dashboard(r["milestones"], r["target_loss"], note))
    print(table(r["milestones"]))
    return r


def table(records: list[dict]) -> str:
    lines = ["reached: the target loss; s: to reach it; bytes/step: busiest rank; KB: fullest rank's peak",
             f"{'milestone':<24} {'optimizer':>9} {'batch':>6} {'reached':>8} {'steps':>6} "
             f"{'s':>7} {'bytes/step':>11} {'KB':>7}  link"]
    for r in records:
        mem = max(sum(m.values()) for m in r["peak_memory_per_rank"]) / 1e3
        t = f"{r['time_to_target_s']:.2f}" if r["reached_target"] else "-"
        link = f"  {r['link_gbps']:g} Gb/s, emulated" if r.get("link_gbps") else "  real"
        lines.append(f"{r['label']:<24} {r['optimizer']:>9} {r['global_batch']:>6} "
                     f"{'yes' if r['reached_target'] else 'NO':>8} {r['steps']:>6} {t:>7} "
                     f"{r['bytes_per_step_busiest']:>11,.0f} {mem:>7,.1f}{link}")
    return "\n".join(lines)


def validation_table(result: Result) -> str:
    """Predicted beside measured median step time (and its communication part), with the error."""
    p = result["probe"]
    lines = [f"measured here: α = {p['alpha_s'] * 1e6:.0f} µs, 1/β = {p['bandwidth_GBps']:.2f} GB/s "
             f"(fitted to our ring all-reduce, all ranks),\n{p['flops'] / 1e9:.1f} GFLOP/s per rank "
             "(slowest rank). Step and its communication, ms: measured, predicted",
             f"{'milestone':<37} {'step':>8} {'predicted':>9} {'error':>6} {'comm':>7} {'predicted':>9}"]
    for r in result["milestones"]:
        err = r["predicted_step_s"] / r["median_step_s"] - 1
        lines.append(f"{plots.impact.label(r):<37} {1e3 * r['median_step_s']:>8.2f} "
                     f"{1e3 * r['predicted_step_s']:>9.2f} {err:>+6.0%} "
                     f"{1e3 * r['median_comm_s']:>7.2f} {1e3 * r['predicted_comm_s']:>9.2f}")
    ratio = lambda a, b: [r[a] / r[b] for r in result["milestones"] if r[b] > 0]
    for what, got in (("whole step", ratio("median_step_s", "predicted_step_s")),
                      ("communication", ratio("median_comm_s", "predicted_comm_s"))):
        lines.append(f"measured ÷ predicted, {what}: {min(got):.2f}–{max(got):.2f}×" if got else "")
    return "\n".join(lines)
