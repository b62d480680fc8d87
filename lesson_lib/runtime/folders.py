"""Each cluster's rendezvous folder, and the sweep of folders whose kernel is gone.

A folder is named after the process that made it (``lesson_lib_<pid>_...``). ``Cluster.close``
removes its own; workers remove all their kernel's folders when it dies (killed or restarted); and
each new cluster removes any folder whose maker no longer runs, whatever ended it.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile

PREFIX = "lesson_lib_"


def new() -> str:
    """A fresh folder for one cluster's rendezvous; folders left by dead processes are removed."""
    sweep()
    return tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}_")


def alive(pid: int) -> bool:
    """True while process ``pid`` runs (another user's counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_all_of(pid: int, root: str | None = None) -> None:
    """Remove every folder process ``pid`` made (it is gone: its workers clean up after it)."""
    for path in glob.glob(os.path.join(root or tempfile.gettempdir(), f"{PREFIX}{pid}_*")):
        shutil.rmtree(path, ignore_errors=True)


def sweep(root: str | None = None) -> list[str]:
    """Remove ``lesson_lib_<pid>_*`` folders under ``root`` whose process is gone; return them."""
    removed = []
    for path in glob.glob(os.path.join(root or tempfile.gettempdir(), PREFIX + "*")):
        pid = os.path.basename(path)[len(PREFIX):].split("_", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not alive(int(pid)) and os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
