"""A timed walk through the course, chapter by chapter, for the instructor's schedules.

    python benchmarks/walk.py > benchmarks/walk.md

What a machine can measure is measured: Run All in a real browser (benchmarks/run-all.md, written by
the browser test) and each exercise's check with its reference answer (the checkers run on real
ranks; `tests/test_solutions.py` submits the same answers). What only a person can do, reading and
writing an answer, is counted (words of prose, exercises) and priced at two stated rates: silent
reading of non-fiction at 238 words a minute (Brysbaert, 2019, a meta-analysis of 190 studies),
halved here for technical prose read beside running code, and EXERCISE_MIN minutes an exercise, an
assumption to replace with a pilot's own times. docs/instructors.md builds its schedules from this.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
READ_WPM = 238 / 2  # Brysbaert 2019's 238 wpm for non-fiction, halved for prose beside code
EXERCISE_MIN = 8.0  # a stated assumption: minutes a learner spends on one exercise


def run_all_seconds() -> dict[str, float]:
    """Chapter file -> Run All seconds, from benchmarks/run-all.md's table."""
    out = {}
    for line in (ROOT / "benchmarks" / "run-all.md").read_text().splitlines():
        m = re.match(r"\| `(\d\d_\w+\.ipynb)` \| ([\d.]+) \|", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def chapter_facts(path: Path) -> dict:
    nb = json.loads(path.read_text())
    words = sum(len("".join(c["source"]).split()) for c in nb["cells"] if c["cell_type"] == "markdown")
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    exercises = [m.group(1) for src in code for m in re.finditer(r'^exercises\["(\w+)"\]$', src, re.M)]
    return {"words": words, "code_cells": len(code), "exercises": exercises}


def check_seconds(chapter: str) -> float | None:
    """Seconds to check every exercise of ``chapter`` with its folded Solution (the checkers' own
    work on real ranks), timed by running tests/test_solutions.py's cases for it."""
    import subprocess

    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k",
                           f"[{chapter[:2]}", str(ROOT / "tests" / "test_solutions.py")], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    return time.monotonic() - t0 if proc.returncode == 0 else None


def main() -> int:
    timed = "--no-checks" not in sys.argv
    runs = run_all_seconds()
    rows = []
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        f = chapter_facts(path)
        read_min = f["words"] / READ_WPM
        ex_min = len(f["exercises"]) * EXERCISE_MIN
        machine_min = (runs.get(path.name, 0.0) + (check_seconds(path.name) or 0.0 if timed else 0.0)) / 60
        rows.append({"chapter": path.stem, "words": f["words"], "exercises": len(f["exercises"]),
                     "run_all_s": runs.get(path.name), "read_min": read_min, "exercise_min": ex_min,
                     "machine_min": machine_min, "total_min": read_min + ex_min + machine_min})
    print("# A timed walk through the course\n")
    print(f"Generated on {time.strftime('%Y-%m-%d')} by `python benchmarks/walk.py > benchmarks/walk.md` "
          "(its docstring says what is measured and what is assumed). Run All: benchmarks/run-all.md "
          "(the browser test, 2-core CI machine). Reading: the markdown's words at "
          f"{READ_WPM:g} words a minute (half of Brysbaert 2019's 238 for non-fiction). Exercises: "
          f"{EXERCISE_MIN:g} minutes each, **an assumption**: replace it with your pilot's times. "
          "*checks* are the checkers' own time with the reference answers, measured"
          + ("." if timed else " (not measured in this run: --no-checks).") + "\n")
    print("| chapter | words | exercises | Run All (s) | reading (min) | exercises (min) | machine (min) "
          "| total (min) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['chapter']} | {r['words']:,} | {r['exercises']} | {r['run_all_s'] or '–'} | "
              f"{r['read_min']:.0f} | {r['exercise_min']:.0f} | {r['machine_min']:.1f} | "
              f"{r['total_min']:.0f} |")
    total = sum(r["total_min"] for r in rows)
    print(f"| **all** | {sum(r['words'] for r in rows):,} | {sum(r['exercises'] for r in rows)} | "
          f"{sum(r['run_all_s'] or 0 for r in rows):.0f} | {sum(r['read_min'] for r in rows):.0f} | "
          f"{sum(r['exercise_min'] for r in rows):.0f} | {sum(r['machine_min'] for r in rows):.1f} | "
          f"{total:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
