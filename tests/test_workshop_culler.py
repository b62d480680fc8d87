"""The hub's login and its idle culler, without a browser: a wrong password is refused, the right one
starts the learner's server, and ``jupyterhub-idle-culler`` stops that server once it has been idle
for ``--idle-timeout`` seconds, so an abandoned server gives its cores back."""

from __future__ import annotations

import http.cookiejar
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from workshop_support import PREFIX, ROOT, learners, uid_pids, wait_until
from workshop_support import shared_install as shared_install  # a fixture

pytestmark = [pytest.mark.slow, pytest.mark.ch0]
NAME = "lw-cull-dee"
IDLE_S = 10


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _log_in(base: str, name: str, password: str) -> int:
    """POST the hub's login form as a browser would; the status of the answer (redirects followed)."""
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    with opener.open(f"{base}/hub/login", timeout=30) as r:
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', r.read().decode()).group(1)
    form = urllib.parse.urlencode({"username": name, "password": password, "_xsrf": xsrf}).encode()
    try:
        with opener.open(f"{base}/hub/login", form, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_a_wrong_password_is_refused_and_an_idle_server_is_culled(shared_install):
    password, port = secrets.token_urlsafe(12), _free_port()
    base, state = f"http://127.0.0.1:{port}", Path(tempfile.mkdtemp(prefix="workshop-state-"))
    log_path = ROOT / "artifacts" / "workshop" / "culler-hub.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with learners([NAME]) as (user,), open(log_path, "wb") as log:
        serve = subprocess.Popen(
            [sys.executable, "-m", "lesson_lib", "workshop", "serve", NAME, "--prefix", str(PREFIX),
             "--state", str(state), "--port", str(port), "--idle-timeout", str(IDLE_S)],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "WORKSHOP_PASSWORD": password}, start_new_session=True)
        try:
            def hub_up():
                assert serve.poll() is None, log_path.read_text(errors="replace")[-3000:]
                try:
                    with urllib.request.urlopen(f"{base}/hub/api", timeout=2) as r:
                        return r.status == 200
                except OSError:
                    return False
            wait_until(f"the hub to answer on {base}/hub/api", hub_up, 90, 0.5)
            assert _log_in(base, NAME, password + "x") == 403
            assert _log_in(base, "not-a-learner", password) == 403
            assert not uid_pids(user.pw_uid), "a refused login started a server"
            assert _log_in(base, NAME, password) == 200  # the spawn page, then the server starts
            wait_until(f"{NAME}'s server to start", lambda: uid_pids(user.pw_uid), 90)
            wait_until(f"the idle culler to stop {NAME}'s server ({IDLE_S} s idle)",
                       lambda: not uid_pids(user.pw_uid), 120, 1)
            assert "Culling server" in log_path.read_text(errors="replace")
        finally:
            if serve.poll() is None:
                serve.send_signal(signal.SIGINT)
            assert serve.wait(timeout=120) == 0, log_path.read_text(errors="replace")[-3000:]
            shutil.rmtree(state, ignore_errors=True)
