"""A small mutation check: does the test suite notice a one-line bug? (`make test-mutants`)

Each mutant below is a realistic one-line change to a core formula, collective, schedule or
checker. For each, a temporary copy of the committed tree (`--rev`, default HEAD) gets that one
change, then the quick loop (`pytest tests -m "not slow and not browser" -x`) runs against the
copy; the mutant is *caught* when some test fails. A mutant that names its test files (``tests``)
runs only those, still without the slow tests (``--whole``: the whole quick loop for every mutant).
An unmutated run over the same files comes first: if it fails without a mutant, nothing is
counted. Prints caught/missed per mutant and a summary; `--json FILE` keeps the result. Not part of
`make test` (a missed mutant without test files costs a whole quick loop); record runs in
benchmarks/mutants.md. tests/test_mutants.py checks that every mutant still
applies (its text occurs exactly once), so the list cannot rot silently.

    .venv/bin/python tests/mutants.py                 # all of them
    .venv/bin/python tests/mutants.py ring-recv-chunk lamb-trust-ratio
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # relative to the repository root
    old: str   # occurs exactly once in the file
    new: str
    why: str   # the bug a contributor could make
    tests: tuple[str, ...] = ()  # the test files that should catch it; empty: the whole quick loop


MUTANTS = (
    Mutant("ring-recv-chunk", "lesson_lib/comm/schedules.py",
           "(r - 1) % n, (r + first - s - 1) % n))", "(r - 1) % n, (r + first - s) % n))",
           "the ring's receive chunk off by one"),
    Mutant("dp-average-by-two", "lesson_lib/milestones/data_parallel.py",
           "bucket.div_(world_size)", "bucket.div_(2)",
           "data parallel averages by 2, right at two ranks only"),
    Mutant("bubble-ignores-chunks", "lesson_lib/costmodel/terms.py",
           "return (stages - 1) / (chunks * microbatches + stages - 1)",
           "return (stages - 1) / (microbatches + stages - 1)",
           "the bubble formula forgets interleaving's chunks"),
    Mutant("zero-unsharded-halved", "lesson_lib/costmodel/terms.py",
           "(world_size if k in _ZERO_SHARDED[stage] else 1)",
           "(world_size if k in _ZERO_SHARDED[stage] else 2)",
           "ZeRO's memory divides the unsharded states too"),
    Mutant("lamb-trust-ratio", "lesson_lib/optim.py",
           "ratio = w_norm / u_norm", "ratio = u_norm / w_norm",
           "the trust ratio upside down"),
    Mutant("moe-aux-all-choices", "lesson_lib/milestones/expert_parallel/moe.py",
           "aux = experts * (onehot[:T].float().mean(0)", "aux = experts * (onehot.float().mean(0)",
           "the balancing loss counts every assignment, not first choices"),
    Mutant("moe-capacity-plus-one", "lesson_lib/milestones/expert_parallel/moe.py",
           '"keep": slot < capacity', '"keep": slot <= capacity',
           "an expert keeps one token more than its capacity"),
    Mutant("qsgd-dequantize-levels", "lesson_lib/milestones/compression/compressors.py",
           "return (norms.unsqueeze(1) * q / levels)", "return (norms.unsqueeze(1) * q / (levels - 1))",
           "QSGD decodes with the wrong number of levels"),
    Mutant("1f1b-warmup", "lesson_lib/milestones/pipeline/schedules.py",
           "warmup = min(stages - stage - 1, m)", "warmup = min(stages - stage, m)",
           "1F1B runs one warm-up forward too many"),
    Mutant("hd-formula-bytes", "lesson_lib/comm/algorithms.py",
           "            return float(nbytes) if rank % 2 == 0 else core + nbytes",
           "            return float(nbytes) if rank % 2 == 0 else core",
           "halving-doubling's folded rank forgets to send the result back"),
    Mutant("shard-overlap", "lesson_lib/data.py",
           "return indices[rank * per:(rank + 1) * per]", "return indices[rank * per:(rank + 2) * per]",
           "a rank's slice of the batch overlaps its neighbour's"),
    Mutant("checker-overlap-half", "lesson_lib/chapters/ch00_exercises.py",
           "        if early < need:", "        if early < need // 2:",
           "chapter 0's overlap checker content with half the gradients overlapped"),
    Mutant("checker-zero1-slice", "lesson_lib/chapters/ch04_zero1.py",
           "        if sizes != [size]:", "        if not sizes:",
           "the ZeRO-1 checker no longer requires each rank to step its own slice only"),
    Mutant("checker-pingpong-order", "lesson_lib/chapters/ch07_exercises.py",
           'reply["start"] < got["done"]', 'reply["start"] < got["start"]',
           "the ping-pong checker lets a reply leave before its ping arrived"),
    Mutant("ring-bytes-formula", "lesson_lib/comm/algorithms.py",
           "    return 2 * (n - 1) * nbytes / n\n", "    return 2 * (n - 1) * nbytes / n / n * 2\n",
           "the ring's textbook bytes, right at two ranks only"),
    # from the audit of the tests' references (tests/AUDIT.md): each passed the suite before it
    Mutant("alphabeta-ring-doubled", "lesson_lib/costmodel/alphabeta.py",
           "        return 2.0 * (n - 1), 2.0 * (n - 1) / n * nbytes",
           "        return 4.0 * (n - 1), 4.0 * (n - 1) / n * nbytes",
           "the ring's alpha-beta terms both doubled (the fit recovers them through the same terms)"),
    Mutant("sign-short-block-scale", "lesson_lib/milestones/compression/compressors.py",
           "(b.abs().sum(1) / counts)", "(b.abs().sum(1) / BLOCK)",
           "a short last block's sign scale averaged over the full block size"),
    Mutant("zero2-grads-unsharded", "lesson_lib/costmodel/terms.py",
           '2: ("optimizer", "grads"), 3:', '2: ("optimizer",), 3:',
           "ZeRO-2's memory no longer shards the gradients"),
    Mutant("sgd-drops-momentum", "lesson_lib/optim.py",
           "return torch.optim.SGD(groups, lr=lr, momentum=momentum)",
           "return torch.optim.SGD(groups, lr=lr)",
           "the optimizer factory's SGD drops its momentum (ranks and reference alike)"),
    Mutant("fp8-grad-e4m3", "lesson_lib/milestones/fp8/linear.py",
           "g8, sg = _cast(grad, E5M2, ctx.scaled)", "g8, sg = _cast(grad, E4M3, ctx.scaled)",
           "FP8's backward casts gradients to the forward's format"),
    # issue 58: chapters 8-10, the collective check and the cost model, each with the test files that
    # should catch it (run alone: `tests/mutants.py NAME` runs only those files)
    Mutant("fp8-delayed-current-amax", "lesson_lib/milestones/fp8/scaling.py",
           "past = torch.stack(list(self.amaxes)).max() if self.amaxes else amax",
           "past = torch.stack([*self.amaxes, amax]).max()",
           "delayed scaling records this step's amax before taking the scale (no saturation, no delay)",
           ("tests/test_fp8_scaling.py",)),
    Mutant("fp8-history-one-longer", "lesson_lib/milestones/fp8/scaling.py",
           "self.amaxes: deque = deque(maxlen=history)", "self.amaxes: deque = deque(maxlen=history + 1)",
           "the amax history keeps one step more than asked",
           ("tests/test_fp8_scaling.py",)),
    Mutant("ft-heal-from-first-member", "lesson_lib/milestones/resilience/ft_step.py",
           '"source": healthy[0] if healthy else None}', '"source": members[0] if healthy else None}',
           "the heal source is the round's first member, even when that is the returner itself",
           ("tests/test_resilience_varied.py",)),
    Mutant("ft-exchange-halves", "lesson_lib/milestones/resilience/ft_step.py",
           "return sum(T.from_bytes(store.get(k)) for k in keys) / len(members)",
           "return sum(T.from_bytes(store.get(k)) for k in keys) / 2",
           "the exchange divides by 2, right at two members only",
           ("tests/test_resilience_varied.py",)),
    Mutant("ft-replay-halves", "lesson_lib/milestones/resilience/ft_step.py",
           "T.set_gradient(model, sum(grads) / len(grads))", "T.set_gradient(model, sum(grads) / 2)",
           "the replay the exchange checker judges by halves every average",
           ("tests/test_resilience_varied.py",)),
    Mutant("diloco-outer-heavy-ball", "lesson_lib/milestones/resilience/ft_diloco.py",
           "momentum=outer_momentum, nesterov=True)", "momentum=outer_momentum)",
           "DiLoCo's outer step with plain momentum, not Nesterov's",
           ("tests/test_resilience_varied.py",)),
    Mutant("checked-skips-redop", "lesson_lib/runtime/checked.py",
           "theirs[OP:PEER] != mine[OP:PEER] or theirs[REDOP:] != mine[REDOP:]",
           "theirs[OP:PEER] != mine[OP:PEER] or theirs[NVEC:] != mine[NVEC:]",
           "the collective check's fast path skips the reduction (SUM on one rank, MAX on another)",
           ("tests/test_collective_mismatch.py",)),
    Mutant("ledger-chunks-message", "lesson_lib/runtime/ledger.py",
           'f"total in chunks {list(b.sends)}")', 'f"total in chunks {list(a.sends)}")',
           "a reduce-scatter cut into other chunks is reported with the first rank's chunks twice",
           ("tests/test_collective_mismatch.py",)),
    Mutant("planner-ring-over-d", "lesson_lib/costmodel/planner.py",
           'lat, bw = allreduce_terms("ring", d * c, grads)', 'lat, bw = allreduce_terms("ring", d, grads)',
           "the gradient ring spans the data-parallel ranks only, not d·c with context parallelism",
           ("tests/test_costmodel_varied.py",)),
    Mutant("flops-no-attention", "lesson_lib/costmodel/compute.py",
           "return 6 * params + 12 * layers * hidden * seq", "return 6 * params",
           "model FLOPs drop attention's 12·L·h·s",
           ("tests/test_costmodel_varied.py", "tests/test_costmodel_terms.py")),
    Mutant("interleave-activations", "lesson_lib/costmodel/compute.py",
           "held *= 1 + (stages - 1) / (stages * chunks)", "held *= 1 + (stages - 1) / stages",
           "the interleaved schedule's extra activations forget the chunks v",
           ("tests/test_costmodel_varied.py", "tests/test_costmodel_terms.py")),
    Mutant("pipeline-messages-no-chunks", "lesson_lib/costmodel/planner.py",
           'lat, bw = lat + 2 * v * m * net["alpha"], bw + 2 * v * m * boundary * net["beta"]',
           'lat, bw = lat + 2 * m * net["alpha"], bw + 2 * m * boundary * net["beta"]',
           "the pipeline's messages ignore interleaving (v boundaries per rank and direction)",
           ("tests/test_costmodel_varied.py",)),
    Mutant("checker-outer-halved", "lesson_lib/chapters/ch10_exercises.py",
           "delta = start - params.sum(0) / n  # written out",
           "delta = start - params.sum(0) / 2  # written out",
           "chapter 10's outer-step checker averages over 2 replicas whatever the world size",
           ("tests/test_exercises_ch10.py",)),
    Mutant("checker-g-extra-all-reduce", "lesson_lib/chapters/ch08_exercises.py",
           "        if sent > part:", "        if sent > 2 * part:",
           "chapter 8's g checker lets one extra all-reduce of the partial sum pass",
           ("tests/test_exercises_ch8.py",)),
    Mutant("checker-blocks-one-scale", "lesson_lib/chapters/ch09_exercises.py",
           "if s.numel() == 1 or len(set(s.flatten().tolist())) == 1:", "if s.numel() == 1:",
           "chapter 9's block-scaling checker takes one scale repeated over every block",
           ("tests/test_exercises_ch9.py",)),
    Mutant("checker-exchange-one-size", "lesson_lib/chapters/ch10_exercises.py",
           "for n in (2, 3)], [", "for n in (2, 2)], [",
           "chapter 10's exchange checker runs 2 replicas twice, never 3 (halving passes)",
           ("tests/test_world_sizes_quick.py",)),
    # issue 57: the cost model's terms that generalise
    Mutant("gemm-efficiency-no-ridge", "lesson_lib/costmodel/gemm.py",
           "return e_max * intensity / (intensity + k * ridge)", "return e_max * intensity / (intensity + k)",
           "the efficiency curve forgets the device's ridge point (peak over HBM bandwidth)",
           ("tests/test_costmodel_generalise.py",)),
    Mutant("fp8-every-flop", "lesson_lib/costmodel/gemm.py",
           "kept = min(bf16_gemm_flops(plan, tokens), hardware_flops)", "kept = 0.0",
           "FP8 runs attention's core and the head at the FP8 peak too",
           ("tests/test_costmodel_generalise.py",)),
    Mutant("last-bucket-hidden", "lesson_lib/costmodel/planner.py",
           "return max(0.0, min(overlap, compute / dp_s, 1 - last_s / dp_s))",
           "return max(0.0, min(overlap, compute / dp_s))",
           "overlap hides the last data-parallel bucket too, so weak scaling is flat again",
           ("tests/test_costmodel_generalise.py",)),
    Mutant("gqa-ignored", "lesson_lib/costmodel/compute.py",
           "kv = (kv_heads or heads) / heads  # K and V at a_kv/a of the queries' size", "kv = 1.0",
           "grouped-query attention's K/V heads change no activation",
           ("tests/test_costmodel_generalise.py",)),
    Mutant("embedding-lookup-counted", "lesson_lib/costmodel/plan.py",
           "return self.active - (0 if self.tied_embeddings else self.vocab * hidden)", "return self.active",
           "an untied input embedding's lookup counted as matmul FLOPs",
           ("tests/test_costmodel_generalise.py",)),
)


def apply(m: Mutant, root: Path) -> None:
    """Apply ``m`` to the tree at ``root``; raises if its text does not occur exactly once."""
    p = root / m.path
    text = p.read_text(encoding="utf-8")
    if text.count(m.old) != 1:
        raise ValueError(f"mutant {m.name}: its text occurs {text.count(m.old)} times in {m.path}, not once")
    p.write_text(text.replace(m.old, m.new), encoding="utf-8")


def _copy(dest: Path, rev: str) -> None:
    """The committed tree at ``rev`` (not the working tree, which may be mid-edit)."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)


def run(m: Mutant | None, timeout_s: float, rev: str, files: tuple[str, ...] = ()) -> dict:
    """The quick loop on ``rev`` with mutant ``m`` applied (``None``: unmutated, the baseline), over
    ``files`` (default: the mutant's own test files, else all of ``tests``)."""
    with tempfile.TemporaryDirectory(prefix="mutant-") as tmp:
        tree = Path(tmp) / "repo"
        _copy(tree, rev)
        if m is not None:
            apply(m, tree)
        env = {**os.environ, "PYTHONPATH": str(tree)}  # the copy's lesson_lib, not the editable install
        t0 = time.monotonic()
        selected = list(files or (m.tests if m is not None else ()) or ("tests",))
        cmd = [sys.executable, "-m", "pytest", *selected, "-m", "not slow and not browser", "-x", "-q",
               "-p", "no:cacheprovider", "--no-header",
               "--ignore=tests/test_mutants.py"]  # it checks the mutants' own text, changed here by design
        try:
            proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout_s)
            code, out = proc.returncode, proc.stdout
        except subprocess.TimeoutExpired:
            code, out = -1, ""
        lines = [ln for ln in out.splitlines() if ln.startswith("FAILED") or ln.startswith("ERROR")]
        return {"name": m.name if m else "(none)", "why": m.why if m else "", "tests": selected,
                "caught": code not in (0, -1), "exit": code,
                "seconds": round(time.monotonic() - t0, 1), "first_failure": lines[0] if lines else None}


def render(record: dict) -> str:
    """benchmarks/mutants.md from a ``--json`` record: one row per mutant."""
    rows = record["results"]
    caught = sum(r["caught"] for r in rows)
    lines = ["# Does the suite bite? One-line bugs against the quick loop", "",
             f"Generated by `python tests/mutants.py --md` from a run on {record['date']} (commit "
             f"`{record['rev']}`, nproc {record['nproc']}): each mutant applied alone to a copy of that "
             "commit, then `pytest tests -m \"not slow and not browser\" -x`. "
             f"**{caught} of {len(rows)} caught.** The list is in `tests/mutants.py`.", "",
             "| mutant | the bug | caught | first failing test | seconds |", "|---|---|---|---|---:|"]
    for r in rows:
        first = (r["first_failure"] or "—").replace("|", "\\|")
        lines.append(f"| `{r['name']}` | {r['why']} | {'yes' if r['caught'] else '**no**'} | {first} | "
                     f"{r['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="mutants to run (default: all)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per mutant")
    ap.add_argument("--rev", default="HEAD", help="the commit to mutate (default: HEAD)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    ap.add_argument("--whole", action="store_true",
                    help="run the whole quick loop for every mutant, not only its own test files")
    ap.add_argument("--md", type=Path, nargs="?", const=ROOT / "benchmarks" / "mutants.md",
                    help="write the --json record as markdown instead of running (benchmarks/mutants.md)")
    args = ap.parse_args(argv)
    if args.md is not None:  # render a finished run's record, run nothing
        args.md.write_text(render(json.loads((args.json or ROOT / "artifacts" / "mutants.json").read_text())))
        print(f"wrote {args.md}")
        return 0
    chosen = [m for m in MUTANTS if not args.names or m.name in args.names]
    if unknown := set(args.names) - {m.name for m in MUTANTS}:
        ap.error(f"unknown mutants: {sorted(unknown)}")
    # one commit for every mutant, whatever lands meanwhile
    args.rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", args.rev], capture_output=True, text=True,
                              check=True).stdout.strip()
    whole = ("tests",) if args.whole else ()
    if not args.no_baseline:  # over every file some chosen mutant runs (all of tests if one runs them all)
        files = () if args.whole or any(not m.tests for m in chosen) else \
            tuple(sorted({f for m in chosen for f in m.tests}))
        base = run(None, args.timeout, args.rev, files)
        print(f"baseline (no mutant): exit {base['exit']} in {base['seconds']} s", flush=True)
        if base["exit"] != 0:
            print(f"the quick loop fails without any mutant: {base['first_failure']}")
            return 1
    results = []
    for m in chosen:
        r = run(m, args.timeout, args.rev, whole)
        results.append(r)
        print(f"{'caught' if r['caught'] else 'MISSED'}  {m.name:24} {r['seconds']:6.1f} s  "
              f"{r['first_failure'] or m.why}", flush=True)
    caught = sum(r["caught"] for r in results)
    print(f"mutants: {caught} caught, {len(results) - caught} missed of {len(results)}")
    if args.json:
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.rev], capture_output=True,
                             text=True).stdout.strip()
        record = {"date": time.strftime("%Y-%m-%d"), "nproc": os.cpu_count(), "rev": rev, "results": results}
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
