"""Run the tests of recently changed code first (tests/conftest.py), so that a contributor's failure
shows in the first minute rather than after every chapter before it in the alphabet.

A test file's recency is the newest of: the file itself and every ``lesson_lib`` module it imports,
each dated by its last commit, or now when it has uncommitted changes. Files keep their own order
within, and ties keep pytest's order; ``LESSON_LIB_TEST_ORDER=alphabetical`` turns this off.
"""

from __future__ import annotations

import ast
import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def changed_at() -> dict[str, float]:
    """Repository path -> when it last changed: its last commit's time (the last 200 commits), or
    now for uncommitted changes."""
    when: dict[str, float] = {}
    stamp = None
    for line in _git("log", "-200", "--format=@%ct", "--name-only").splitlines():
        if line.startswith("@"):
            stamp = float(line[1:])
        elif line and stamp is not None:
            when.setdefault(line, stamp)
    now = time.time()
    for line in _git("status", "--porcelain").splitlines():
        when[line[3:].split(" -> ")[-1]] = now
    return when


def _module_paths(name: str, expand: bool) -> set[str]:
    """A dotted name's file: a module's ``.py``; a package's ``__init__.py``, or with ``expand`` the
    whole folder (``dir/``); nothing when the name is an attribute, not a module."""
    rel = name.replace(".", "/")
    if (ROOT / f"{rel}.py").exists():
        return {f"{rel}.py"}
    if (ROOT / rel).is_dir():
        return {rel + "/"} if expand else {f"{rel}/__init__.py"}
    return set()


def _imports(path: Path) -> set[str]:
    """The ``lesson_lib`` modules a test file imports, as repository paths: the most specific name
    each import gives (a package imported as a whole counts for all of its files; one it imports a
    name from, for its ``__init__.py`` only)."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return set()
    paths: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lesson_lib"):
            for alias in node.names:
                found = _module_paths(f"{node.module}.{alias.name}", expand=True)
                paths |= found or _module_paths(node.module, expand=False)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("lesson_lib"):
                    paths |= _module_paths(alias.name, expand=alias.name != "lesson_lib")
    return paths


def recency(test_file: Path, when: dict[str, float]) -> float:
    own = [when.get(os.path.relpath(test_file, ROOT), 0.0)]
    for dep in _imports(test_file):
        if dep.endswith("/"):
            own += [t for p, t in when.items() if p.startswith(dep)]
        else:
            own.append(when.get(dep, 0.0))
    return max(own)


def order(items: list) -> list:
    """``items`` (pytest's), whole files at a time, the most recently changed code first."""
    if os.environ.get("LESSON_LIB_TEST_ORDER", "").lower() == "alphabetical":
        return items
    when = changed_at()
    if not when:  # not a git checkout: leave pytest's order
        return items
    files: dict[Path, float] = {}
    for item in items:
        path = Path(str(item.fspath))
        if path not in files:
            files[path] = recency(path, when) if path.suffix == ".py" else 0.0
    first = {p: i for i, p in enumerate(files)}
    return sorted(items, key=lambda it: (-files[Path(str(it.fspath))], first[Path(str(it.fspath))]))
