"""Every chapter opens with 3–5 objectives and closes with a summary that points to what showed each
one, and a line on real clusters; the table of contents lists the same objectives (one source: the
notebooks, which it must match)."""

import pathlib
import re

import pytest

NOTEBOOKS = pathlib.Path(__file__).resolve().parent.parent / "notebooks"
CHAPTERS = sorted((NOTEBOOKS / "scripts").glob("[0-9][0-9]_*.py"))


def objectives(text: str) -> list[str]:
    block = text.split("# **After this chapter you can:**\n#\n", 1)[1].split("\n#\n", 1)[0]
    return [re.sub(r"^# \d+\. ", "", line) for line in block.splitlines()]


@pytest.mark.parametrize("py", CHAPTERS, ids=lambda p: p.stem)
def test_a_chapter_opens_with_objectives_and_closes_with_a_summary(py):
    text = py.read_text()
    goals = objectives(text)
    assert 3 <= len(goals) <= 5, goals
    assert all(g.endswith((";", ".")) and ("§" in g or "exercise" in g) for g in goals), goals
    assert "# **Before it:**" in text
    summary = text.split("# ## Summary\n", 1)[1].split("# %%", 1)[0]
    points = re.findall(r"^# \d+\. \*\*(.+?)\*\* — (.+)$", summary, re.M)
    assert len(points) >= 3 and all("§" in p or "your" in p for _, p in points), points
    assert "# **On a real cluster:**" in summary
    assert text.index("After this chapter you can") < text.index("# ## Summary")


def test_the_table_of_contents_lists_every_chapters_objectives():
    toc = (NOTEBOOKS / "README.md").read_text()
    for py in CHAPTERS:
        for i, goal in enumerate(objectives(py.read_text()), 1):
            assert f"{i}. {goal}" in toc, (py.stem, goal)
