"""Every exercise's folded Solution, submitted as a learner would copy it, is accepted.

Code solutions are run in a namespace holding the chapter notebook's own imports (what a learner
pasting the Solution into that notebook has), then submitted to the checker, on real ranks where the
checker runs them. A Solution in prose must state the reference answer for the exercise as posed
(chapter 6's top-k Solution once gave N = 4's numbers under an N = 8 prompt): the numbers it states,
closest to the reference's, are submitted.
"""

import ast
import re
from pathlib import Path

import pytest

from lesson_lib import close_all
from lesson_lib.chapters import (
    ch00_exercises,
    ch01,
    ch02_exercises,
    ch03_exercises,
    ch04_exercises,
    ch05_exercises,
    ch06_exercises,
    ch07_exercises,
    ch08_exercises,
    ch09_exercises,
    ch10_exercises,
)

SCRIPTS = Path(__file__).resolve().parents[1] / "notebooks" / "scripts"
CHAPTERS = {  # the chapter's exercises as its notebook builds them (measured numbers replaced by fixed ones)
    "00": lambda: ch00_exercises.exercises(),
    "01": lambda: ch01.exercises(),
    "02": lambda: ch02_exercises.exercises(alpha=3e-5, beta=2e-9, world_size=4),
    "03": lambda: ch03_exercises.exercises(stages=4),
    "04": lambda: ch04_exercises.exercises(),
    "05": lambda: ch05_exercises.exercises(),
    "06": lambda: ch06_exercises.exercises(),
    "07": lambda: ch07_exercises.exercises(),
    "08": lambda: ch08_exercises.exercises(),
    "09": lambda: ch09_exercises.exercises(),
    "10": lambda: ch10_exercises.exercises(),
}
CASES = [(ch, key) for ch, make in CHAPTERS.items() for key in make()]
NUMBER = re.compile(r"(?<![\w.])[-−]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?", re.IGNORECASE)


@pytest.fixture(scope="module", autouse=True)
def _close_clusters():
    yield
    close_all()


def _is_code(text: str) -> bool:
    try:
        body = ast.parse(text).body
    except SyntaxError:
        return False
    return bool(body) and isinstance(body[0], (ast.FunctionDef, ast.ClassDef))


def _notebook_namespace(chapter: str) -> dict:
    """The notebook's top-level imports, run: the names a pasted Solution can use."""
    script = next(SCRIPTS.glob(f"{chapter}_*.py")).read_text()
    lines = [line.split("#")[0] for line in script.splitlines() if line.startswith(("import ", "from "))]
    namespace = {"__name__": "__main__"}
    exec("\n".join(lines), namespace)
    return namespace


def _numbers(text: str) -> list[float]:
    return [float(m.replace(",", "").replace("−", "-")) for m in NUMBER.findall(text)]


def _as_stated(reference, text: str):
    """The reference answer, each number replaced by the closest the Solution states."""
    if isinstance(reference, (tuple, list)):
        return type(reference)(_as_stated(r, text) for r in reference)
    if isinstance(reference, str):
        assert re.search(rf"(?<!\w){re.escape(reference)}(?!\w)", text), \
            f"the Solution does not state {reference!r}: {text}"
        return reference
    stated = _numbers(text)
    assert stated, f"the Solution states no number, the answer is {reference!r}: {text}"
    closest = min(stated, key=lambda t: abs(t - reference))
    assert abs(closest - reference) <= 0.01 * abs(reference) + 1e-12, \
        f"the Solution states no number near the answer {reference!r}: {text}"
    return type(reference)(closest) if isinstance(reference, int) else closest


def _submit(chapter: str, key: str):
    exercise = CHAPTERS[chapter]()[key]
    text = exercise.solution
    if _is_code(text):
        namespace = _notebook_namespace(chapter)
        exec(compile(text, f"<Solution of {chapter}/{key}>", "exec"), namespace)
        answer = namespace[ast.parse(text).body[0].name]
    else:
        answer = _as_stated(exercise.reference(), text)
    return exercise.submit(answer)


@pytest.mark.slow  # each checker's reference runs in the quick loop (test_exercises_*); this pastes the text
@pytest.mark.parametrize("chapter, key", [c for c in CASES if _is_code(CHAPTERS[c[0]]()[c[1]].solution)])
def test_a_code_solution_pasted_into_its_notebook_is_accepted(chapter, key):
    verdict = _submit(chapter, key)
    assert verdict.ok, verdict.message


@pytest.mark.slow  # three of these checkers train (chapters 1, 3 and 5)
@pytest.mark.parametrize("chapter, key", [c for c in CASES if not _is_code(CHAPTERS[c[0]]()[c[1]].solution)])
def test_a_prose_solution_states_the_answer_the_checker_accepts(chapter, key):
    verdict = _submit(chapter, key)
    assert verdict.ok, verdict.message
