"""What the workshop tests share: root, the shared install, learners made and removed, /proc probes,
and a running hub (``workshop_hub``: ``python -m lesson_lib workshop serve`` as a learner's room
would run it) with what its processes listen on.

The shared install (``lesson_lib.workshop.install``) goes in build/workshop and is reused while the
checkout is unchanged, as ``make install`` reuses .venv: the first run builds it (67 s on 2 quiet cores,
2026-12-08; niced, in the background from collection on, so it overlaps the tests before it), later
runs only recopy the course when it changed.
"""

from __future__ import annotations

import contextlib
import grp
import ipaddress
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
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


# A fresh clone builds the shared install in about 70 s, mostly pip unpacking wheels on one core. When
# the run will need it, conftest starts it at collection, niced, so it fills the cores that the tests
# before the workshop's leave idle; the fixture waits for it, then checks it as before.
_BACKGROUND: dict[str, subprocess.Popen] = {}
BACKGROUND_TIMEOUT_S = 2400  # pip's own cap (install.PIP_TIMEOUT_S) is 1,800 s a command


def start_background_install() -> None:
    """Build the shared install in a niced process of its own (root only; once a session)."""
    if os.geteuid() != 0 or "install" in _BACKGROUND:
        return
    INSTALL_LOG.parent.mkdir(parents=True, exist_ok=True)
    code = ("import sys; from lesson_lib.workshop import install; "
            "install.ensure(sys.argv[1], sys.argv[2], log=sys.stdout)")
    with open(INSTALL_LOG, "a") as log:
        print(f"background install started at collection (pid of pytest {os.getpid()})", file=log, flush=True)
        _BACKGROUND["install"] = subprocess.Popen(
            ["nice", "-n", "19", sys.executable, "-c", code, str(PREFIX), str(ROOT)], cwd=ROOT,
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def stop_background_install() -> None:
    """At the session's end: a background install still running (the run was cut short) is killed."""
    proc = _BACKGROUND.pop("install", None)
    if proc is not None and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@pytest.fixture(scope="session")
def shared_install():
    """The course installed for every learner: (venv, course) under build/workshop."""
    require_root()
    from lesson_lib.workshop import install

    INSTALL_LOG.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    background = _BACKGROUND.get("install")
    if background is not None:
        try:
            code = background.wait(timeout=BACKGROUND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            stop_background_install()
            pytest.fail(f"the background shared install did not finish within {BACKGROUND_TIMEOUT_S} s "
                        f"({INSTALL_LOG})")
        waited = time.monotonic() - started
        print(f"background shared install: exit status {code}, waited {waited:.1f} s for it")
    with open(INSTALL_LOG, "a") as log:  # at once when the background one finished; else done here
        venv = install.ensure(PREFIX, ROOT, log=log)
    print(f"shared install ready in {time.monotonic() - started:.1f} s ({PREFIX})")
    return venv, PREFIX / "course"


TEST_PREFIXES = ("lw-", "lr-")  # every test's learner names start so (test_room_kernels: "lr-")


@contextlib.contextmanager
def learners(names: list[str]):
    """Unix users for ``names`` (the workshop's own code makes them), removed with their homes after,
    and the learners' group too if this made it."""
    from lesson_lib.workshop import accounts

    # A run killed mid-test (a timeout, a machine stopped) leaves its learners behind: remove those,
    # which this suite made (learners' group, a test's name), and refuse any other user of that name.
    leftover = [n for n in names if _user_exists(n)]
    ours = [n for n in leftover if accounts.is_learner(n) and n.startswith(TEST_PREFIXES)]
    if ours:
        print(f"removing a previous run's learners: {', '.join(ours)}")
        accounts.remove_users(ours)
    for name in leftover:
        if _user_exists(name):
            pytest.fail(f"user {name} already exists and is not a test's learner (userdel -r {name})")
    had_group = _group_exists(accounts.GROUP)
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


HUB_START_TIMEOUT_S = 90
HUB_STOP_TIMEOUT_S = 120


@dataclass
class Hub:
    """A running ``workshop serve``: its process, the hub's address and the workshop password."""

    serve: subprocess.Popen
    ps: object  # psutil.Process of serve
    base: str
    password: str
    state: Path
    log: Path

    def pids(self, uids: set[int]) -> set[int]:
        return workshop_pids(self.ps, uids)

    def tail(self) -> str:
        return tail(self.log)

    def stop_and_check(self, users: list) -> float:
        """Stop the hub as Ctrl-C would (SIGINT to serve) and check that nothing of ``users`` is
        left: no process, nothing of theirs in /dev/shm or /tmp. Returns the seconds it took."""
        import psutil

        uids = {u.pw_uid for u in users}
        tree = self.pids(uids) - {self.serve.pid}
        stopping = time.monotonic()
        self.serve.send_signal(signal.SIGINT)
        assert self.serve.wait(timeout=HUB_STOP_TIMEOUT_S) == 0, self.tail()
        wait_until("the workshop's processes to end", lambda: not any(psutil.pid_exists(p) for p in tree)
                   and not any(uid_pids(uid) for uid in uids), 30)
        for u in users:
            assert not owned_in("/dev/shm", u.pw_uid), owned_in("/dev/shm", u.pw_uid)
            assert not owned_in("/tmp", u.pw_uid), owned_in("/tmp", u.pw_uid)
        return time.monotonic() - stopping


@contextlib.contextmanager
def workshop_hub(names: list[str], log_path: Path):
    """``python -m lesson_lib workshop serve NAMES`` on a free loopback port, its output in ``log_path``,
    yielded once the hub answers. A test stops it itself (SIGINT, as Ctrl-C) to check the cleanup;
    after a failure it is stopped here: Ctrl-C first, as serve cleans up after itself, then its tree
    killed."""
    import psutil

    from lesson_lib.workshop.serve import free_port

    password, port = secrets.token_urlsafe(12), free_port()
    base = f"http://127.0.0.1:{port}"
    state = Path(tempfile.mkdtemp(prefix="workshop-state-"))
    serve = ps = None
    try:
        with open(log_path, "wb") as log:
            serve = subprocess.Popen(
                [sys.executable, "-m", "lesson_lib", "workshop", "serve", *names, "--prefix", str(PREFIX),
                 "--state", str(state), "--port", str(port)],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env={**os.environ, "WORKSHOP_PASSWORD": password},
                start_new_session=True)
        ps = psutil.Process(serve.pid)
        hub = Hub(serve, ps, base, password, state, log_path)

        def hub_up():
            assert serve.poll() is None, f"serve ended ({serve.returncode}):\n{hub.tail()}"
            try:
                with urllib.request.urlopen(f"{base}/hub/api", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False
        wait_until(f"the hub to answer on {base}/hub/api", hub_up, HUB_START_TIMEOUT_S, 0.5)
        yield hub
    finally:
        if serve is not None and serve.poll() is None and ps is not None:
            uids = set()
            for name in names:
                with contextlib.suppress(KeyError):
                    uids.add(pwd.getpwnam(name).pw_uid)
            left = [psutil.Process(p) for p in workshop_pids(ps, uids) if psutil.pid_exists(p)]
            serve.send_signal(signal.SIGINT)
            try:
                serve.wait(timeout=HUB_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                for p in left:
                    with contextlib.suppress(psutil.Error):
                        p.kill()
                serve.wait(timeout=30)
        shutil.rmtree(state, ignore_errors=True)


def workshop_pids(serve, uids: set[int]) -> set[int]:
    """The serve command (a psutil.Process), the hub and its helpers, and every learner's process."""
    import psutil

    try:
        tree = {serve.pid, *(p.pid for p in serve.children(recursive=True))}
    except psutil.Error:
        tree = set()
    return tree | {pid for uid in uids for pid in uid_pids(uid)}


def exposed(pids: set[int]) -> list[str]:
    """Sockets of ``pids`` that listen (TCP) or are bound (UDP) on an address other than loopback."""
    import psutil

    out = []
    for c in psutil.net_connections(kind="inet"):
        listening = c.status == psutil.CONN_LISTEN or (c.type == 2 and not c.raddr)  # 2: SOCK_DGRAM
        if c.pid in pids and listening and c.laddr and not ipaddress.ip_address(c.laddr.ip).is_loopback:
            out.append(f"pid {c.pid} ({process_name(c.pid)}) on {c.laddr.ip}:{c.laddr.port}")
    return out


def process_name(pid: int) -> str:
    import psutil

    try:
        return " ".join(psutil.Process(pid).cmdline()[:3])
    except psutil.Error:
        return "?"


def tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:]


# --- a learner's JupyterLab through the hub, in a browser page (playwright) ---------------------------

def log_in(page, base: str, name: str, password: str) -> None:
    page.goto(f"{base}/hub/login", wait_until="domcontentloaded")
    page.locator("#username_input").fill(name)
    page.locator("#password_input").fill(password)
    page.locator("#login_submit").click()


# The server's sessions, fetched as JupyterLab does: its cookie and the _xsrf token as a header.
SESSIONS_JS = """async (url) => {
  const m = document.cookie.match(/(?:^|; )_xsrf=([^;]*)/);
  const r = await fetch(url, {headers: m ? {"X-XSRFToken": decodeURIComponent(m[1])} : {}});
  return r.ok ? r.json() : [];
}"""


def kernel_idle(page, name: str, notebook: str) -> bool:
    """The notebook's kernel started and idle, asked of the learner's server with the page's cookies."""
    sessions = page.evaluate(SESSIONS_JS, f"/user/{name}/api/sessions")
    return any(s.get("path", "").endswith(notebook) and s["kernel"].get("execution_state") == "idle"
               for s in sessions)


def type_into_cell(page, panel: str, has_text: str, text: str):
    """Replace the code cell of the open notebook that shows ``has_text`` with ``text``, typed into its
    editor as a learner would; the cell's locator."""
    cell = page.locator(f"{panel} .jp-CodeCell").filter(has_text=has_text).first
    cell.locator(".cm-content").click()
    page.keyboard.press("Control+A")
    page.keyboard.insert_text(text)
    page.keyboard.press("Escape")
    return cell
