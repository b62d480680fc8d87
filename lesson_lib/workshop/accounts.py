"""Learners: their names, the workshop password (kept only as a salted scrypt hash), their Unix users.

Each learner is a real Unix user in the group ``lesson-learners``, with a private home (0700) and no
password (the account is locked: no ``su`` or ssh into it; bash is for JupyterLab's terminal).
JupyterHub's LocalProcessSpawner starts their JupyterLab as that user, so the kernel's files and
processes are theirs alone. A name that already belongs to a user outside the group is refused
rather than taken over.
"""

from __future__ import annotations

import base64
import contextlib
import grp
import hashlib
import hmac
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import time

GROUP = "lesson-learners"
DEFAULT_PASSWORD = "learn-distributed"  # fine on 127.0.0.1; `serve --ip` refuses it
NAME = re.compile(r"^[a-z][a-z0-9_-]{0,30}$")  # what useradd accepts everywhere, and JupyterHub keeps as is
_SCRYPT = {"n": 2**14, "r": 8, "p": 1}  # ~50 ms and 16 MiB a check: slow to guess, quick to log in


def hash_password(password: str) -> str:
    """``scrypt$n$r$p$salt$key`` (base64): what the hub stores instead of the password."""
    salt = secrets.token_bytes(16)
    key = hashlib.scrypt(password.encode(), salt=salt, dklen=32, **_SCRYPT)
    b64 = lambda b: base64.b64encode(b).decode()
    return f"scrypt${_SCRYPT['n']}${_SCRYPT['r']}${_SCRYPT['p']}${b64(salt)}${b64(key)}"


def check_password(password: str, stored: str) -> bool:
    """True if ``password`` hashes to ``stored`` (compared in constant time)."""
    try:
        kind, n, r, p, salt, key = stored.split("$")
        got = hashlib.scrypt(password.encode(), salt=base64.b64decode(salt), n=int(n), r=int(r), p=int(p),
                             dklen=len(base64.b64decode(key)))
    except (ValueError, TypeError):
        return False
    return kind == "scrypt" and hmac.compare_digest(got, base64.b64decode(key))


def parse_names(text: str) -> list[str]:
    """Learner names from a file's text: one a line (commas too), ``#`` comments; each checked."""
    names = []
    for line in text.splitlines():
        for name in line.split("#", 1)[0].replace(",", " ").split():
            if not NAME.match(name):
                raise ValueError(f"learner name {name!r}: use lowercase letters, digits, - or _ "
                                 f"(a letter first, at most 31)")
            if name in names:
                raise ValueError(f"learner name {name!r} is listed twice")
            names.append(name)
    if not names:
        raise ValueError("no learner names given")
    return names


def is_learner(name: str) -> bool:
    """True if Unix user ``name`` exists and is in the learners' group."""
    try:
        user = pwd.getpwnam(name)
        group = grp.getgrnam(GROUP)
    except KeyError:
        return False
    return user.pw_gid == group.gr_gid or name in group.gr_mem


def ensure_users(names: list[str], home_root: str = "/home") -> list[str]:
    """Create the learners' Unix users that are missing; return the names created.
    Raises ValueError for a name that belongs to someone else on this machine."""
    taken = [n for n in names if _exists(n) and not is_learner(n)]
    if taken:
        raise ValueError(f"{', '.join(taken)}: already a user of this machine, not a learner; "
                         f"choose other names")
    try:
        grp.getgrnam(GROUP)
    except KeyError:
        subprocess.run(["groupadd", "--system", GROUP], check=True, timeout=30)
    created = []
    for name in names:
        if _exists(name):
            continue
        subprocess.run(["useradd", "--create-home", "--base-dir", home_root, "--gid", GROUP,
                        "--shell", "/bin/bash", "--comment", "workshop learner", name],
                       check=True, timeout=30, stdout=subprocess.DEVNULL)
        created.append(name)
    for name in names:  # private whatever the system's HOME_MODE: no learner reads another's home
        os.chmod(pwd.getpwnam(name).pw_dir, 0o700)
    return created


def remove_users(names: list[str]) -> None:
    """Remove learners' Unix users and their homes (their work too): the end of a workshop."""
    for name in names:
        if is_learner(name):
            stop_processes(name)
            subprocess.run(["userdel", "--remove", name], timeout=60,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        gid = grp.getgrnam(GROUP).gr_gid
    except KeyError:
        return
    if not any(u.pw_gid == gid for u in pwd.getpwall()):  # the last learner gone: the group too
        subprocess.run(["groupdel", GROUP], timeout=30, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def pids_of(uid: int) -> list[int]:
    """Every process that runs as ``uid`` (its real uid, from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as f:
                    line = next(x for x in f if x.startswith("Uid:"))
            except (OSError, StopIteration):
                continue
            if int(line.split()[1]) == uid:
                out.append(int(entry))
    return out


def stop_processes(name: str, grace_s: float = 5.0) -> int:
    """SIGTERM every process of learner ``name``, SIGKILL what is left after ``grace_s``; returns
    how many there were. A learner's kernels and ranks never outlive the workshop."""
    uid = pwd.getpwnam(name).pw_uid
    pids = pids_of(uid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids_of(uid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while pids_of(uid) and time.monotonic() < deadline:
            time.sleep(0.1)
    if pids_of(uid):
        raise RuntimeError(f"{name}'s processes {pids_of(uid)} survived SIGKILL for {grace_s} s")
    return len(pids)


def remove_shared_memory(name: str, shm: str = "/dev/shm") -> list[str]:
    """Remove what learner ``name`` left in /dev/shm (segments and semaphores of killed ranks)."""
    uid, removed = pwd.getpwnam(name).pw_uid, []
    for entry in os.listdir(shm):
        path = os.path.join(shm, entry)
        try:
            if os.lstat(path).st_uid == uid:
                os.unlink(path)
                removed.append(path)
        except OSError:
            pass
    return removed


def remove_rooms(name: str, rooms: str) -> list[str]:
    """Remove the rooms learner ``name`` left open in ``rooms`` (lesson_lib.room): a room's folder
    outlives an instructor's kernel stopped without ``room.close()``. Links are unlinked, never followed."""
    uid, removed = pwd.getpwnam(name).pw_uid, []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(rooms):
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
                removed.append(entry.path)
            except OSError:
                pass
    return removed
