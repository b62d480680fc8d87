"""The room for real: four Jupyter kernels, started as JupyterLab starts them (``jupyter_client``)
as two Unix users of the workshop, join one room and play every activity (docs/room.md).

The instructor is this test's process (rank 0 of the parameter server's rounds, in a thread, as
in the instructor's kernel). One learner submits a wrong ring step and is named; the same learner's
step then raises, and their name and line reach the instructor while the room stays up; another
learner's kernel is SIGKILLed mid-round, named within 5 s, the round discarded, and the next round
goes on without them; a fresh kernel under their name rejoins and is healed from a live peer. While
the rounds run, every listening socket of the room's processes is on loopback (read from
/proc/net/tcp*), and afterwards no process, folder or shared-memory segment of theirs is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest
from workshop_support import learners, owned_in, uid_pids, wait_until
from workshop_support import shared_install as shared_install  # a fixture

pytestmark = [pytest.mark.slow, pytest.mark.ch11]
USERS = ["lr-ann", "lr-ben"]
KERNELS = {"ann": "lr-ann", "ben": "lr-ben", "cat": "lr-ann", "dan": "lr-ben"}  # learner -> Unix user
WRONG, VICTIM = "ben", "dan"
KERNEL_TIMEOUT_S = 90

RIGHT_STEP = '''
def my_step(rank, n, s):
    return (rank - s) % n, (rank - s - 1) % n
'''
WRONG_STEP = '''
def my_step(rank, n, s):
    send_i = (rank - s) % n
    return send_i, send_i
'''
RAISING_STEP = '''
def my_step(rank, n, s):
    return (rank - s) % n, [0, 1][n]
'''


class LearnerKernel:
    """A kernel as ``user``, from the workshop's shared install, its connection file theirs."""

    def __init__(self, name: str, user, venv: Path, folder: Path):
        from jupyter_client import KernelManager
        from jupyter_client.kernelspec import KernelSpecManager

        spec = folder / "kernels" / "room"
        spec.mkdir(parents=True, exist_ok=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [str(venv / "bin" / "python"), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "room", "language": "python"}))
        own = folder / name
        own.mkdir(mode=0o700)
        os.chown(own, user.pw_uid, user.pw_gid)
        self.name, self.user = name, user
        specs = KernelSpecManager(kernel_dirs=[str(folder / "kernels")])

        class TheirKernel(KernelManager):
            def write_connection_file(self, **kw):  # the kernel runs as the learner: their file
                super().write_connection_file(**kw)
                os.chown(self.connection_file, user.pw_uid, user.pw_gid)

        self.km = TheirKernel(kernel_name="room", kernel_spec_manager=specs)
        self.km.connection_file = str(own / "kernel.json")
        env = {"HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name, "PATH": "/usr/bin:/bin",
               "TMPDIR": str(own), "OMP_NUM_THREADS": "1"}
        self.km.start_kernel(env=env, cwd=user.pw_dir, user=user.pw_uid, group=user.pw_gid, extra_groups=[],
                             umask=0o077)
        self.kc = self.km.client()
        self.kc.start_channels()

    @property
    def pid(self) -> int:
        return self.km.provisioner.process.pid

    def run(self, code: str, timeout_s: float = KERNEL_TIMEOUT_S) -> str:
        out: list[str] = []

        def hook(msg):
            c = msg["content"]
            if msg["msg_type"] == "stream":
                out.append(c["text"])
            elif msg["msg_type"] == "error":
                out.append("\n".join(c["traceback"]))

        reply = self.kc.execute_interactive(textwrap.dedent(code), timeout=timeout_s, output_hook=hook)
        assert reply["content"]["status"] == "ok", f"{self.name}'s kernel: {''.join(out)}"
        return "".join(out)

    def stop(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def join_code(name: str, base: Path) -> str:
    return (f"import torch\ntorch.set_num_threads(1)\nfrom lesson_lib import room\n"
            f"me = room.join('t60', as_name={name!r}, base={str(base / 'rooms')!r})\n")


def listening(pids: set[int]) -> list[tuple[int, str]]:
    """(pid, local address) of every listening TCP socket of ``pids``, read from /proc."""
    inodes = {}
    for pid in pids:
        fd_dir = Path(f"/proc/{pid}/fd")
        try:
            for fd in fd_dir.iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes[target[8:-1]] = pid
        except OSError:
            continue
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # LISTEN
                found.append((inodes[f[9]], _address(f[1])))
    return found


def _address(hex_addr: str) -> str:
    ip, port = hex_addr.split(":")
    if len(ip) == 8:
        ip = ".".join(str(int(ip[i:i + 2], 16)) for i in (6, 4, 2, 0))
    else:
        ip = "::1" if ip == "00000000000000000000000001000000" else ("::" if set(ip) == {"0"} else ip)
    return f"{ip}:{int(port, 16)}"


def test_four_kernels_two_users_play_the_room(shared_install):
    from lesson_lib import room as rooms

    venv, _ = shared_install
    base = Path(tempfile.mkdtemp(prefix="lesson-room-test-"))
    os.chmod(base, 0o755)
    kernels: dict[str, LearnerKernel] = {}
    timings: dict[str, float] = {}
    with learners(USERS) as users, _removed(base):
        by_name = {u.pw_name: u for u in users}
        room = rooms.open("t60", base=base / "rooms", timeout_s=10)
        try:
            t0 = time.monotonic()
            for name, user in KERNELS.items():
                kernels[name] = LearnerKernel(name, by_name[user], venv, base)
            for name, k in kernels.items():
                k.kc.wait_for_ready(timeout=KERNEL_TIMEOUT_S)
                step = WRONG_STEP if name == WRONG else RIGHT_STEP
                said = k.run(join_code(name, base) + step + "\nme.submit('ring', my_step)\n")
                assert f"joined room 't60' as {name}" in said
            wait_until("4 learners ready", lambda: len(room.ready()) == 4, 60)
            timings["4 kernels started and joined"] = time.monotonic() - t0

            # the ring, with one wrong step: named by learner
            t = time.monotonic()
            rnd = room.run("ring")
            timings["ring round (wrong step)"] = time.monotonic() - t
            assert not rnd.ok and rnd.summary["wrong"]["learner"] == WRONG, rnd.verdict
            assert f"came from {WRONG}" in rnd.verdict

            # the wrong learner's step now raises: their name and line reach the instructor
            kernels[WRONG].run(RAISING_STEP.strip() + "\nme.submit('ring', my_step)")
            rnd = room.run("ring")
            said = (f"{WRONG}: IndexError: list index out of range, in my_step line 2: "
                    "return (rank - s) % n, [0, 1][n]")
            assert rnd.discarded and said in rnd.errors, rnd.verdict
            kernels[WRONG].run(RIGHT_STEP + "\nme.submit('ring', my_step)")
            t = time.monotonic()
            rnd = room.run("ring")
            timings["ring round (all right)"] = time.monotonic() - t
            assert rnd.ok, rnd.verdict

            # the parameter server, sync and async, the instructor serving
            for mode in ("sync", "async"):
                t = time.monotonic()
                rnd = room.run("server", mode=mode)
                timings[f"parameter server ({mode})"] = time.monotonic() - t
                assert rnd.ok and rnd.summary["workers"] == 4, rnd.verdict
                assert rnd.summary["bytes_per_step"] == 2 * 4 * rnd.summary["params"] * 4

            # stragglers and failures: SIGKILL a learner's kernel mid-round
            ranks = {name: k.pid for name, k in kernels.items()} | {"instructor": os.getpid()}
            sockets: list = []
            killed: dict = {}

            def kill_mid_round():
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    r = room.rounds[-1] if room.rounds else None
                    s = r and r.activity == "steps" and r.statuses.get(VICTIM)
                    if s and s.get("state") in ("computing", "waiting") and s.get("step", 0) >= 3:
                        sockets.extend(listening(set(ranks.values())))
                        killed["at"] = time.time()
                        os.kill(kernels[VICTIM].pid, signal.SIGKILL)
                        return
                    time.sleep(0.02)

            killer = threading.Thread(target=kill_mid_round)
            killer.start()
            t = time.monotonic()
            rnd = room.run("steps", steps=400)
            timings["steps round, a kernel SIGKILLed"] = time.monotonic() - t
            killer.join()
            assert killed, "the victim never reached step 3"
            assert rnd.discarded and VICTIM in rnd.left, rnd.verdict
            named_after_s = rnd.left[VICTIM] - (killed["at"] - rnd.started)
            assert named_after_s < 5.0, (rnd.left, named_after_s)
            timings["kill named after"] = named_after_s
            assert sockets and all(a.startswith(("127.0.0.1:", "::1:")) for _, a in sockets), sockets

            t = time.monotonic()
            rnd = room.run("steps")
            timings["steps round without the killed learner"] = time.monotonic() - t
            assert rnd.ok and VICTIM not in rnd.members and len(rnd.members) == 3, rnd.verdict

            # the learner comes back in a fresh kernel: healed from a live peer
            kernels[VICTIM].stop()
            t = time.monotonic()
            kernels[VICTIM] = LearnerKernel(VICTIM + "2", by_name[KERNELS[VICTIM]], venv, base)
            kernels[VICTIM].kc.wait_for_ready(timeout=KERNEL_TIMEOUT_S)
            kernels[VICTIM].run(join_code(VICTIM, base))
            wait_until(f"{VICTIM} ready again", lambda: VICTIM in room.ready(), 60)
            rnd = room.run("steps")
            timings["rejoin and a healed steps round"] = time.monotonic() - t
            assert rnd.ok and rnd.summary["healed"].get(VICTIM), rnd.verdict
        finally:
            for k in kernels.values():
                k.stop()
            room.close()
            print("\n".join(f"{what}: {s:.1f} s" for what, s in timings.items()))
        for u in users:
            wait_until(f"{u.pw_name}'s processes gone", lambda u=u: not uid_pids(u.pw_uid), 20)
            assert not owned_in("/dev/shm", u.pw_uid)
        assert not (base / "rooms" / "t60").exists()


@contextlib.contextmanager
def _removed(folder: Path):
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
