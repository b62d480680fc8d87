"""The course installed once for every learner: a snapshot of the checkout and a venv, read-only.

Learners are other Unix users, so the install must be readable by them: the project's ``.venv`` may be
built from a Python under ``/root`` (mode 0700), which they cannot run. The venv here is made from a
Python every user can run, and the course is a root-owned copy (``PREFIX/course``) installed editable,
so ``lesson_lib``'s ``data/`` and ``benchmarks/records/`` resolve inside it. Bytecode is compiled here,
as root: a learner's import never tries to write into the install. Redone only when the copy changes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

# What a learner's kernel and the hub read from the checkout; nothing else is copied.
PARTS = ["pyproject.toml", "README.md", "lesson_lib", "notebooks", "data", "benchmarks/records"]
IGNORE = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints", "*.pyc")
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # as the Makefile's `make install`
# JupyterLab opens Markdown in the preview (the table of contents) and checks nothing online.
LAB_OVERRIDES = {
    "@jupyterlab/docmanager-extension:plugin": {"defaultViewers": {"markdown": "Markdown Preview"}},
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
}
PIP_TIMEOUT_S = 1800  # torch is ~200 MB; a stalled download ends here instead of hanging the serve


def readable_by_all(path: str) -> bool:
    """True if every user can run ``path``: the file o+rx and each folder above it o+x."""
    p = Path(os.path.realpath(path))
    if not p.is_file() or not p.stat().st_mode & stat.S_IXOTH or not p.stat().st_mode & stat.S_IROTH:
        return False
    return all(d.stat().st_mode & stat.S_IXOTH for d in p.parents)


def shared_python(candidates: list[str] | None = None) -> str:
    """A Python ≥ 3.11 with ``venv`` that every learner can run (this one, else the system's)."""
    for exe in candidates or [sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"]:
        if not readable_by_all(exe):
            continue
        probe = subprocess.run([exe, "-c", "import sys, venv; print(sys.version_info >= (3, 11))"],
                               capture_output=True, text=True, timeout=30)
        if probe.stdout.strip() == "True":
            return exe
    raise SystemExit("no Python >= 3.11 with venv that every user can run (install python3-venv)")


def fingerprint(root: Path) -> str:
    """A hash of every file in PARTS under ``root`` (paths and contents): the install's version."""
    h = hashlib.sha256()
    for part in PARTS:
        base = root / part
        files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())
        for f in files:
            rel = f.relative_to(root).as_posix()
            if "__pycache__" in rel or ".ipynb_checkpoints" in rel or rel.endswith(".pyc"):
                continue
            h.update(rel.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def torch_pin(pyproject: Path) -> str:
    """The ``torch==X`` requirement of the course (pyproject.toml pins it)."""
    match = re.search(r'"(torch==[^"]+)"', pyproject.read_text(encoding="utf-8"))
    if not match:
        raise SystemExit(f"{pyproject}: no torch==VERSION pin")
    return match.group(1)


def default_torch_index() -> str | None:
    """PyTorch's CPU-only index on Linux without an NVIDIA GPU (the Makefile's rule), else None."""
    return TORCH_CPU_INDEX if sys.platform == "linux" and not shutil.which("nvidia-smi") else None


def pip_source(wheelhouse: str | None, index: str | None) -> list[str]:
    """pip's options: a wheelhouse alone (no network), or the extra torch index."""
    if wheelhouse:
        return ["--no-index", "--find-links", str(Path(wheelhouse).resolve())]
    return ["--extra-index-url", index] if index else []


def _copy_course(src: Path, dest: Path) -> None:
    tmp = dest.with_name(dest.name + ".new")
    shutil.rmtree(tmp, ignore_errors=True)
    for part in PARTS:
        s, d = src / part, tmp / part
        d.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(s, d, ignore=IGNORE) if s.is_dir() else shutil.copy2(s, d)
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)


def _make_readable(root: Path) -> None:
    """Owned by the installer, readable by all, writable by no one else (umask may have been 077)."""
    for dirpath, _, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                mode = os.stat(p).st_mode
                os.chmod(p, 0o755 if mode & 0o100 else 0o644)


def _run(cmd: list[str], log) -> None:
    print("+", " ".join(cmd), file=log, flush=True)
    subprocess.run(cmd, check=True, timeout=PIP_TIMEOUT_S, stdout=log, stderr=subprocess.STDOUT)


def _compile_and_open(venv: Path, course: Path) -> None:
    """Bytecode written now, as the installer (a learner's import cannot write it), then opened."""
    subprocess.run([str(venv / "bin" / "python"), "-m", "compileall", "-q", str(course / "lesson_lib")],
                   check=True, timeout=300, stdout=subprocess.DEVNULL)
    _make_readable(course)


def ensure(prefix: str | Path, src: str | Path, wheelhouse: str | None = None,
           torch_index: str | None = "auto", python: str | None = None, log=None) -> Path:
    """Install the course from checkout ``src`` under ``prefix`` unless it is there already;
    returns the venv's folder. ``torch_index="auto"`` follows the Makefile's rule."""
    prefix, src, log = Path(prefix).resolve(), Path(src).resolve(), log or sys.stderr
    venv, course, stamp = prefix / "venv", prefix / "course", prefix / "installed.json"
    want = {"course": fingerprint(src), "pyproject": hashlib.sha256((src / "pyproject.toml").read_bytes())
            .hexdigest(), "wheelhouse": bool(wheelhouse)}
    try:
        have = json.loads(stamp.read_text()) if (venv / "bin" / "jupyterhub").exists() else {}
    except (OSError, ValueError):
        have = {}
    if have == want:
        return venv
    if have and {**have, "course": want["course"]} == want:  # only the course changed: no pip
        _copy_course(src, course)
        _compile_and_open(venv, course)
        stamp.write_text(json.dumps(want))
        return venv
    index = default_torch_index() if torch_index == "auto" else torch_index
    print(f"workshop: installing the course for every learner in {prefix} (minutes, once)",
          file=log, flush=True)
    prefix.mkdir(parents=True, exist_ok=True)
    os.chmod(prefix, 0o755)
    _copy_course(src, course)
    if not (venv / "bin" / "python").exists():
        _run([python or shared_python(), "-m", "venv", str(venv)], log)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check"]
    _run([*pip, "--no-deps", torch_pin(course / "pyproject.toml"), *pip_source(wheelhouse, index)], log)
    _run([*pip, *pip_source(wheelhouse, None), "-e", f"{course}[workshop]"], log)
    settings = venv / "share" / "jupyter" / "lab" / "settings"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "overrides.json").write_text(json.dumps(LAB_OVERRIDES, indent=1))
    _compile_and_open(venv, course)
    _make_readable(venv)
    stamp.write_text(json.dumps(want))
    return venv
