"""Render the browser test's Run All times as benchmarks/run-all.md.

The browser test (tests/test_browser.py) merges each chapter's last passing run into
artifacts/browser/run_all_times.json: one entry per notebook, with its date, the machine, `nproc`,
the load before Run All and the command. This script turns that file into one table; the figures
in run-all.md come from there only, never typed by hand.

    make test                                                    # every chapter, or one:
    BROWSER_TEST_NOTEBOOK=05_large_batch.ipynb .venv/bin/pytest tests/test_browser.py
    .venv/bin/python benchmarks/run_all_table.py   # then commit benchmarks/ and notebooks/run-all.md
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMES = ROOT / "artifacts" / "browser" / "run_all_times.json"
OUT = ROOT / "benchmarks" / "run-all.md"
COPY = ROOT / "notebooks" / "run-all.md"  # JupyterLab opens on notebooks/: the chapters link this copy
NOTEBOOKS = ROOT / "notebooks"

COLUMNS = [  # (heading, key in an entry)
    ("Run All (s)", "run_all_s"),
    ("a control used (s)", "control_s"),
    ("opened → control used (s)", "open_to_control_s"),
    ("date", "date"),
    ("nproc", "nproc"),
    ("load before (1 min)", "load_1min"),
    ("CI", "ci"),
    ("machine", "machine"),
    ("command", "command"),
]


def _cell(key: str, value) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    text = str(value).replace("|", "\\|")
    return f"`{text}`" if key == "command" else text


def render(times: dict, chapters: list[str], today: str) -> str:
    """The markdown page: one row per notebook with an entry, in chapter order, then the missing."""
    names = [c for c in chapters if c in times] + sorted(set(times) - set(chapters))
    missing = [c for c in chapters if c not in times]
    lines = [
        "# Run All times, chapter by chapter",
        "",
        f"Generated on {today} by `python benchmarks/run_all_table.py` from",
        "`artifacts/browser/run_all_times.json`, which the browser test (`tests/test_browser.py`) writes:",
        "each chapter's last passing run in a real JupyterLab in headless Chromium. *Run All* runs from",
        "Run → Run All Cells until every cell has run (the kernel's start not included); *a control used*",
        "is the chapter's calculator or explorer used once afterwards; *opened → control used* counts from",
        "opening the notebook, its kernel's start included. *load before* is the 1-minute load average",
        "when Run All began: other jobs on the same cores stretch every figure. Exercises come on top.",
        "",
        "Do not edit by hand: run the command of a row (`make test` runs every chapter), then this script.",
        "",
    ]
    if names:
        lines += ["| chapter | " + " | ".join(h for h, _ in COLUMNS) + " |",
                  "|---|" + "---|" * len(COLUMNS)]
        for name in names:
            entry = times[name]
            lines.append(f"| `{name}` | " + " | ".join(_cell(k, entry.get(k)) for _, k in COLUMNS) + " |")
        lines.append("")
    if missing:
        lines += [f"No entry yet: {', '.join(f'`{c}`' for c in missing)}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=TIMES, help=f"the browser test's file ({TIMES})")
    parser.add_argument("--out", type=Path, default=OUT, help=f"the page to write ({OUT})")
    args = parser.parse_args(argv)
    try:
        times = json.loads(args.json.read_text(encoding="utf-8"))
    except FileNotFoundError:
        print(f"{args.json} does not exist: run the browser test first (make test, or "
              "BROWSER_TEST_NOTEBOOK=<name>.ipynb pytest tests/test_browser.py)", file=sys.stderr)
        return 1
    chapters = sorted(p.name for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    page = render(times, chapters, time.strftime("%Y-%m-%d"))
    args.out.write_text(page, encoding="utf-8")
    if args.out == OUT:
        COPY.write_text(page, encoding="utf-8")
    print(f"wrote {args.out}" + (f" and {COPY}" if args.out == OUT else "") + f": {len(times)} notebook(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
