"""Packaging checks: pins agree between pyproject.toml and environment.yml, and
notebooks are committed without outputs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
ENVIRONMENT = ROOT / "environment.yml"
NOTEBOOKS = ROOT / "notebooks"

TORCH_PIN = "2.13.0"

_PINNED = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*==\s*(?P<version>[^\s;,]+)\s*(?:;.*)?$"
)


def normalize(name: str) -> str:
    """Lowercase, with runs of ``-``, ``_`` and ``.`` folded to ``-`` (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_pins(requirements: list[str], source: str) -> dict[str, str]:
    """Map normalized name -> version for ``name==version`` lines; anything else fails."""
    pins: dict[str, str] = {}
    for req in requirements:
        match = _PINNED.match(req.strip())
        assert match, f"{source}: {req!r} is not pinned as name==version"
        name = normalize(match["name"])
        assert name not in pins, f"{source}: {name} is listed twice"
        pins[name] = match["version"]
    return pins


def pyproject_pins(path: Path = PYPROJECT) -> dict[str, str]:
    project = tomllib.loads(path.read_text(encoding="utf-8"))["project"]
    requirements = list(project.get("dependencies", []))
    requirements += project.get("optional-dependencies", {}).get("dev", [])
    return parse_pins(requirements, path.name)


def _strip_comment(line: str) -> str:
    return re.sub(r"\s+#.*$", "", line).rstrip()


def parse_environment(text: str) -> dict:
    """A tiny parser for the subset of YAML that environment.yml uses.

    Returns {"name": str | None, "channels": [...], "conda": [...], "pip": [...]}.
    """
    result: dict = {"name": None, "channels": [], "conda": [], "pip": []}
    section = None  # top-level key we are in
    pip_indent = None  # indentation of the "- pip:" item while inside its list
    for raw in text.splitlines():
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        line = _strip_comment(raw)
        indent = len(line) - len(line.lstrip())
        stripped = line.strip()
        if indent == 0:
            key, _, value = stripped.partition(":")
            section, pip_indent = key.strip(), None
            if section == "name":
                result["name"] = value.strip().strip("'\"")
            continue
        if not stripped.startswith("- "):
            continue
        item = stripped[2:].strip().strip("'\"")
        if section == "channels":
            result["channels"].append(item)
        elif section == "dependencies":
            if pip_indent is not None and indent > pip_indent:
                result["pip"].append(item)
                continue
            pip_indent = None
            if item == "pip:":
                pip_indent = indent
            else:
                result["conda"].append(item)
    return result


def environment() -> dict:
    return parse_environment(ENVIRONMENT.read_text(encoding="utf-8"))


def environment_pins(env: dict) -> dict[str, str]:
    requirements = [r for r in env["pip"] if not r.startswith("-e ")]
    return parse_pins(requirements, ENVIRONMENT.name)


# --- pins ------------------------------------------------------------------------------------------


def test_environment_yml_matches_pyproject_pins():
    project = pyproject_pins()
    conda = environment_pins(environment())
    only_pyproject = sorted(set(project) - set(conda))
    only_environment = sorted(set(conda) - set(project))
    assert not only_pyproject, f"in pyproject.toml but not environment.yml: {only_pyproject}"
    assert not only_environment, f"in environment.yml but not pyproject.toml: {only_environment}"
    differing = {n: (project[n], conda[n]) for n in project if project[n] != conda[n]}
    assert not differing, f"pins differ (pyproject, environment.yml): {differing}"


def test_environment_yml_installs_course_editable():
    env = environment()
    assert env["name"] == "distributed-training-course"
    assert "conda-forge" in env["channels"]
    assert "python=3.11" in env["conda"]
    assert "pip" in env["conda"]
    assert "-e ." in env["pip"]


def test_torch_is_pinned():
    assert pyproject_pins().get("torch") == TORCH_PIN
    assert environment_pins(environment()).get("torch") == TORCH_PIN


def test_the_workshop_extra_is_pinned_and_stays_off_laptops():
    """The hub's own packages (``.[workshop]``, docs/workshop.md) are pinned, JupyterHub at 6.x, and
    neither the laptop's install (dependencies, dev) nor environment.yml carries them."""
    extras = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    workshop = parse_pins(extras["workshop"], "pyproject.toml [workshop]")
    assert {"jupyterhub", "jupyterhub-idle-culler", "configurable-http-proxy"} <= set(workshop)
    assert workshop["jupyterhub"].split(".")[0] == "6"
    assert not set(workshop) & set(pyproject_pins()), "a hub package in the laptop's install"
    assert not set(workshop) & set(environment_pins(environment())), "a hub package in environment.yml"


def test_pin_comparison_detects_mismatch():
    """The parser and comparison really see a differing pin and a missing package."""
    env = parse_environment(
        "name: x\nchannels:\n  - conda-forge\ndependencies:\n  - python=3.11\n  - pip\n"
        "  - pip:\n      - Torch==2.0.0  # comment\n      - -e .\n  - numpy\n"
    )
    assert env["conda"] == ["python=3.11", "pip", "numpy"]
    assert env["pip"] == ["Torch==2.0.0", "-e ."]
    pins = environment_pins(env)
    assert pins == {"torch": "2.0.0"}
    assert pins != pyproject_pins()
    assert normalize("Jupyter_Server") == normalize("jupyter-server")
    with pytest.raises(AssertionError):
        parse_pins(["numpy>=2"], "example")


# --- notebooks -------------------------------------------------------------------------------------


def dirty_cells(notebook: dict) -> list[str]:
    """Describe each code cell that carries outputs or an execution count."""
    problems = []
    for index, cell in enumerate(notebook.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        if cell.get("outputs"):
            problems.append(f"cell {index}: {len(cell['outputs'])} output(s)")
        if cell.get("execution_count") is not None:
            problems.append(f"cell {index}: execution_count={cell['execution_count']}")
    return problems


def test_notebooks_are_stored_without_outputs():
    notebooks = sorted(NOTEBOOKS.glob("*.ipynb"))
    assert notebooks, f"no notebooks found in {NOTEBOOKS}"
    dirty = {}
    for path in notebooks:
        problems = dirty_cells(json.loads(path.read_text(encoding="utf-8")))
        if problems:
            dirty[path.name] = problems
    assert not dirty, f"notebooks stored with outputs (run `make clean-notebooks`): {dirty}"


def test_dirty_notebook_is_detected():
    notebook = {
        "cells": [
            {"cell_type": "markdown", "source": "x", "metadata": {}},
            {"cell_type": "code", "source": "1", "outputs": [], "execution_count": None},
            {"cell_type": "code", "source": "2", "outputs": [{"output_type": "stream"}],
             "execution_count": 3},
        ]
    }
    assert dirty_cells(notebook) == ["cell 2: 1 output(s)", "cell 2: execution_count=3"]


# --- one source per notebook: the jupytext pair ------------------------------------------------


def _cells(nb) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source.strip()) for c in nb.cells]


def pair_differences(ipynb: Path, script: Path) -> list[str]:
    """Cells that differ between a notebook and its percent-format script (empty: in sync)."""
    import jupytext

    a, b = _cells(jupytext.read(ipynb)), _cells(jupytext.read(script))
    out = [f"{ipynb.name} has {len(a)} cells, {script.name} {len(b)}"] if len(a) != len(b) else []
    out += [f"cell {i}: {x[1][:60]!r} ≠ {y[1][:60]!r}" for i, (x, y) in enumerate(zip(a, b)) if x != y]
    return out


def test_every_notebook_is_paired_with_a_script_in_sync():
    notebooks = sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))
    assert notebooks
    for path in notebooks:
        script = NOTEBOOKS / "scripts" / f"{path.stem}.py"  # beside, not among, the notebooks
        assert script.exists(), f"{path.name} has no paired script (run `make sync-notebooks`)"
        meta = json.loads(path.read_text(encoding="utf-8"))["metadata"]
        assert meta.get("jupytext", {}).get("formats") == "ipynb,scripts//py:percent", path.name
        diff = pair_differences(path, script)
        assert not diff, f"{path.name} and {script.name} differ (run `make sync-notebooks`): {diff[:3]}"


def test_a_stale_pair_is_detected(tmp_path):
    src = sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))[0]
    script = tmp_path / "x.py"
    paired = NOTEBOOKS / "scripts" / f"{src.stem}.py"
    script.write_text(paired.read_text(encoding="utf-8") + "\n# %%\nprint('new cell')\n")
    assert pair_differences(src, script)


def test_makefile_pins_the_same_torch():
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^TORCH_VERSION := (\S+)$", text, re.M).group(1) == TORCH_PIN


def test_the_start_page_links_every_chapter_and_make_lab_opens_it():
    text = (NOTEBOOKS / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)]+\.ipynb)\)", text)
    assert links and all((NOTEBOOKS / link).exists() for link in links), links
    assert sorted(links) == sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))  # chapters, the room's learner
    assert "--LabApp.default_url=/lab/tree/README.md" in (ROOT / "Makefile").read_text(encoding="utf-8")


def test_the_run_all_table_is_reachable_from_jupyterlab():
    """JupyterLab opens on notebooks/, which cannot reach ../benchmarks: the chapters link
    notebooks/run-all.md, a copy that benchmarks/run_all_table.py writes beside the original."""
    root = Path(__file__).resolve().parents[1]
    copy, original = root / "notebooks" / "run-all.md", root / "benchmarks" / "run-all.md"
    assert copy.read_text(encoding="utf-8") == original.read_text(encoding="utf-8")
    for script in sorted((root / "notebooks" / "scripts").glob("[0-9][0-9]_*.py")):
        text = script.read_text(encoding="utf-8")
        assert "benchmarks/run-all.md" not in text, f"{script.name} links a page JupyterLab cannot open"
