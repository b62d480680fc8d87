"""An exercise is asked before the page shows its answer (issue 59 item 3).

Each row: a chapter, an exercise, and a line of the page that answers it (the library's version shown
from its source, or a cell that writes it out). The exercise's cell must come first, so that a learner
running top to bottom meets the question before the answer. Read from the stored notebooks, the
cells in their order.
"""

import json
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"

ANSWERED_BY = [
    ("09_fp8.ipynb", "cast", "def my_scaled_cast("),
    ("09_fp8.ipynb", "cast", "show_source(scaling."),
    ("10_resilience.ipynb", "exchange", "show_source(ft_step.exchange)"),
    ("10_resilience.ipynb", "outer", "def my_diloco("),
    ("10_resilience.ipynb", "outer", "show_source(ft_diloco"),
    ("08_beyond_data_parallel.ipynb", "plan", "show_source(tp.dtensor.plan)"),
]


def _cells(name: str) -> list[str]:
    nb = json.loads((NOTEBOOKS / name).read_text())
    return ["".join(c["source"]) for c in nb["cells"]]


def _first(cells: list[str], text: str) -> int | None:
    return next((i for i, c in enumerate(cells) if text in c), None)


@pytest.mark.parametrize("name, key, answer", ANSWERED_BY, ids=lambda v: v if isinstance(v, str) else "")
def test_the_exercise_is_asked_before_the_page_answers_it(name, key, answer):
    cells = _cells(name)
    asked = _first(cells, f'exercises["{key}"]')
    shown = _first(cells, answer)
    assert asked is not None, f"{name}: exercises[{key!r}] is never shown"
    if shown is not None:
        assert asked < shown, f"{name}: cell {shown} ({answer!r}) answers {key!r}, asked only in cell {asked}"


def test_each_row_still_finds_its_answer_on_the_page():
    # a renamed function would make a row pass vacuously: each answer must still be on its page
    missing = [(n, a) for n, _, a in ANSWERED_BY if _first(_cells(n), a) is None]
    assert not missing, missing
