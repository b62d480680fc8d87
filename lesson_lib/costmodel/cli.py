"""``python -m lesson_lib estimate``: the cost model from the command line (chapter 7)."""

from __future__ import annotations

from .calibrate import compare, comparison_table
from .plan import MILESTONES, RECOMPUTE, Plan
from .planner import estimate, milestones
from .report import assumptions, table, to_json
from .terms import devices, links, published


def cli_estimate(argv: list[str]) -> int:
    """``python -m lesson_lib estimate``: the modelled table, its assumptions, and ``--json``."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m lesson_lib estimate", description=(
        "Model one training job under each milestone: fits or not, step time, days, memory per device."))
    p.add_argument("--params", type=float, help="parameters Ψ (e.g. 175e9)")
    p.add_argument("--tokens", type=float, help="tokens to train on (e.g. 300e9)")
    p.add_argument("--devices", type=int, help="number of devices n (or give --data: n = t·p·c·d)")
    p.add_argument("--device", default="a100-80gb", help=f"one of: {', '.join(devices())}")
    p.add_argument("--link", default="ib-hdr", help=f"one of: {', '.join(links())}")
    p.add_argument("--intra-link", dest="intra_link", help="within a node (tensor parallelism)")
    p.add_argument("--milestone", action="append", help=f"one of {', '.join(MILESTONES)} "
                   "(repeatable; default: all, in the talk's order, or one 'layout' row when a layout "
                   "flag such as --data, --chunks or --recompute is given)")
    p.add_argument("--published", metavar="NAME", help="a run of data/published.csv: its prediction "
                   f"beside its paper's number (one of: {', '.join(published())})")
    for name, kind in (("pipeline", int), ("tensor", int), ("servers", int), ("batch-tokens", float),
                       ("efficiency", float), ("overlap", float), ("compression", float),
                       ("extra-steps", float), ("layers", int), ("hidden", int), ("heads", int),
                       ("chunks", int), ("context", int), ("experts", int), ("expert-parallel", int),
                       ("active-params", float), ("tp-overlap", float), ("zero", int), ("top-k", int),
                       ("kv-heads", int), ("vocab", int), ("bucket-params", float), ("jitter", float)):
        p.add_argument(f"--{name}", type=kind, help=f"overrides the plan's {name.replace('-', '_')}")
    p.add_argument("--data", type=int, help="data-parallel ways d (then devices = t·p·c·d)")
    p.add_argument("--micro-batch-size", dest="micro_batch", type=int,
                   help="sequences per micro-batch (0: each replica's share at once)")
    p.add_argument("--seq", dest="seq_len", type=int, help="sequence length")
    p.add_argument("--recompute", choices=RECOMPUTE,
                   help="activation recomputation (Korthikanti et al. 2022)")
    p.add_argument("--precision", choices=("bf16", "fp8"), help="the matmuls' precision (fp8: H100/H200)")
    p.add_argument("--context-algorithm", dest="context_algorithm", choices=("all-gather", "ring"))
    p.add_argument("--untied-embeddings", dest="tied_embeddings", action="store_false", default=None,
                   help="the input embedding is a table of its own (Llama, Nemotron-4): its V·h lookup is "
                   "not counted as a matmul (PaLM's MFU); needs --vocab")
    p.add_argument("--no-dropout", dest="dropout", action="store_false", default=None,
                   help="trained without dropout (Llama, Nemotron-4): no dropout masks among the activations")
    for flag, what in (("sequence-parallel", "sequence parallelism over the tensor-parallel ranks "
                        "(Korthikanti et al. 2022)"), ("flash-attention", "no s×s attention scores "
                        "stored (Dao et al. 2022)"), ("attention-flops", "count attention's FLOPs "
                        "(SC21 Eq. 3)")):
        p.add_argument(f"--{flag}", dest=flag.replace("-", "_"), action="store_true", default=None, help=what)
    p.add_argument("--json", metavar="FILE", help="write the estimates as JSON (step_s, days, "
                   "tflops_per_device, mfu, hfu, fits, ...)")
    args = p.parse_args(argv)
    if args.published:
        return _published(p, args)
    for name in ("params", "tokens"):
        if getattr(args, name) is None:
            p.error(f"{name} is required (or give --published NAME)")
    layout = {"data", "chunks", "micro_batch", "seq_len", "recompute", "flash_attention", "context",
              "experts", "expert_parallel", "active_params", "precision", "tp_overlap", "zero", "heads",
              "top_k", "kv_heads", "vocab", "context_algorithm", "attention_flops",
              "tied_embeddings", "dropout"}
    options = {k: v for k, v in vars(args).items() if v is not None and k not in (
        "params", "tokens", "devices", "milestone", "json", "published", "data")}
    devices_n = args.devices
    if args.data is not None:
        devices_n = args.data * (args.tensor or 1) * (args.pipeline or 1) * (args.context or 1)
        if args.devices is not None and args.devices != devices_n:
            p.error(f"devices={args.devices} differs from data × tensor × pipeline × context = {devices_n}")
    if devices_n is None:
        p.error("devices is required (or give --data)")
    try:
        if args.milestone or not layout & {k for k, v in vars(args).items() if v is not None}:
            rows = milestones(args.params, args.tokens, devices_n, args.milestone or MILESTONES, **options)
        else:  # one row: exactly the layout given, nothing a milestone adds
            rows = [{"milestone": "layout", **estimate(Plan(args.params, args.tokens, devices_n, **options))}]
    except ValueError as e:  # names the parameter; no traceback for a typo
        p.error(str(e))
    print(table(rows))
    print("\nassumptions (" + rows[0]["milestone"] + "):\n  " + "\n  ".join(assumptions(rows[0]["plan"])))
    _write(args.json, to_json(rows))
    return 0


def _write(path: str | None, data) -> None:
    import json

    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=1, default=str)
        print(f"wrote {path}")


def _published(p, args) -> int:
    """``estimate --published NAME``: the run's prediction beside its paper's number."""
    if args.published not in published():
        p.error(f"published must be one of {', '.join(published())}, got {args.published!r}")
    r = compare(args.published)
    print(comparison_table([r]))
    print(f"\nsource: {r['source']}\n\nassumptions:\n  " + "\n  ".join(assumptions(r["estimate"]["plan"])))
    row = {"milestone": args.published, **r["estimate"]}
    _write(args.json, [{**to_json([row])[0], **{k: v for k, v in r.items() if k != "estimate"}}])
    return 0
