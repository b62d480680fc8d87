"""What notebooks/08_beyond_data_parallel.ipynb calls: each function runs one section's real ranks
on a warm cluster, prints what it found, draws it, and returns the data the notebook asserts on.
The algorithms themselves are in :mod:`lesson_lib.milestones.tensor_parallel`; no presets here.
"""

from __future__ import annotations

import torch
from IPython.display import display

from .. import plots
from ..costmodel import CALIBRATED_EFFICIENCY, devices, links, ring_time
from ..milestones.context_parallel import ring_attention
from ..milestones.expert_parallel import moe
from ..milestones.tensor_parallel import formulas, tolerances, train
from ..milestones.tensor_parallel import ops as op_names
from ..milestones.tensor_parallel.dtensor import dtensor_job
from ..milestones.tensor_parallel.grid import Layout
from ..milestones.tensor_parallel.memory import memory_job
from ..milestones.tensor_parallel.model import Config
from ..milestones.tensor_parallel.results import GridRankResult
from ..numerics import max_gap
from ..runtime import warm_cluster


def _gap(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in b)


def compare(cfg: Config, layout: Layout, outs: list[dict], ref: dict) -> dict:
    """Every rank's losses, first logits (its replica's sequences), first gradients and final
    parameters against one process, with the tolerances of :mod:`~.tensor_parallel.tolerances`."""
    tol = tolerances.transformer(cfg, ref)
    share = cfg.batch // layout.dp

    def replica(o: dict) -> slice:  # the sequences of the rank's data-parallel replica
        d = GridRankResult.of(o).dp_index
        return slice(d * share, (d + 1) * share)

    logits = max(float((o["logits"] - ref["logits"][:, replica(o)]).abs().max()) for o in outs)
    gaps = {"losses": max(max_gap(o["losses"], ref["losses"]) for o in outs), "logits": logits,
            "grads": max(_gap(o["grads"], ref["grads"]) for o in outs),
            "params": max(_gap(o["params"], ref["params"]) for o in outs)}
    loss_tol = tol["rel"] * max(ref["losses"])
    ok = gaps["losses"] <= loss_tol and all(gaps[k] <= tol[k] for k in ("logits", "grads", "params"))
    return {"layout": layout, "gaps": gaps, "tolerance": {**tol, "losses": loss_tol}, "equal": ok}


def tensor_parallel(world_sizes=(2, 4), cfg: Config | None = None) -> dict:
    """§1: tensor parallelism over 2 and 4 ranks against one process; bytes per op against the formula."""
    cfg = cfg or Config.tiny()
    layouts = [Layout(tp=n).check(n, cfg) for n in world_sizes]  # all checked before any rank starts
    ref = train.reference(cfg)
    rows, traffic = [], []
    for n, layout in zip(world_sizes, layouts):
        outs = warm_cluster(n).run(train.train_job, cfg, layout)
        row = compare(cfg, layout, outs, ref)
        want = formulas.tensor_parallel(cfg, n)
        for phase in ("forward", "backward"):
            ops = outs[0][phase].get(op_names.TP_ALL_REDUCE, {"calls": 0, "bytes_sent": 0})
            row[phase] = {"calls": ops["calls"], "counted": ops["bytes_sent"], "formula": want[phase]}
            traffic.append({"label": f"t = {n}, {phase}", "counted": ops["bytes_sent"],
                            "formula": want[phase]})
        rows.append(row)
    _print_gaps(rows, world_sizes, f"largest gaps to one process after {cfg.steps} SGD steps")
    print(f"\nall-reduces per step for {cfg.layers} blocks, and the bytes each rank sent "
          f"(formula: 2·{cfg.layers}·2(t−1)/t·S each way)\n"
          f"{'t':>2} {'calls fwd':>9} {'calls bwd':>9} {'bytes fwd (formula)':>22} "
          f"{'bytes bwd (formula)':>22}")
    for n, row in zip(world_sizes, rows):
        sent = {k: f"{row[k]['counted']:,} ({row[k]['formula']:,.0f})" for k in ("forward", "backward")}
        print(f"{n:>2} {row['forward']['calls']:>9} {row['backward']['calls']:>9} {sent['forward']:>22} "
              f"{sent['backward']:>22}")
    display(plots.parallelism.bytes_vs_formula(
        traffic, f"Tensor parallelism: bytes each rank sends per step, {cfg.layers} blocks, S = "
                 f"{formulas.activation_bytes(cfg):,} bytes per activation"))
    return {"rows": rows, "cfg": cfg}


def _print_gaps(rows: list[dict], world_sizes, title: str) -> None:
    """A small table of :func:`compare`'s largest gaps, one row per world size."""
    print(f"{title}\n{'t':>2} {'losses':>8} {'logits':>8} {'grads':>8} {'params':>8} {'allowed':>8}  equal")
    for n, row in zip(world_sizes, rows):
        g = row["gaps"]
        print(f"{n:>2} " + " ".join(f"{g[k]:>8.1e}" for k in ("losses", "logits", "grads", "params"))
              + f" {row['tolerance']['params']:>8.1e}  {row['equal']}")
    print("allowed: what float32 rounding allows the parameters")


def memory(world_size: int = 4, cfg: Config | None = None) -> dict:
    """§1 and §3: one rank's memory, measured, unsharded beside tensor and sequence parallelism."""
    cfg = cfg or Config.memory()
    rows = []
    for sp in (False, True):
        layout = Layout(tp=world_size, sequence_parallel=sp).check(world_size, cfg)
        outs = warm_cluster(world_size).run(memory_job, cfg, layout, not sp)
        if not sp:
            rows.append({"label": "unsharded (one process)", **outs[0]["unsharded"]})
        label = f"t = {world_size}" + (" + sequence parallel" if sp else "")
        rows.append({"label": label, **outs[0]["parallel"],
                     "same_on_every_rank": len({o["parallel"]["measured_peak"] for o in outs}) == 1})
    print(f"{'one rank (MB)':<27} {'parameters':>10} {'saved activations':>18} {'peak allocated':>15}")
    for r in rows:
        print(f"{r['label']:<27} {r['params'] / 1e6:>10.2f} {r['block_activations'] / 1e6:>18.2f} "
              f"{r['measured_peak'] / 1e6:>15.2f}")
    print("saved activations: what the blocks keep for the backward")
    display(plots.parallelism.memory_per_rank(
        rows, f"One rank's memory: the unsharded model and t = {world_size} (d = {cfg.d_model}, "
              f"{cfg.seq} tokens × {cfg.batch} sequences)"))
    return {"rows": rows, "t": world_size}


def sequence_parallel(world_sizes=(2, 4), cfg: Config | None = None) -> dict:
    """§3: sequence parallelism equal to one process; its collectives' bytes against plain TP's."""
    cfg = cfg or Config.tiny()
    layouts = [Layout(tp=n, sequence_parallel=True).check(n, cfg) for n in world_sizes]
    ref = train.reference(cfg)
    rows = []
    for n, layout in zip(world_sizes, layouts):
        outs = warm_cluster(n).run(train.train_job, cfg, layout)
        row = compare(cfg, layout, outs, ref)
        step = outs[0]["step"]
        b = {op: s["bytes_sent"] for op, s in step.items()}.get
        row["halves"] = b(op_names.SP_ALL_GATHER, 0) + b(op_names.SP_REDUCE_SCATTER, 0)
        row["tp_formula"] = sum(formulas.tensor_parallel(cfg, n)[k] for k in ("forward", "backward"))
        row["regather"] = b(op_names.SP_REGATHER, 0)
        row["regather_formula"] = formulas.sequence_parallel(cfg, n)["regather"]
        row["ends"], row["norm_grads"] = b(op_names.SP_ENDS, 0), b(op_names.SP_NORM_GRADS, 0)
        rows.append(row)
    _print_gaps(rows, world_sizes, "with sequence parallelism: largest gaps to one process")
    print(f"\nbytes per rank per step\n{'t':>2} {'RS + AG':>9} {'TP all-reduces':>15} {'re-gather':>10} "
          f"{'in/out':>7} {'norm grads':>11}")
    for n, row in zip(world_sizes, rows):
        print(f"{n:>2} {row['halves']:>9,} {row['tp_formula']:>15,.0f} {row['regather']:>10,} "
              f"{row['ends']:>7,} {row['norm_grads']:>11,}")
    print("RS + AG: the reduce-scatters and all-gathers; TP all-reduces: plain tensor parallelism's, by\n"
          "formula; re-gather: the backward's; in/out: entering and leaving the region; norm grads: the\n"
          "norms' gradients summed across the ranks")
    return {"rows": rows}


def experts(world_sizes=(2, 4), capacity_factors=(1.0, 1.25, 2.0), top_ks=(1, 2)) -> dict:
    """§2: the expert-parallel MoE (top-1 and top-2) against one process, its drops by capacity
    factor, its bytes."""
    rows = []
    for top, n, cf in ((top, n, cf) for top in top_ks for n in world_sizes for cf in capacity_factors):
        cfg = moe.MoEConfig(capacity_factor=cf, top_k=top).check(n)
        ref = moe.reference_moe(cfg, n)
        outs = warm_cluster(n).run(moe.moe_job, cfg)
        e = cfg.experts // n
        got = {"y": torch.stack([o["y"] for o in outs]),
               "x_grad": torch.stack([o["x_grad"] for o in outs]),
               "w1_grad": torch.cat([o["w1_grad"] for o in outs]),
               "w2_grad": torch.cat([o["w2_grad"] for o in outs]),
               "router_grad": outs[0]["router_grad"]}
        tol = tolerances.moe(cfg, ref)
        gaps = {k: float((got[k] - ref[k]).abs().max()) for k in got}
        sent = outs[0]["step"][op_names.EP_ALL_TO_ALL]
        rows.append({"ranks": n, "top_k": top, "capacity_factor": cf, "capacity": cfg.capacity,
                     "experts_per_rank": e,
                     "gaps": gaps, "equal": all(gaps[k] <= tol[k] for k in gaps),
                     "dropped": [o["dropped"] for o in outs], "ref_dropped": ref["dropped"],
                     "loads": [o["load"] for o in outs], "aux": [o["aux"] for o in outs],
                     "calls": sent["calls"], "counted": sent["bytes_sent"],
                     "formula": sent["calls"] * formulas.all_to_all(cfg.experts, cfg.capacity,
                                                                     cfg.d_model, n),
                     "tokens": n * cfg.tokens})
    print(f"{'top':>3} {'ranks':>5} {'factor':>6} {'slots':>5} {'equal':>5} {'dropped':>10} {'one proc':>8} "
          f"{'balance loss per rank':>22} {'bytes (formula)':>16}")
    for r in rows:
        dropped = f"{sum(r['dropped'])}/{r['top_k'] * r['tokens']}"
        sent = f"{r['counted']:,} ({r['formula']:,.0f})"
        print(f"{r['top_k']:>3} {r['ranks']:>5} {r['capacity_factor']:>6} {r['capacity']:>5} "
              f"{str(r['equal']):>5} {dropped:>10} {sum(r['ref_dropped']):>8} "
              f"{', '.join(f'{a:.2f}' for a in r['aux']):>22} {sent:>16}")
    calls = {r["calls"] for r in rows}
    print("factor: the capacity factor; slots: per expert per rank; dropped: of the token-expert\n"
          "assignments, and as one process drops them; balance loss: 1.00 when balanced; bytes: each rank\n"
          f"sent, in {'/'.join(map(str, sorted(calls)))} all-to-alls")
    first = next(r for r in rows if r["ranks"] == max(world_sizes)
                 and r["capacity_factor"] == capacity_factors[0] and r["top_k"] == top_ks[0])
    display(plots.parallelism.expert_load(
        first["loads"], first["capacity"], f"Tokens each rank's router sends to each expert "
        f"({first['ranks']} ranks, capacity factor {first['capacity_factor']}): above the line, tokens are "
        "dropped"))
    return {"rows": rows}


def ring(world_sizes=(2, 4), batch: int = 2, heads: int = 2, seq: int = 32, dim: int = 8) -> dict:
    """§4: ring attention on c ranks against full attention; the bytes the ring passed."""
    rows = []
    for c in world_sizes:
        ring_attention.check_sequence(seq, c)
        for causal in (True, False):
            outs = warm_cluster(c).run(ring_attention.ring_job, batch, heads, seq, dim, causal)
            ref = ring_attention.full_attention(*ring_attention.qkv(batch, heads, seq, dim), causal)
            gap = float((torch.cat([o["out"] for o in outs], 2) - ref).abs().max())
            rows.append({"ranks": c, "causal": causal, "gap": gap,
                         "tolerance": tolerances.attention(seq, dim, ref),
                         "counted": [o["sent"] for o in outs], "held": [o["held"] for o in outs],
                         "formula": formulas.ring_attention(batch, heads, seq, dim, c)})
    print(f"{'c':>2} {'mask':>6} {'gap to one softmax':>19} {'allowed':>8} {'bytes sent (formula)':>21}")
    for r in rows:
        sent = f"{r['counted'][0]:,} ({r['formula']:,.0f})"
        print(f"{r['ranks']:>2} {'causal' if r['causal'] else 'full':>6} {r['gap']:>19.1e} "
              f"{r['tolerance']:>8.1e} {sent:>21}")
    print("bytes: what each rank sent; formula (c−1)·2·b·h·(s/c)·d·4")
    shown = next(r for r in rows if r["ranks"] == max(world_sizes) and r["causal"])
    display(plots.parallelism.ring_blocks(
        shown["held"], True, f"Which key/value block each of {shown['ranks']} ranks held at each step "
                             "(recorded in the causal run above)"))
    return {"rows": rows}


def composed(cfg: Config | None = None, dp: int = 2, tp: int = 2) -> dict:
    """§5: data × tensor parallelism on one grid, then PyTorch's DeviceMesh stack on the same model."""
    cfg = cfg or Config.tiny()
    layout = Layout(dp=dp, tp=tp).check(dp * tp, cfg)
    ref = train.reference(cfg)
    ours = warm_cluster(dp * tp).run(train.train_job, cfg, layout)
    row = compare(cfg, layout, ours, ref)
    theirs = warm_cluster(dp * tp).run(dtensor_job, cfg, layout)
    row["dtensor_gap"] = max(_gap(t["params"], ours[0]["params"]) for t in theirs)
    row["dtensor_loss_gap"] = max(max_gap(t["losses"], ref["losses"]) for t in theirs)
    sp = warm_cluster(dp * tp).run(dtensor_job, cfg, Layout(dp=dp, tp=tp, sequence_parallel=True))
    row["dtensor_sp_gap"] = max(_gap(t["params"], ours[0]["params"]) for t in sp)
    step = ours[0]["step"]
    row["bytes"] = {op: s["bytes_sent"] for op, s in step.items()}
    want = formulas.tensor_parallel(cfg, tp, dp)
    row["formula"] = {op_names.TP_ALL_REDUCE: want["forward"] + want["backward"],
                      op_names.DP_GRAD_ALL_REDUCE: formulas.data_parallel(ours[0]["param_numel"], dp)}
    row["param_numel"] = {"ours": ours[0]["param_numel"], "fsdp2+tp": theirs[0]["param_numel"],
                          "unsharded": ref["param_numel"]}
    print(f"dp = {dp} × tp = {tp} on {dp * tp} ranks: equal to one process: {row['equal']} (parameters "
          f"{row['gaps']['params']:.1e}, allowed {row['tolerance']['params']:.1e})")
    for op, b in row["bytes"].items():
        print(f"  {op}: {b:,} bytes per rank in the first step (formula {row['formula'][op]:,.0f})")
    print("PyTorch's stack (init_device_mesh, parallelize_module, fully_shard over dp):\n"
          f"  parameters {row['dtensor_gap']:.1e} from ours, losses {row['dtensor_loss_gap']:.1e} from one "
          f"process\n  with SequenceParallel: parameters {row['dtensor_sp_gap']:.1e} from ours\n"
          f"parameters held per rank: ours {row['param_numel']['ours']:,}, FSDP2 + TP "
          f"{row['param_numel']['fsdp2+tp']:,}, unsharded {row['param_numel']['unsharded']:,}")
    return row


def at_scale(hidden: int = 12288, seq: int = 2048, micro: int = 1, device: str = "a100-80gb",
             efficiency: float = CALIBRATED_EFFICIENCY) -> list[dict]:
    """§6: one transformer block's tensor-parallel all-reduces (bf16, 4 per step) against its compute
    (24·s·b·h² FLOPs forward, 3× that with the backward, shared by t devices) on each link."""
    flops = devices()[device]["peak_flops"] * efficiency
    nbytes = 2 * seq * micro * hidden
    rows = []
    for link in ("nvlink3", "ib-hdr", "ethernet-100g"):
        spec = links()[link]
        for t in (2, 8, 32):
            comm_s = 4 * ring_time(nbytes, t, spec["alpha"], spec["beta"])
            compute_s = 3 * 24 * seq * micro * hidden ** 2 / t / flops
            rows.append({"link": spec["name"], "t": t, "comm_ms": 1e3 * comm_s, "compute_ms": 1e3 * compute_s,
                         "comm_share": comm_s / (comm_s + compute_s)})
    print(f"One block of width {hidden}, {seq} tokens, bf16, {device} at {efficiency:.0%} of peak; "
          "communication not overlapped:")
    print(f"{'link':<46}{'t':>4}{'all-reduces ms':>16}{'compute ms':>12}{'comm share':>12}")
    for r in rows:
        print(f"{r['link']:<46}{r['t']:>4}{r['comm_ms']:>16.2f}{r['compute_ms']:>12.2f}{r['comm_share']:>12.0%}")
    return rows


def scale_calculator():
    """§6's table as a control: a link and a tensor-parallel width → one block's all-reduces against
    its compute (the same α-β model and figures as :func:`at_scale`)."""
    import ipywidgets as W

    names = {spec["name"]: k for k, spec in links().items()}
    link = W.Dropdown(options=list(names), value=links()["ib-hdr"]["name"], description="link")
    t = W.Dropdown(options=[2, 4, 8, 16, 32, 64], value=8, description="t")
    out = W.HTML()

    def update(*_):
        spec = links()[names[link.value]]
        hidden, seq, flops = 12288, 2048, devices()["a100-80gb"]["peak_flops"] * CALIBRATED_EFFICIENCY
        comm_s = 4 * ring_time(2 * seq * hidden, t.value, spec["alpha"], spec["beta"])
        compute_s = 3 * 24 * seq * hidden ** 2 / t.value / flops
        out.value = (f"<b>{comm_s * 1e3:.2f} ms</b> of all-reduces against "
                     f"<b>{compute_s * 1e3:.2f} ms</b> of compute per block: communication is "
                     f"{comm_s / (comm_s + compute_s):.0%} of the step "
                     "if nothing overlaps (width 12,288, 2,048 tokens, bf16, A100 at "
                     f"{CALIBRATED_EFFICIENCY:.0%} of peak: chapter 7's one calibrated constant; its "
                     "default model varies the efficiency with the GEMM's shape)")

    link.observe(update, "value")
    t.observe(update, "value")
    update()
    return W.VBox([link, t, out])
