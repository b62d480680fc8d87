"""Where a room meets: a folder on the server, a ``FileStore`` in it, and the keys the room writes.

Rendezvous is a file, not a port: the store is ``torch.distributed.FileStore`` in a folder that only
the workshop's group may enter (mode 2770, group ``lesson-learners``), so nobody outside the group
can read or write the room's keys, and nothing listens for them. Gloo's own connections are bound to
the loopback interface (``GLOO_SOCKET_IFNAME=lo``). See docs/room.md for what that leaves open.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import re
import secrets
import shutil
import stat
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

GROUP = "lesson-learners"  # the workshop's group (lesson_lib.workshop.accounts.GROUP)
NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
STORE_FILE = "store"
STORE_TIMEOUT_S = 10.0  # a store operation that takes longer names the room's folder


def rooms_dir() -> Path:
    """Where rooms live: ``$LESSON_ROOMS`` if set, else /tmp/lesson-rooms (one server, one /tmp)."""
    return Path(os.environ.get("LESSON_ROOMS") or "/tmp/lesson-rooms")


def check_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not NAME.match(name):
        raise ValueError(f"{kind} {name!r}: use 1–32 lowercase letters, digits, '-' or '_'")
    return name


def workshop_gid() -> int | None:
    try:
        return grp.getgrnam(GROUP).gr_gid
    except KeyError:
        return None


def make_folder(name: str, base: Path | None = None) -> Path:
    """Create the room's folder, empty, for its instructor and the workshop group only.

    ``base`` is made 1777 (like /tmp) if missing; a base or room owned by someone else is refused,
    so another local user cannot plant a room for learners to join.
    """
    base = Path(base or rooms_dir())
    if not base.exists():
        base.mkdir(mode=0o755, parents=True, exist_ok=True)
        with contextlib.suppress(PermissionError):
            os.chmod(base, 0o1777)  # like /tmp: every instructor may open a room, none remove another's
    if base.stat().st_uid not in (0, os.geteuid()):
        raise PermissionError(f"{base} belongs to uid {base.stat().st_uid}: set LESSON_ROOMS elsewhere")
    folder = base / check_name("room", name)
    gid = workshop_gid()
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        if not _abandoned(folder):
            raise FileExistsError(f"room {name!r} is already open ({folder}): close it first (room.close())"
                                  ) from None
        shutil.rmtree(folder)  # its instructor's kernel is gone: this user may open it afresh
        folder.mkdir(mode=0o700)
    if gid is not None:
        os.chown(folder, -1, gid)
        os.chmod(folder, 0o2770)  # setgid: what is made inside belongs to the group too
    store = folder / STORE_FILE
    fd = os.open(store, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o660 if gid is not None else 0o600)
    os.close(fd)
    if gid is not None:
        os.chown(store, -1, gid)
        os.chmod(store, 0o660)
    (folder / "instructor.pid").write_text(f"{os.getpid()} {secrets.token_hex(8)}")  # who, and which opening
    os.chmod(folder / "instructor.pid", 0o644)
    return folder


def opening(folder: Path) -> str:
    """Which opening of the room this is: a learner who joined an earlier one must join again."""
    return (folder / "instructor.pid").read_text()


def _abandoned(folder: Path) -> bool:
    """A room of this user's whose instructor's process is gone."""
    try:
        owner = int((folder / "instructor.pid").read_text().split()[0])
        return folder.stat().st_uid == os.geteuid() and not alive(owner)
    except (OSError, ValueError):
        return False


def find_folder(name: str, base: Path | None = None) -> Path:
    """The folder of an open room, checked: not writable by the world, owned by root or by a member
    of the workshop group, or by this user."""
    folder = Path(base or rooms_dir()) / check_name("room", name)
    try:
        st = folder.stat()
    except FileNotFoundError:
        raise FileNotFoundError(f"no room {name!r} is open (looked in {folder}); ask your instructor "
                                "for its name, or wait until they open it") from None
    if st.st_mode & stat.S_IWOTH:
        raise PermissionError(f"{folder} is writable by everyone: not a room to join")
    return folder


def store(folder: Path, timeout_s: float = STORE_TIMEOUT_S) -> dist.FileStore:
    path = folder / STORE_FILE
    if not os.access(path, os.R_OK | os.W_OK):
        raise PermissionError(f"cannot read and write {path}: only the workshop's group "
                              f"({GROUP}) may join a room (ask your instructor)")
    s = dist.FileStore(str(path), -1)
    s.set_timeout(timedelta(seconds=timeout_s))
    return s


def put(s, key: str, value) -> None:
    s.set(key, json.dumps(value))


def get(s, key: str, default=None):
    """The key's value, or ``default`` at once if it is not set (never waits)."""
    if not s.check([key]):
        return default
    return json.loads(s.get(key).decode())


def remove_folder(folder) -> None:
    shutil.rmtree(folder, ignore_errors=True)


PRIVATE_PREFIX = "lesson-room-"


def private_base() -> str:
    """A temporary folder for a rehearsal's room, with this process's id in it. Those left by a
    process that is gone (a kernel SIGKILLed before it could close its room) are removed first."""
    import tempfile

    tmp = tempfile.gettempdir()
    for entry in os.scandir(tmp):
        if entry.name.startswith(PRIVATE_PREFIX) and entry.is_dir(follow_symlinks=False):
            with contextlib.suppress(OSError, ValueError):
                owner = int(Path(entry.path, "pid").read_text())
                if entry.stat().st_uid == os.geteuid() and not alive(owner):
                    shutil.rmtree(entry.path, ignore_errors=True)
    base = tempfile.mkdtemp(prefix=PRIVATE_PREFIX)
    Path(base, "pid").write_text(str(os.getpid()))
    return base


def alive(pid: int) -> bool:
    """Is process ``pid`` running (not a zombie)? Read from /proc: it works for other users' pids."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def now() -> float:
    return time.time()
