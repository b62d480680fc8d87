"""The workshop server's parts that need no root and no hub: the password kept hashed, learner names,
what ``--ip`` refuses and says, the learner's copy of the notebooks and its reset, the command line,
the offline install's pip options, and that nothing of JupyterHub is imported on a laptop."""

from __future__ import annotations

import ast
import base64
import hashlib
import os
import pwd
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import cli_in_process

from lesson_lib.workshop import accounts, install, serve, start

pytestmark = pytest.mark.ch0
ROOT = Path(__file__).resolve().parents[1]


def test_the_password_is_kept_only_as_a_salted_scrypt_hash():
    stored = accounts.hash_password("room 42 secret")
    assert "room 42 secret" not in stored and stored != accounts.hash_password("room 42 secret")  # salted
    kind, n, r, p, salt, key = stored.split("$")  # recomputed here with hashlib alone
    again = hashlib.scrypt(b"room 42 secret", salt=base64.b64decode(salt), n=int(n), r=int(r), p=int(p),
                           dklen=len(base64.b64decode(key)))
    assert kind == "scrypt" and again == base64.b64decode(key) and int(n) >= 2**14
    assert accounts.check_password("room 42 secret", stored)
    assert not accounts.check_password("room 42 secreT", stored)
    assert not accounts.check_password("room 42 secret", stored[:-4] + "AAA=")
    assert not accounts.check_password("x", "not a hash")


def test_learner_names_are_checked():
    assert accounts.parse_names("ana\nben, cy  # the late one\n\n") == ["ana", "ben", "cy"]
    for bad, says in [("Ana", "lowercase"), ("ana ana", "twice"), ("# nobody", "no learner"),
                      ("x;rm", "lowercase"), ("a" * 40, "at most")]:
        with pytest.raises(ValueError, match=says):
            accounts.parse_names(bad)


@pytest.mark.parametrize("ip", ["127.0.0.1", "::1", "localhost"])
def test_loopback_takes_any_password(ip):
    serve.check_exposure(ip, accounts.DEFAULT_PASSWORD)


def test_opening_the_hub_to_the_room_refuses_the_default_password_and_says_what_it_exposes():
    with pytest.raises(ValueError, match="default"):
        serve.check_exposure("0.0.0.0", accounts.DEFAULT_PASSWORD)
    with pytest.raises(ValueError, match="8 characters"):
        serve.check_exposure("192.168.1.20", "short")
    serve.check_exposure("0.0.0.0", "a password of our own")
    warning = serve.exposure_warning("0.0.0.0", 8000)
    for said in ("0.0.0.0:8000", "terminal", "Unix user", "plain HTTP"):
        assert said in warning, said


def test_serve_with_ip_and_the_default_password_stops_before_installing_anything(tmp_path):
    out = cli_in_process("workshop", "serve", "ana", "--ip", "0.0.0.0", "--prefix", str(tmp_path / "p"),
                         "--state", str(tmp_path / "s"))
    assert out.returncode == 2 and "not the default one" in out.stderr
    assert not (tmp_path / "p").exists() and not (tmp_path / "s").exists()


def test_the_workshop_command_line_answers_without_a_hub():
    out = cli_in_process("workshop", "--help")
    assert out.returncode == 0 and all(c in out.stdout for c in ("serve", "reset NAME", "remove"))
    assert "workshop" in cli_in_process("--help").stdout
    assert cli_in_process("workshop", "serv").returncode == 2
    bad = cli_in_process("workshop", "reset", "no-such-learner-here")
    assert bad.returncode == 2 and "not a workshop learner" in bad.stderr
    no = cli_in_process("workshop", "remove", "ana")
    assert no.returncode == 2 and "--yes" in no.stderr


def test_nothing_of_jupyterhub_is_imported_outside_the_hub_config():
    """A laptop never needs the hub: only hubconfig imports jupyterhub, inside a function."""
    found = {}
    for path in (ROOT / "lesson_lib").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n.split(".")[0] in ("jupyterhub", "jupyterhub_idle_culler") for n in names):
                found.setdefault(path.relative_to(ROOT).as_posix(), []).append(node.col_offset)
    assert list(found) == ["lesson_lib/workshop/hubconfig.py"] and all(c > 0 for c in found[
        "lesson_lib/workshop/hubconfig.py"]), found  # indented: inside a function


@pytest.mark.slow
def test_the_command_line_imports_nothing_of_jupyterhub():
    code = ("import sys, lesson_lib, lesson_lib.__main__, lesson_lib.workshop.cli, lesson_lib.workshop.serve;"
            "print(sorted(m for m in sys.modules if m.startswith('jupyterhub')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr[-2000:]


def test_a_learner_gets_a_private_copy_and_reset_keeps_the_old_one(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    skip = {".ipynb_checkpoints", "__pycache__"}
    installed = sorted(p.relative_to(ROOT / "notebooks") for p in (ROOT / "notebooks").rglob("*")
                       if p.is_file() and not skip & set(p.parts))
    assert start.first_copy(home) and not start.first_copy(home)  # once
    course = home / "course"
    assert sorted(p.relative_to(course) for p in course.rglob("*") if p.is_file()) == installed
    assert (course / "README.md").read_bytes() == (ROOT / "notebooks" / "README.md").read_bytes()
    assert all(p.stat().st_mode & 0o077 == 0 for p in course.rglob("*"))  # no one else reads it
    chapter = course / "00_why_distributed.ipynb"
    chapter.write_text("my work")
    old = start.reset(home)
    assert (old / "00_why_distributed.ipynb").read_text() == "my work"  # kept aside, not destroyed
    assert chapter.read_bytes() == (ROOT / "notebooks" / "00_why_distributed.ipynb").read_bytes()
    assert start.reset(home) != old and len(list(home.glob("course-before-reset-*"))) == 2


def test_the_learners_temp_folder_is_private_and_cleaned(tmp_path):
    env = start.private_env(tmp_path)
    tmp = Path(env["TMPDIR"])
    assert tmp.is_relative_to(tmp_path) and tmp.stat().st_mode & 0o077 == 0
    (tmp / "lesson_lib_123_x").mkdir()
    (tmp / "f").write_text("x")
    (tmp / "link").symlink_to(tmp_path / "outside")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "keep").write_text("kept")
    assert start.clean(tmp_path) == 3 and not list(tmp.iterdir())
    assert (tmp_path / "outside" / "keep").read_text() == "kept"  # a link is removed, never followed


def test_the_install_is_runnable_by_every_user_only_from_open_folders(tmp_path):
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    exe = closed / "python3"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    os.chmod(closed, 0o700)
    assert not install.readable_by_all(str(exe))
    os.chmod(closed, 0o755)
    os.chmod(tmp_path, 0o755)
    assert install.readable_by_all(str(exe)) == all(d.stat().st_mode & 0o001 for d in closed.parents)
    assert install.readable_by_all("/bin/sh")  # a system binary: every user runs it


def test_the_install_follows_the_course_pins_and_the_wheelhouse(tmp_path):
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert install.torch_pin(ROOT / "pyproject.toml") in pins
    assert install.pip_source(str(tmp_path), "https://index") == ["--no-index", "--find-links", str(tmp_path)]
    assert install.pip_source(None, "https://index") == ["--extra-index-url", "https://index"]
    before = install.fingerprint(ROOT)
    assert before == install.fingerprint(ROOT)


def test_make_install_from_a_wheelhouse_never_asks_the_network():
    out = subprocess.run(["make", "-n", "-W", "pyproject.toml", "install", "WHEELHOUSE=/w"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    pips = [line for line in out.stdout.splitlines() if "pip install" in line]
    assert len(pips) == 2 and all("--no-index --find-links /w" in p for p in pips), out.stdout
    assert not any("index-url" in p for p in pips)
    wheelhouse = subprocess.run(["make", "-n", "wheelhouse", "WHEELHOUSE=/w"], cwd=ROOT, capture_output=True,
                                text=True, timeout=60).stdout
    assert '"torch==' in wheelhouse and ".[dev,workshop]" in wheelhouse and "-w /w" in wheelhouse


def test_the_proxy_keeps_a_slow_spawns_progress_stream_open(monkeypatch, tmp_path):
    # caught under load: the Python proxy gave the spawn page's progress stream tornado's default 20 s;
    # three servers starting at once took 24 s, the stream was cut with a 503, and the learners' pages
    # never went on to JupyterLab
    from traitlets.config import Config

    from lesson_lib.workshop import hubconfig, serve

    monkeypatch.setattr(hubconfig, "authenticator_class", lambda password_hash: object)
    conf = serve.settings(["ana"], "a-long-enough-password", "127.0.0.1", 8000, tmp_path, tmp_path / "venv",
                          tmp_path / "course", idle_timeout_s=600, kernel_idle_s=1200, limits=False)
    c = Config()
    hubconfig.configure(c, conf)
    flags = [a for a in c.ConfigurableHTTPProxy.command if a.startswith("--proxy-timeout=")]
    assert flags and int(flags[0].split("=")[1]) >= 1000 * c.Spawner.start_timeout > 20_000, flags


def test_the_rooms_folder_is_made_open_like_tmp_and_rooms_left_open_are_removed(tmp_path, monkeypatch):
    """serve makes the rooms' folder itself (an instructor's kernel would own it and refuse every later
    instructor), where learners' kernels look for it; cleanup removes the rooms a learner left open,
    unlinking a link without following it."""
    from lesson_lib.room import place

    monkeypatch.delenv("LESSON_ROOMS", raising=False)
    assert serve.ROOMS == place.rooms_dir()
    rooms = tmp_path / "rooms"
    serve.make_rooms(rooms)
    assert rooms.stat().st_mode & 0o7777 == 0o1777
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("")
    (rooms / "tuesday").mkdir()
    (rooms / "tuesday" / "store").write_text("")
    (rooms / "link").symlink_to(outside)
    me = pwd.getpwuid(os.getuid()).pw_name
    removed = accounts.remove_rooms(me, str(rooms))
    assert sorted(removed) == sorted(str(rooms / n) for n in ("tuesday", "link"))
    assert not list(rooms.iterdir()) and (outside / "keep").exists()
