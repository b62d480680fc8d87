"""The quick loop runs the tests of recently changed code first (tests/recent_first.py)."""

from pathlib import Path

import pytest
import recent_first as rf

pytestmark = pytest.mark.ch0


def test_a_test_file_is_as_recent_as_the_newest_code_it_imports(tmp_path, monkeypatch):
    monkeypatch.setattr(rf, "ROOT", Path(__file__).resolve().parent.parent)
    probe = rf.ROOT / "tests" / "test_share.py"  # imports lesson_lib.runtime's idle, placement, pool
    assert "lesson_lib/runtime/idle.py" in rf._imports(probe)
    when = {"lesson_lib/runtime/idle.py": 200.0, "lesson_lib/costmodel/plan.py": 300.0,
            "tests/test_share.py": 100.0}
    assert rf.recency(probe, when) == 200.0  # idle.py, not plan.py, which it does not import
    assert rf.recency(rf.ROOT / "tests" / "test_costmodel_varied.py", when) == 300.0  # a package: any file


def test_whole_files_move_together_newest_first(monkeypatch):
    class Item:
        def __init__(self, path, name):
            self.fspath, self.name = path, name

    a, b = rf.ROOT / "tests" / "test_a.py", rf.ROOT / "tests" / "test_b.py"
    items = [Item(a, "a1"), Item(a, "a2"), Item(b, "b1"), Item(b, "b2")]
    monkeypatch.setattr(rf, "changed_at", lambda: {"tests/test_b.py": 5.0, "tests/test_a.py": 1.0})
    assert [i.name for i in rf.order(items)] == ["b1", "b2", "a1", "a2"]
    monkeypatch.setenv("LESSON_LIB_TEST_ORDER", "alphabetical")
    assert [i.name for i in rf.order(items)] == ["a1", "a2", "b1", "b2"]
