"""A thread that raises fails the test that started it (pyproject's filterwarnings), rather than
leaving it green with a warning: a crashed lighthouse or link thread must not pass unseen."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.ch10


@pytest.mark.slow
def test_a_crashed_thread_fails_its_test(tmp_path):
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "import threading\n\n"
        "def test_thread_raises():\n"
        "    t = threading.Thread(target=lambda: 1 / 0)\n"
        "    t.start()\n"
        "    t.join()\n\n"
        "def test_quiet_thread():\n"
        "    t = threading.Thread(target=lambda: None)\n"
        "    t.start()\n"
        "    t.join()\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-c", str(ROOT / "pyproject.toml"),
                           "--rootdir", str(tmp_path), "-p", "no:cacheprovider", str(probe)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "1 failed, 1 passed" in proc.stdout, proc.stdout[-3000:]
    assert "ZeroDivisionError" in proc.stdout
