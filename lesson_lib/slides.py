"""Each chapter as a slideshow (jupyterlab-rise): slide metadata on the cells that carry the story.

The same notebook is the lesson and the talk. A section (``## ``) opens a slide, a subsection
(``### ``) a sub-slide below it; prose that follows a result opens a sub-slide too, so a slide holds
one idea and what shows it. Collapsed asides (``<details>``) and the chapter's closing summary of
exercises are speaker notes. ``python -m lesson_lib slides`` writes the metadata into every notebook
(the jupytext pairs keep it in their cell headers); ``--check`` fails when a notebook lacks it.
Present with the workshop extra (``pip install .[workshop]`` brings jupyterlab-rise): open a
chapter, then View → Render as slideshow, or ``/rise/<path>`` beside ``/lab``.
"""

from __future__ import annotations

import glob
import json
import os

# RISE's own options (notebook metadata "rise"): a slide taller than the screen scrolls rather than
# being cut, and the notebook's own styles and widgets are kept.
RISE = {"scroll": True, "autolaunch": False, "enable_chalkboard": False, "transition": "none"}
KINDS = ("slide", "subslide", "fragment", "skip", "notes", "-")


def slide_type(cell: dict, previous: dict | None) -> str:
    """The ``slideshow.slide_type`` of ``cell`` given the cell before it (``None`` for the first)."""
    text = "".join(cell.get("source", "")) if isinstance(cell.get("source"), list) else cell.get("source", "")
    text = text.lstrip()
    if cell.get("cell_type") == "markdown":
        if previous is None or text.startswith("# ") or text.startswith("## "):
            return "slide"
        if text.startswith("<details>"):
            return "notes"
        if text.startswith("### ") or (previous or {}).get("cell_type") == "code":
            return "subslide"
        return "-"
    if not text:  # an empty code cell: nothing to show
        return "skip"
    return "-"


def mark(nb: dict) -> dict:
    """``nb`` with every cell's slide type set (in place, and returned)."""
    previous = None
    for cell in nb.get("cells", []):
        kind, meta = slide_type(cell, previous), cell.setdefault("metadata", {})
        if kind == "-":  # RISE's default: the cell continues the slide; no metadata to carry
            meta.pop("slideshow", None)
        else:
            meta["slideshow"] = {"slide_type": kind}
        previous = cell
    nb.setdefault("metadata", {})["rise"] = dict(RISE)
    return nb


def slides(nb: dict) -> int:
    """How many slides and sub-slides ``nb`` shows (what a presenter steps through)."""
    return sum(c.get("metadata", {}).get("slideshow", {}).get("slide_type") in ("slide", "subslide")
               for c in nb.get("cells", []))


def main(argv: list[str]) -> int:
    """``python -m lesson_lib slides [--check] [NOTEBOOK ...]`` (default: every chapter)."""
    check = "--check" in argv
    paths = ([a for a in argv if a != "--check"]
             or sorted(glob.glob(os.path.join("notebooks", "[0-9]*.ipynb"))))
    if not paths:
        print("slides: no notebooks found (run from the repository root or name them)")
        return 2
    stale = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            nb = json.load(f)
        marked = mark(json.loads(json.dumps(nb)))
        if marked != nb:
            stale.append(path)
            if not check:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(json.dumps(marked, indent=1, ensure_ascii=False) + "\n")
        print(f"{path}: {slides(marked)} slides" + (" (stale)" if marked != nb else ""))
    if check and stale:
        print("slides: run `python -m lesson_lib slides` then `make sync-notebooks`: " + ", ".join(stale))
        return 1
    return 0
