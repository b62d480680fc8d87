"""Where a learner's JupyterLab starts, run as the learner: their copy of the notebooks, then the server.

JupyterHub's spawner runs ``VENV/bin/python PREFIX/course/lesson_lib/workshop/start.py ARGS`` as the
learner's Unix user. It makes everything the learner creates private (umask 077, a temp folder of
their own for rendezvous folders, sockets and caches), copies the installed notebooks into
``~/course`` on the first start, and then becomes ``jupyterhub-singleuser ARGS``. Run as a file, not
``-m lesson_lib...``: the server starts without importing torch. The hub's host runs the same file
as the learner for ``--reset`` (a clean copy, the old one kept aside) and ``--clean`` (their temp
folder emptied once their processes are gone), and ``--run CMD...`` runs CMD as a kernel of theirs
would run (the isolation test's jobs): root never writes into a learner's home itself, so a
link a learner planted there cannot turn a root write against another file.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

COURSE = Path(__file__).resolve().parents[2]  # PREFIX/course: the read-only install
NOTEBOOKS = COURSE / "notebooks"
IGNORE = shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__")


def paths(home: Path) -> dict[str, Path]:
    """The learner's copy of the course and their private temp folder."""
    return {"course": home / "course", "tmp": home / ".cache" / "lesson-workshop" / "tmp"}


def private_env(home: Path) -> dict[str, str]:
    """TMPDIR (and the names tools read beside it) inside the learner's 0700 home: lesson_lib's
    rendezvous folders, torch's and Python's temp files, Jupyter's runtime files stay theirs."""
    tmp = paths(home)["tmp"]
    tmp.mkdir(mode=0o700, parents=True, exist_ok=True)
    return {"TMPDIR": str(tmp), "TEMP": str(tmp), "TMP": str(tmp),
            "JUPYTER_RUNTIME_DIR": str(home / ".local" / "share" / "jupyter" / "runtime"),
            "MPLCONFIGDIR": str(home / ".cache" / "matplotlib")}


def first_copy(home: Path) -> bool:
    """Copy the notebooks into ``~/course`` if the learner has none; True if it copied."""
    dest = paths(home)["course"]
    if dest.exists():
        return False
    tmp = dest.with_name(".course-copying")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(NOTEBOOKS, tmp, ignore=IGNORE)
    for dirpath, _, files in os.walk(tmp):  # the install is read-only; the learner's copy is theirs
        os.chmod(dirpath, 0o700)
        for f in files:
            os.chmod(os.path.join(dirpath, f), 0o600)
    tmp.rename(dest)
    return True


def reset(home: Path) -> Path | None:
    """A clean copy in ``~/course``; the old one moves to ``~/course-before-reset-<time>`` (returned)."""
    dest, old = paths(home)["course"], None
    if dest.exists():
        old = home / time.strftime("course-before-reset-%Y%m%d-%H%M%S")
        n = 1
        while old.exists():
            old, n = old.with_name(f"{old.name.split('.')[0]}.{n}"), n + 1
        dest.rename(old)
    first_copy(home)
    return old


def clean(home: Path) -> int:
    """Empty the learner's temp folder (their processes are gone); returns entries removed."""
    tmp, n = paths(home)["tmp"], 0
    if tmp.is_dir():
        for entry in tmp.iterdir():
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() and not entry.is_symlink() \
                else entry.unlink(missing_ok=True)
            n += 1
    return n


def main(argv: list[str]) -> int:
    os.umask(0o077)
    home = Path(os.environ.get("HOME") or os.path.expanduser("~"))
    if argv[:1] == ["--reset"]:
        old = reset(home)
        print(f"{paths(home)['course']}: a clean copy" + (f"; the old one is now {old}" if old else ""))
        return 0
    if argv[:1] == ["--clean"]:
        print(f"{clean(home)} entries removed from {paths(home)['tmp']}")
        return 0
    env = {**os.environ, **private_env(home)}
    if argv[:1] == ["--run"]:  # a command in the environment the learner's kernels get (for checks)
        os.execve(argv[1], argv[1:], env)
    if first_copy(home):
        print(f"workshop: copied the course into {paths(home)['course']}", file=sys.stderr, flush=True)
    server = str(Path(sys.executable).parent / "jupyterhub-singleuser")
    os.execve(server, [server, *argv], env)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
