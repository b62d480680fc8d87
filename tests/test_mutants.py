"""The mutation check's own list stays applicable: every mutant's text occurs once in its file, so a
refactor that moves a line makes this fail instead of quietly turning a mutant into a no-op."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("mutants", ROOT / "tests" / "mutants.py")
mutants = sys.modules["mutants"] = importlib.util.module_from_spec(_spec)  # dataclasses need it
_spec.loader.exec_module(mutants)


@pytest.mark.parametrize("m", mutants.MUTANTS, ids=lambda m: m.name)
def test_every_mutant_applies_once_and_changes_its_file(m, tmp_path):
    (tmp_path / m.path).parent.mkdir(parents=True)
    (tmp_path / m.path).write_text((ROOT / m.path).read_text(encoding="utf-8"), encoding="utf-8")
    mutants.apply(m, tmp_path)
    assert (tmp_path / m.path).read_text(encoding="utf-8") != (ROOT / m.path).read_text(encoding="utf-8")


def test_a_mutant_whose_text_is_gone_is_refused(tmp_path):
    (tmp_path / "f.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="0 times"):
        mutants.apply(mutants.Mutant("gone", "f.py", "y = 2", "y = 3", "no such line"), tmp_path)
