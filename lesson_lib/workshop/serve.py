"""``workshop serve``: the install, the learners' accounts, the hub in the foreground, then clean-up.

The hub runs as a child process from the shared install's venv (``install.ensure``). When it ends,
by Ctrl-C or SIGTERM, JupyterHub stops every learner's server; then every process still running as
a learner is stopped, what they left in /dev/shm and the rooms they left open (lesson_lib.room)
removed and their temp folder emptied, so nothing of
the workshop outlives it except the learners' homes (their work) and the hub's state folder.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from . import accounts, install

HUB_STOP_TIMEOUT_S = 60  # JupyterHub stops each learner's server (their kernels and ranks) first
# Where learners' kernels open rooms: lesson_lib.room.place.rooms_dir(), as the hub passes no
# LESSON_ROOMS (tests/test_workshop.py checks that the two agree). Not imported: it imports torch.
ROOMS = Path("/tmp/lesson-rooms")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def is_loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return ip == "localhost"


def exposure_warning(ip: str, port: int) -> str:
    """What ``--ip`` opens, said before the hub starts."""
    return (f"WARNING: the hub listens on {ip}:{port}: anyone who can reach this machine can open its "
            f"login page. A learner's name with the workshop password gives a JupyterLab whose kernels "
            f"and terminal run any command as that learner's Unix user here, reading and writing their "
            f"home. The hub speaks plain HTTP: the password and session cookies cross the room's network "
            f"unencrypted. Use it on a network you trust, and stop it when the workshop ends.")


def check_exposure(ip: str, password: str) -> None:
    """Refuse to open the hub to the room with the default (published) password, or a short one."""
    if is_loopback(ip):
        return
    if password == accounts.DEFAULT_PASSWORD:
        raise ValueError(f"--ip {ip} opens the hub to the network: set a password of your own "
                         f"(--password-file FILE or WORKSHOP_PASSWORD), not the default one")
    if len(password) < 8:
        raise ValueError("--ip: the workshop password must have at least 8 characters")


def shares(n_learners: int) -> tuple[float, int]:
    """Each learner's share of this machine: (cores, bytes), passed as CPU_LIMIT / MEM_LIMIT."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return round(cores / n_learners, 2), int(0.9 * mem / n_learners)


def settings(names: list[str], password: str, ip: str, port: int, state: Path, venv: Path,
             course: Path, idle_timeout_s: int, kernel_idle_s: int, limits: bool) -> dict:
    """What the hub's config reads (hubconfig.configure); the password only as its hash."""
    cpu, mem = shares(len(names)) if limits else (None, None)
    return {"names": names, "password_hash": accounts.hash_password(password), "ip": ip, "port": port,
            "hub_port": free_port(), "proxy_api_port": free_port(), "state": str(state),
            "venv": str(venv), "course": str(course), "idle_timeout_s": idle_timeout_s,
            "cull_every_s": max(10, min(300, idle_timeout_s // 2)), "kernel_idle_s": kernel_idle_s,
            "start_timeout_s": 120, "cpu_limit": cpu, "mem_limit": mem}


def write_state(state: Path, conf: dict) -> Path:
    """STATE (0700, root's): settings.json (0600) and the two-line jupyterhub_config.py."""
    state.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(state, 0o700)
    path = state / "settings.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(conf, f, indent=1)
    config = state / "jupyterhub_config.py"
    config.write_text("from lesson_lib.workshop.hubconfig import load\n"
                      f"load(c, {str(path)!r})  # noqa: F821 (c is JupyterHub's config)\n")
    return config


def run_as(name: str, venv: Path, course: Path, *args: str, timeout_s: float = 120) -> str:
    """Run the learner-side start.py with ``args`` as learner ``name``; its output."""
    import pwd

    home = pwd.getpwnam(name).pw_dir
    env = {"HOME": home, "USER": name, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    out = subprocess.run([str(venv / "bin" / "python"), str(course / "lesson_lib" / "workshop" / "start.py"),
                          *args], user=name, group=accounts.GROUP, extra_groups=[], env=env, cwd=home,
                         capture_output=True, text=True, timeout=timeout_s)
    if out.returncode:
        raise RuntimeError(f"start.py {' '.join(args)} as {name} failed:\n{out.stderr[-2000:]}")
    return out.stdout.strip()


def make_rooms(rooms: Path = ROOMS, log=None) -> None:
    """The rooms' folder made by root, 1777 like /tmp, before any learner's kernel runs: one made by
    an instructor's kernel would be theirs, outlive their account, and refuse every later instructor."""
    if not rooms.exists():
        rooms.mkdir(mode=0o755)
        os.chmod(rooms, 0o1777)
    elif rooms.stat().st_uid != 0:
        print(f"workshop: {rooms} belongs to uid {rooms.stat().st_uid}: only that user can open a room; "
              "remove it while no room is open", file=log or sys.stderr, flush=True)


def cleanup(names: list[str], venv: Path, course: Path, log=None, rooms: Path = ROOMS) -> None:
    """Stop what any learner still runs, remove their /dev/shm entries and the rooms they left open,
    empty their temp folder."""
    log = log or sys.stderr
    for name in names:
        try:
            n = accounts.stop_processes(name)
            shm = accounts.remove_shared_memory(name)
            left = accounts.remove_rooms(name, str(rooms))
            run_as(name, venv, course, "--clean")
            if n or shm or left:
                print(f"workshop: {name}: {n} process(es) stopped, {len(shm)} /dev/shm entries and "
                      f"{len(left)} room(s) removed", file=log, flush=True)
        except (KeyError, RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            print(f"workshop: cleaning up after {name} failed: {e}", file=log, flush=True)


def serve(names: list[str], password: str, *, ip: str = "127.0.0.1", port: int = 8000,
          prefix: Path, state: Path, src: Path, wheelhouse: str | None = None,
          idle_timeout_s: int = 3600, kernel_idle_s: int = 1200, limits: bool = True, log=None) -> int:
    """Install if needed, make the learners' users, run the hub until it is stopped; its exit code."""
    log = log or sys.stderr
    check_exposure(ip, password)
    if os.geteuid() != 0:
        print("workshop serve: run it as root (it makes a Unix user per learner and starts each "
              "learner's JupyterLab as that user)", file=log)
        return 2
    if not is_loopback(ip):
        print(exposure_warning(ip, port), file=log, flush=True)
    venv = install.ensure(prefix, src, wheelhouse=wheelhouse, log=log)
    course = Path(prefix).resolve() / "course"
    created = accounts.ensure_users(names)
    if created:
        print(f"workshop: created Unix users {', '.join(created)} (group {accounts.GROUP})", file=log)
    make_rooms(log=log)
    conf = settings(names, password, ip, port, Path(state).resolve(), venv, course, idle_timeout_s,
                    kernel_idle_s, limits)
    config = write_state(Path(state).resolve(), conf)
    env = {"PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
           "HOME": os.environ.get("HOME", "/root")}
    shown = socket.gethostname() if ip in ("0.0.0.0", "::") else ip  # every address: the machine's name
    print(f"workshop: {len(names)} learner(s) log in at http://{shown}:{port}/ "
          f"(each learner: {conf['cpu_limit'] or 'all'} core(s)); Ctrl-C stops it", file=log, flush=True)
    hub = subprocess.Popen([str(venv / "bin" / "jupyterhub"), "-f", str(config)], cwd=conf["state"],
                           env=env, stdin=subprocess.DEVNULL, start_new_session=True,
                           preexec_fn=_end_with_parent)
    helpers, asked = [], []  # the hub's proxy and culler; when a stop was asked

    def stop(*_):
        helpers.extend(_descendants(hub.pid))  # remembered in case the hub leaves them behind
        asked.append(time.monotonic())
        if hub.poll() is None:
            hub.send_signal(signal.SIGTERM)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while hub.poll() is None and not (asked and time.monotonic() - asked[0] > HUB_STOP_TIMEOUT_S):
            try:
                hub.wait(timeout=1)
            except subprocess.TimeoutExpired:
                if asked and len(asked) == 1 and time.monotonic() - asked[0] > 15:
                    stop()  # a SIGTERM while JupyterHub was still starting can stall; a second ends it
            except KeyboardInterrupt:
                stop()
    finally:
        if hub.poll() is None:
            stop()
            try:
                hub.wait(timeout=15)
            except subprocess.TimeoutExpired:
                print("workshop: the hub did not stop; killing it", file=log, flush=True)
                os.killpg(hub.pid, signal.SIGKILL)
                hub.wait(timeout=10)
        _end(helpers)
        for s, h in previous.items():
            signal.signal(s, h)
        cleanup(names, venv, course, log)
    print(f"workshop: the hub stopped (exit code {hub.returncode})", file=log, flush=True)
    return 0 if hub.returncode in (0, -signal.SIGTERM) else hub.returncode


def _end_with_parent() -> None:
    """In the hub's process before exec: SIGTERM it if ``serve`` dies, even by SIGKILL (Linux's
    PR_SET_PDEATHSIG), so a killed ``serve`` never leaves a hub running; it then stops its servers."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


def _descendants(pid: int) -> list:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _end(procs: list, grace_s: float = 10) -> None:
    """SIGTERM, then SIGKILL, whatever of ``procs`` (psutil processes) still runs."""
    import psutil

    alive = [p for p in procs if p.is_running()]
    for step in (psutil.Process.terminate, psutil.Process.kill):
        for p in alive:
            try:
                step(p)
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(alive, timeout=grace_s)
