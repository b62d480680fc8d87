"""The command line, headless and under torchrun."""

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import cli_in_process

# The runs go through a subprocess (or torchrun); the answers given before any rank starts (bad input,
# help, a mistyped name) are taken in this process (conftest.cli_in_process).
pytestmark = [pytest.mark.ch0, pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--steps", "4", "--global-batch", "16", "--hidden", "16", "--samples", "256"]


def cli(*args, timeout=120, prefix=(sys.executable, "-m", "lesson_lib")):
    return subprocess.run([*prefix, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_list_names_the_experiments_with_whole_sentences():
    out = cli("list")
    assert out.returncode == 0 and "data-parallel" in out.stdout
    # the first paragraph of each docstring, not its first line cut off mid-sentence
    assert "workers push gradients and pull parameters" in " ".join(out.stdout.split())
    listed = cli_in_process("list")  # catches: raw reST markup (:func:`comm.set_link`) in the listing
    assert listed.returncode == 0 and "comm.set_link" in listed.stdout
    assert ":func:" not in listed.stdout and "``" not in listed.stdout


def test_help_lists_the_commands_without_markup():
    out = cli_in_process("--help")
    assert out.returncode == 0
    assert all(c in out.stdout for c in ("list", "run EXPERIMENT", "bench", "doctor"))
    assert "``" not in out.stdout
    assert cli().returncode == 2  # no command: usage on stderr, failure


def test_doctor_prints_a_table_and_json_on_request():
    # catches: doctor answering an instructor in JSON only, or --json and the table disagreeing
    d = json.loads(cli("doctor", "--json").stdout)
    assert d["torch"] == torch.__version__ and d["cpu_cores"] >= 1 and "placement" in d
    table = cli_in_process("doctor")
    assert table.returncode == 0 and "{" not in table.stdout
    assert f"torch:           {torch.__version__}" in table.stdout
    assert f"  2 rank(s)    {d['placement']['2']}" in table.stdout
    bad = cli_in_process("doctor", "--yaml")
    assert bad.returncode == 2 and "--yaml" in bad.stderr


def test_run_writes_json_independent_of_world_size(tmp_path):
    losses = {}
    for n in (1, 2):
        f = tmp_path / f"dp{n}.json"
        out = cli("run", "data-parallel", "--world-size", str(n), *SMALL, "--json", str(f))
        assert out.returncode == 0, out.stderr
        assert "step 4/4" in out.stderr  # the progress bar
        d = json.loads(f.read_text())
        assert d["experiment"] == "data-parallel" and d["world_size"] == n
        assert len(d["per_rank"]) == n and d["config"]["global_batch"] == 16
        losses[n] = d["losses"]
    torch.testing.assert_close(torch.tensor(losses[2]), torch.tensor(losses[1]), rtol=1e-5, atol=1e-6)


def test_the_same_run_works_under_torchrun(tmp_path):
    f = tmp_path / "tr.json"
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    out = cli("--standalone", "--nproc-per-node", "2", "-m", "lesson_lib", "run", "data-parallel",
              *SMALL, "--json", str(f), prefix=(torchrun,), timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    d = json.loads(f.read_text())
    assert d["world_size"] == 2 and len(d["per_rank"]) == 2
    ref = tmp_path / "ref.json"
    assert cli("run", "data-parallel", "--world-size", "1", *SMALL, "--json", str(ref)).returncode == 0
    torch.testing.assert_close(torch.tensor(d["losses"]), torch.tensor(json.loads(ref.read_text())["losses"]),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("args, name", [
    (["run", "data-parallel", "--world-size", "3", "--global-batch", "64"], "global_batch"),
    (["run", "data-parallel", "--straggler", "9:2"], "straggler"),
    (["run", "data-parallel", "--backend", "mpi"], "backend"),
    (["run", "no-such-experiment"], "unknown experiment"),
])
def test_bad_input_fails_fast_with_a_message_naming_it(args, name):
    out = cli_in_process(*args)
    assert out.returncode != 0 and name in out.stderr


def test_a_mistyped_name_is_answered_with_a_suggestion_not_a_traceback():
    # bug caught: `run data-paralel` printing a Python traceback (KeyError/ValueError from the registry)
    out = cli_in_process("run", "data-paralel")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "unknown experiment 'data-paralel'; did you mean data-parallel?" in out.stderr
    out = cli_in_process("bench", "bubbel")
    assert out.returncode == 2 and "did you mean bubble?" in out.stderr


def test_bench_help_says_what_each_benchmark_measures_and_runs_none():
    # bug caught: `bench --help` answered "unknown benchmark '--help'", `bench allreduce --help` ran
    # the whole benchmark (minutes) and ignored the option, and a bare `bench` ran `startup`
    from lesson_lib.__main__ import benchmark_names

    out = cli_in_process("bench", "--help")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    lines = out.stdout.splitlines()
    assert set(benchmark_names()) >= {"allreduce", "bubble", "compression", "ddp", "startup"}
    for name in benchmark_names():
        assert any(line.startswith(f"{name} ") for line in lines), (name, out.stdout)
    assert "All-reduce bandwidth: our rings and the backend's" in " ".join(out.stdout.split())
    bare = cli_in_process("bench")
    assert bare.returncode == 2 and bare.stdout == "" and "usage:" in bare.stderr
    one = cli_in_process("bench", "ddp", "--help")
    assert one.returncode == 0 and "usage: python -m lesson_lib bench ddp" in one.stdout
    assert "torch DDP's" in one.stdout and "``" not in one.stdout
    extra = cli_in_process("bench", "ddp", "--steps", "3")
    assert extra.returncode == 2 and "takes no options" in extra.stderr and "--steps 3" in extra.stderr


def test_run_help_lists_every_experiment_with_its_description():
    # bug caught: `run --help` printing only a usage line
    from lesson_lib import experiments
    out = cli_in_process("run", "--help")
    assert out.returncode == 0
    assert all(n in out.stdout for n in experiments.names()), out.stdout
    assert "workers push gradients and pull parameters" in " ".join(out.stdout.split())
