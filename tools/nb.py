"""Tiny helper to write a clean notebook from a list of (kind, source) cells.

Notebooks are the source of truth once written; this only saves hand-editing JSON.
Usage from a chapter's builder: ``write("notebooks/x.ipynb", [("md", "..."), ("code", "...")])``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def write(path: str, cells: list[tuple[str, str]]) -> None:
    out = []
    for kind, src in cells:
        src = src.strip("\n")
        cell = {"cell_type": "markdown" if kind == "md" else "code", "metadata": {},
                "source": src.splitlines(keepends=True)}
        if kind != "md":
            cell.update(execution_count=None, outputs=[])
        out.append(cell)
    nb = {"cells": out, "metadata": {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}
    for i, c in enumerate(nb["cells"]):
        c["id"] = f"c{i:02d}"
    Path(path).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    sys.exit("import this module from a builder script")
