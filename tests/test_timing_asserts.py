"""No chapter stops Run All on a wall-clock claim, except the chapters run beside 8 burners.

A workshop server is a busy machine: a notebook asserts what time cannot change (bytes, busy time, the
order of events) and prints what only time can show with ``lesson_lib.chapters.timed.timed_claim``.
Chapters 0 and 10 are run under nbval beside 8 CPU-bound processes (tests/test_busy_machine.py); every
other chapter's asserts are read here, and one that compares a measured time fails this test unless
it is below listed as a bound no load can break, with the reason.
"""

import ast
import re
from pathlib import Path

import pytest
from test_busy_machine import NOTEBOOKS as RUN_BESIDE_BURNERS

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted((ROOT / "notebooks" / "scripts").glob("*.py"))

# A name or key that holds a time or a rate measured on the wall clock.
TIMED = re.compile(r"(_ms|_s|seconds|wall|stall|time|throughput|per_s|bw|gbps|speedup|faster|slower)$", re.I)

# (chapter's script, the assert's text) → why no load can break it.
BOUNDS = {
    ("01_parameter_server", 'all(r["cycle_ms"] >= r["door_ms"] for r in traffic)'):
        "a floor: the emulated link sleeps out each transfer's bytes/bandwidth, and load only adds",
    ("02_ring_allreduce",
     'abs(r["busbw"] - r["algbw"] * 2 * (r["ranks"] - 1) / r["ranks"]) <= 1e-12 * r["busbw"]'):
        "an identity between two figures of one measured time",
    ("02_ring_allreduce", 'abs(r["sent_per_s"] - r["busbw"]) <= 1e-9 * r["busbw"]'):
        "an identity: counted bytes over the same measured time",
    ("07_impact", 'slow["median_step_s"] >= floor'):
        "a floor: the emulated link's sleeps, which load only lengthens",
    ("07_impact", 'r["predicted_step_s"] > 0 and r["median_step_s"] > 0'): "positive, on any machine",
    ("07_impact",
     'real["losses"] == slow["losses"] and real["link_gbps"] is None and slow["link_gbps"] == 0.01'):
        "a setting, not a measurement",
    ("07_impact", 'days == costmodel.days_from_throughput(p["tokens"], p["params"], int(p["devices"]), '
                  'p["achieved_tflops_per_device"] * 1e12)'): "the cost model's figure, not a measurement",
    ("10_resilience", '1 < cost["delta_s"] < 10'): "the cost model's figure, not a measurement",
    ("10_resilience", 'cost["delta_max_s"] < 600'): "the cost model's figure, not a measurement",
}


def timed_asserts(source: str) -> list[tuple[int, str, list[str]]]:
    """(line, the assert's condition, the timed names it reads) for each assert that reads one."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Assert):
            continue
        nodes = list(ast.walk(node.test))
        names = {n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        names |= {n.attr for n in nodes if isinstance(n, ast.Attribute)}
        names |= {n.id for n in nodes if isinstance(n, ast.Name)}
        timed = sorted(n for n in names if TIMED.search(n) and "busy" not in n)  # busy time: CPU, not wall
        if timed:
            found.append((node.lineno, " ".join(ast.get_source_segment(source, node.test).split()), timed))
    return found


def test_the_reader_finds_a_wall_clock_assert_and_passes_a_busy_time_one():
    # catches: a reader that flags nothing (this test then passes whatever the chapters assert)
    source = ('assert rows[-1]["step_ms"] > 1.5 * rows[0]["step_ms"], rows\n'
              'assert slow["straggler_busy_ms"] > slow["fast_busy_ms"]\n'
              'assert sweep.slope_s > 0\n'
              'assert counted == formula\n')
    assert [(line, names) for line, _, names in timed_asserts(source)] == [(1, ["step_ms"]), (3, ["slope_s"])]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem[:2])
def test_no_wall_clock_assert_outside_the_busy_machine_test(script):
    # catches: a chapter that asserts a measured time (Run All then stops on a busy workshop server,
    # skipping every exercise after it), unless that chapter runs beside burners in test_busy_machine
    if f"notebooks/{script.stem}.ipynb" in RUN_BESIDE_BURNERS:
        pytest.skip("run beside 8 burners by tests/test_busy_machine.py")
    bad = [f"line {line}: assert {text}  (reads {', '.join(names)})"
           for line, text, names in timed_asserts(script.read_text(encoding="utf-8"))
           if (script.stem, text) not in BOUNDS]
    assert not bad, (f"{script.name} asserts on the wall clock; print it with timed_claim, assert bytes, "
                     "busy time or the order of events, or list a bound no load can break in BOUNDS:\n"
                     + "\n".join(bad))


def test_every_listed_bound_is_still_in_its_chapter():
    # catches: an entry left behind when its assert changed, which would let a new one pass unread
    asserted = {(p.stem, text) for p in SCRIPTS
                for _, text, _ in timed_asserts(p.read_text(encoding="utf-8"))}
    assert set(BOUNDS) <= asserted, sorted(set(BOUNDS) - asserted)
