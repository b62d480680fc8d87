"""What the workshop tests share: root, the shared install, learners made and removed, /proc probes.

The shared install (``lesson_lib.workshop.install``) goes in build/workshop and is reused while the
checkout is unchanged, as ``make install`` reuses .venv: the first run builds it (about 2 minutes on
2 cores, from pip's cache), later runs only recopy the course when it changed.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PREFIX = ROOT / "build" / "workshop"
INSTALL_LOG = ROOT / "artifacts" / "workshop" / "install.log"


def require_root() -> None:
    """The workshop makes Unix users: root only. Skipped elsewhere, a failure under CI (root there)."""
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("the workshop tests need root (CI runs as root)")
        pytest.skip("the workshop tests need root (they make Unix users)")


@pytest.fixture(scope="session")
def shared_install():
    """The course installed for every learner: (venv, course) under build/workshop."""
    require_root()
    from lesson_lib.workshop import install

    INSTALL_LOG.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(INSTALL_LOG, "a") as log:
        venv = install.ensure(PREFIX, ROOT, log=log)
    print(f"shared install ready in {time.monotonic() - started:.1f} s ({PREFIX})")
    return venv, PREFIX / "course"


@contextlib.contextmanager
def learners(names: list[str]):
    """Unix users for ``names`` (the workshop's own code makes them), removed with their homes after,
    and the learners' group too if this made it."""
    from lesson_lib.workshop import accounts

    had_group = _group_exists(accounts.GROUP)
    for name in names:
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            pytest.fail(f"user {name} already exists: a previous run's? (userdel -r {name})")
    try:
        accounts.ensure_users(names)
        yield [pwd.getpwnam(n) for n in names]
    finally:
        accounts.remove_users(names)
        if not had_group and _group_exists(accounts.GROUP):
            os.system(f"groupdel {accounts.GROUP}")
        left = [n for n in names if _user_exists(n)]
        assert not left, f"users not removed: {left}"


def _group_exists(name: str) -> bool:
    try:
        grp.getgrnam(name)
        return True
    except KeyError:
        return False


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def uid_pids(uid: int) -> list[int]:
    """Processes whose real uid is ``uid``, read from /proc (not through the code under test)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text()
            except OSError:
                continue
            uids = next(line for line in status.splitlines() if line.startswith("Uid:")).split()
            if int(uids[1]) == uid:
                out.append(int(entry.name))
    return out


def owned_in(folder: str, uid: int) -> list[str]:
    """Entries of ``folder`` (not recursive) owned by ``uid``."""
    out = []
    for entry in os.scandir(folder):
        with contextlib.suppress(OSError):
            if entry.stat(follow_symlinks=False).st_uid == uid:
                out.append(entry.path)
    return out


def wait_until(what: str, predicate, timeout_s: float, every_s: float = 0.25):
    """Poll ``predicate`` until it returns something truthy; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
