"""`make wheelhouse` wrote every wheel the course needs: pip resolves the whole install from that folder
alone (`--no-index`, the machine's pip configuration and extra links ignored, and as root no network
at all), to the pinned versions.

Opt-in, as building the folder takes minutes and ~370 MB: `make wheelhouse WHEELHOUSE=dir`, then
`WHEELHOUSE=dir pytest tests/test_wheelhouse.py`. Without WHEELHOUSE it is skipped, in CI too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def _pins() -> dict[str, str]:
    """name -> version of every pin in pyproject.toml: dependencies, dev and workshop extras."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    reqs = project["dependencies"] + project["optional-dependencies"]["dev"] + \
        project["optional-dependencies"]["workshop"]
    return {re.sub(r"[-_.]+", "-", r.split("==")[0]).lower(): r.split("==")[1] for r in reqs}


def test_the_whole_install_resolves_from_the_wheelhouse_alone(tmp_path):
    folder = os.environ.get("WHEELHOUSE")
    if not folder:
        pytest.skip("set WHEELHOUSE to a folder `make wheelhouse` wrote")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # no index or find-links from this machine's pip.conf
    offline = ["unshare", "--net"] if os.geteuid() == 0 and shutil.which("unshare") else []
    report = tmp_path / "report.json"
    torch = next(f"torch=={v}" for n, v in _pins().items() if n == "torch")
    out = subprocess.run([*offline, sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
                          "--no-index", "--find-links", folder, "--report", str(report), torch,
                          "-e", f"{ROOT}[dev,workshop]"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    installed = {re.sub(r"[-_.]+", "-", i["metadata"]["name"]).lower(): i["metadata"]["version"]
                 for i in json.loads(report.read_text())["install"]}
    wrong = {n: (v, installed.get(n)) for n, v in _pins().items() if installed.get(n, "").split("+")[0] != v}
    assert not wrong, f"not resolved to the pins from {folder}: {wrong}"
    print(f"{len(installed)} packages resolved from {folder} alone{' (no network)' if offline else ''}")
