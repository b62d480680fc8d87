"""The course's command line (``python -m lesson_lib --help`` prints :data:`USAGE`)."""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import inspect
import json
import os
import re
import shutil
import sys
import textwrap
import warnings
from dataclasses import MISSING, fields
from pathlib import Path

from . import experiments, runtime

USAGE = """\
usage: python -m lesson_lib COMMAND [options]

commands:
  list                       the experiments, one line each
  run EXPERIMENT [options]   run one on real ranks (`run EXPERIMENT --help` lists its options)
  bench WHAT                 a benchmark from the repository's benchmarks/ folder (ratios
                             measured in one run); `bench --help` lists them
  estimate [options]         the cost model: time and memory per milestone at cluster scale
  doctor [--json]            torch version, backend per world size, cores, threads per rank
  slides [--check] [NB ...]   slide metadata for jupyterlab-rise on every chapter (or --check it)
  workshop serve|reset ...   a JupyterHub for a room, one machine (`workshop --help`)

examples:
  python -m lesson_lib run data-parallel --world-size 4 --steps 20 --json dp.json
  torchrun --standalone --nproc-per-node 2 -m lesson_lib run data-parallel   # one process per rank
"""


def summary(doc: str | None) -> str:
    """An experiment's first paragraph on one line (its docstring wraps it over several)."""
    first = (doc or "").strip().split("\n\n")[0]
    return " ".join(first.split())


def _add_config_args(parser: argparse.ArgumentParser, config_cls) -> None:
    for f in fields(config_cls):
        if not f.metadata.get("cli", True):  # an option this experiment does not use
            continue
        default = f.default if f.default is not MISSING else None
        if isinstance(default, bool):  # --error-feedback / --no-error-feedback
            parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None,
                                action=argparse.BooleanOptionalAction,
                                help=f"{f.metadata.get('help', '')} (default: {default!r})")
            continue
        kind = type(default) if default is not None else str
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=kind, default=None,
                            help=f"{f.metadata.get('help', '')} (default: {default!r})")


class _Progress:
    def __init__(self, steps: int, stream=None):
        self.steps, self.stream, self.done = steps, stream or sys.stderr, 0
        self.offset: dict = {}  # per rank: steps of the milestones it has finished (impact)

    def __call__(self, ev: dict) -> None:
        if ev.get("kind") == "milestone" and "total" in ev:  # one bar over every milestone's steps
            self.offset[ev["rank"]], self.steps = ev["offset"], ev["total"]
            return
        if ev.get("kind") != "step":
            return
        done = self.offset.get(ev.get("rank"), 0) + ev["step"] + 1
        # The first rank to finish a step moves the bar (rank 0 may be a server that has no steps).
        if done <= self.done:
            return
        self.done = done
        bar = "#" * (30 * done // self.steps)
        loss = f" loss {ev['loss']:.4f}" if "loss" in ev else ""
        self.stream.write(f"\r[{bar:<30}] step {done}/{self.steps}{loss}")
        if done == self.steps:
            self.stream.write("\n")
        self.stream.flush()


def print_experiments(stream=None) -> None:
    """Each experiment with the first paragraph of its docstring (``list``, ``run --help``), on
    ``stream`` (default: sys.stdout as it is at the call)."""
    stream = stream or sys.stdout
    width = max(60, shutil.get_terminal_size((100, 20)).columns)
    for n in experiments.names():
        print(textwrap.fill(_plain(summary(experiments.load(n).__doc__)), width=width,
                            initial_indent=f"{n:<18} ", subsequent_indent=" " * 19), file=stream)


def unknown(what: str, name: str, choices: list[str]) -> int:
    """'unknown experiment 'data-paralel'; did you mean data-parallel?' on stderr; exit code 2."""
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else ""
    print(f"unknown {what} {name!r}{hint} (choose one of: {', '.join(choices)})", file=sys.stderr)
    return 2


def cmd_run(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        asked = bool(argv) and argv[0] in ("-h", "--help")
        stream = sys.stdout if asked else sys.stderr
        print("usage: python -m lesson_lib run EXPERIMENT [options]   "
              "(`run EXPERIMENT --help` lists its options)\n\nexperiments:", file=stream)
        print_experiments(stream)
        return 0 if asked else 2
    name, rest = argv[0], argv[1:]
    if name not in experiments.names():
        return unknown("experiment", name, experiments.names())
    mod = experiments.load(name)
    p = argparse.ArgumentParser(prog=f"python -m lesson_lib run {name}", description=mod.__doc__)
    _add_config_args(p, mod.Config)
    p.add_argument("--json", metavar="FILE", help="write the full result as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(rest)
    options = {f.name: getattr(args, f.name) for f in fields(mod.Config)
               if getattr(args, f.name, None) is not None}
    if runtime.launched_by_torchrun():
        cluster = runtime.TorchrunCluster(options.get("backend", "auto"), options.get("timeout_s", 30.0))
        if options.setdefault("world_size", cluster.world_size) != cluster.world_size:
            p.error(f"--world-size {options['world_size']} differs from torchrun's WORLD_SIZE "
                    f"{cluster.world_size}")
        lead = cluster.rank == 0
    else:
        cluster, lead = None, True
    try:
        cfg = mod.Config(**options).validate()
    except ValueError as e:  # a bad option: say which, without a traceback
        p.error(str(e))
    progress = None if args.quiet else _Progress(cfg.steps)
    try:
        if cluster is None:
            with runtime.Cluster(cfg.world_size, cfg.backend, timeout_s=cfg.timeout_s) as c:
                result = experiments.run(name, cfg, cluster=c, on_event=progress)
        else:
            result = experiments.run(name, cfg, cluster=cluster)
    finally:
        if cluster is not None:
            cluster.close()
    if lead:
        print(result.summary())
        if args.json:
            result.save_json(args.json)
            print(f"wrote {args.json}")
    return 0


# The benchmarks live beside the package in a source checkout (benchmarks/bench_NAME.py, each with
# measure() and show(result)), not in it: a learner's install carries no benchmark code.
BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def benchmark_names() -> list[str]:
    return sorted(p.stem.removeprefix("bench_") for p in BENCHMARKS.glob("bench_*.py"))


def load_benchmark(name: str):
    """benchmarks/bench_NAME.py as a module; its functions travel to the ranks by value."""
    import cloudpickle

    path = BENCHMARKS / f"bench_{name}.py"
    spec = importlib.util.spec_from_file_location(f"lesson_lib_benchmarks.{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)
    return module


def _plain(doc: str) -> str:
    """A docstring without its reST markup: :func:`~.bench_startup.first_step` → first_step,
    :mod:`lesson_lib.runtime` → lesson_lib.runtime, ``x`` → x."""
    doc = re.sub(r":\w+:`(~?)\.?([^`]*)`", lambda m: m[2].rsplit(".", 1)[-1] if m[1] else m[2], doc)
    return re.sub(r"``([^`]*)``", r"\1", doc)


def cmd_bench(argv: list[str]) -> int:
    names = benchmark_names()
    if not names:
        print(f"no benchmarks here: they live in the course repository's benchmarks/ folder "
              f"(looked in {BENCHMARKS})", file=sys.stderr)
        return 2
    if not argv or argv[0] in ("-h", "--help"):  # say what there is; a bench takes minutes
        stream = sys.stdout if argv else sys.stderr
        print("usage: python -m lesson_lib bench WHAT   (each takes a few minutes and prints every "
              "run)\n\nbenchmarks:", file=stream)
        width = max(60, shutil.get_terminal_size((100, 20)).columns)
        for name in names:
            print(textwrap.fill(_plain(summary(load_benchmark(name).__doc__)), width=width,
                                initial_indent=f"{name:<12} ", subsequent_indent=" " * 13), file=stream)
        return 0 if argv else 2
    what, extra = argv[0], argv[1:]
    if what not in names:
        return unknown("benchmark", what, names)
    bench = load_benchmark(what)
    if extra and extra[0] in ("-h", "--help"):
        doc = _plain(inspect.cleandoc(bench.__doc__))
        print(f"usage: python -m lesson_lib bench {what}\n\n{doc}")
        return 0
    if extra:
        print(f"bench {what} takes no options, got {' '.join(extra)!r} (see `bench {what} --help`)",
              file=sys.stderr)
        return 2
    # The tables say when ranks outnumber cores; the per-cluster warning would only repeat it.
    warnings.filterwarnings("ignore", message=".*ranks on .* CPU cores", category=RuntimeWarning)
    bench.show(bench.measure())
    return 0


def doctor_table(info: dict) -> str:
    """``runtime.describe()`` as lines a person reads: one fact a line, a world size a column."""
    lines = []
    for key, value in info.items():
        label = key.replace("_", " ")
        if isinstance(value, dict):
            lines.append(f"{label}:")
            lines += [f"  {f'{k} rank(s)' if isinstance(k, int) else k:<12} {v}" for k, v in value.items()]
        else:
            lines.append(f"{label + ':':<16} {'none' if value is None else value}")
    return "\n".join(lines)


def cmd_doctor(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print("usage: python -m lesson_lib doctor [--json]\n\nWhat the runtime sees: versions, cores, "
              "GPUs, the backend and threads a world of 1, 2, 4 or 8 ranks gets.")
        return 0
    if argv not in ([], ["--json"]):
        print(f"doctor takes only --json, got {' '.join(argv)!r}", file=sys.stderr)
        return 2
    info = runtime.describe()
    print(json.dumps(info, indent=2) if argv else doctor_table(info))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE, end="", file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "list":
        print_experiments()
        return 0
    if cmd == "run":
        return cmd_run(rest)
    if cmd == "estimate":
        from .costmodel import cli_estimate

        return cli_estimate(rest)
    if cmd == "doctor":
        return cmd_doctor(rest)
    if cmd == "bench":
        return cmd_bench(rest)
    if cmd == "slides":
        from .slides import main as slides_main

        return slides_main(rest)
    if cmd == "workshop":  # imports nothing of JupyterHub here: the hub runs from its own install
        from .workshop.cli import main as workshop_main

        return workshop_main(rest)
    return unknown("command", cmd, ["list", "run", "estimate", "bench", "doctor", "slides", "workshop"])


if __name__ == "__main__":
    rc = main()
    if runtime.launched_by_torchrun():
        # Everything is written and the process group is closed. Under torchrun, about 1 exit in
        # 10 aborted in C++ static destructors after Python had finished ("terminate called
        # without an active exception"), which torchrun reports as a failed rank; skip them.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    sys.exit(rc)
