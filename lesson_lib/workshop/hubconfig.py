"""JupyterHub's configuration for the workshop, read by the hub process only (it imports jupyterhub).

``serve`` writes ``STATE/jupyterhub_config.py``, two lines that call :func:`configure` with
``STATE/settings.json``. Choices, and why (docs/workshop.md says more):

* **Authenticator**: :func:`authenticator_class`, a small subclass of JupyterHub's ``Authenticator``:
  the learners' names are the allowed users and the one workshop password is checked against a
  salted scrypt hash. JupyterHub's ``SharedPasswordAuthenticator`` keeps the password in plain text
  in its config; PAM would give every learner a Unix password that also opens ``su`` and ssh.
* **Spawner**: ``LocalProcessSpawner``: each learner's JupyterLab runs as their own Unix user
  (``SimpleLocalProcessSpawner`` would run them all as root, one user's files open to all).
* **Idle culler**: ``jupyterhub-idle-culler`` stops servers idle for ``idle_timeout_s``; each server
  also shuts kernels down after ``kernel_idle_s``, so an abandoned kernel's ranks free their cores.
* **Network**: the proxy listens on ``ip`` (127.0.0.1 unless ``serve --ip``); the hub, the proxy's
  API and every learner's server on 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from .accounts import check_password


def authenticator_class(password_hash: str):
    """An Authenticator that accepts the allowed names with the workshop password."""
    from jupyterhub.auth import Authenticator

    class WorkshopAuthenticator(Authenticator):
        """Learner names from the list; one password for all, checked against its scrypt hash."""

        async def authenticate(self, handler, data):
            name, password = (data or {}).get("username", ""), (data or {}).get("password", "")
            ok = await asyncio.get_running_loop().run_in_executor(None, check_password, password,
                                                                  password_hash)
            return name if ok else None  # the hub then checks the name against allowed_users

    return WorkshopAuthenticator


def configure(c, settings: dict) -> None:
    """Fill JupyterHub's config object ``c`` from the settings ``serve`` wrote."""
    state, venv, course = Path(settings["state"]), Path(settings["venv"]), Path(settings["course"])
    bin_ = venv / "bin"
    c.JupyterHub.ip, c.JupyterHub.port = settings["ip"], settings["port"]
    c.JupyterHub.hub_ip, c.JupyterHub.hub_port = "127.0.0.1", settings["hub_port"]
    c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{settings['proxy_api_port']}"
    # The Python proxy gives each proxied request tornado's default 20 s unless told otherwise, and
    # the spawn page's progress stream lasts as long as a learner's server takes to start: on a busy
    # machine (3 servers at once on 2 cores took 24 s) it was cut with a 503 and the page never went
    # on to JupyterLab. Give it the spawner's own limit, plus a minute.
    c.ConfigurableHTTPProxy.command = [str(bin_ / "configurable-http-proxy"),
                                       f"--proxy-timeout={(settings['start_timeout_s'] + 60) * 1000}"]
    c.ConfigurableHTTPProxy.pid_file = str(state / "proxy.pid")
    c.JupyterHub.db_url = f"sqlite:///{state / 'jupyterhub.sqlite'}"
    c.JupyterHub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")
    c.JupyterHub.pid_file = str(state / "jupyterhub.pid")
    c.JupyterHub.cleanup_servers = True  # a stopped hub stops every learner's server
    c.JupyterHub.cleanup_proxy = True

    c.JupyterHub.authenticator_class = authenticator_class(settings["password_hash"])
    c.Authenticator.allowed_users = set(settings["names"])
    c.Authenticator.admin_users = set()

    c.JupyterHub.spawner_class = "jupyterhub.spawner.LocalProcessSpawner"
    c.Spawner.cmd = [str(bin_ / "python"), str(course / "lesson_lib" / "workshop" / "start.py")]
    c.Spawner.notebook_dir = "~/course"
    c.Spawner.default_url = "/lab/tree/README.md"  # the table of contents, shown as Markdown
    c.Spawner.environment = {"PATH": f"{bin_}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
                             "GLOO_SOCKET_IFNAME": "lo"}  # ranks talk over loopback only
    c.Spawner.args = [f"--MappingKernelManager.cull_idle_timeout={settings['kernel_idle_s']}",
                      "--MappingKernelManager.cull_interval=60",
                      "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    c.Spawner.start_timeout = c.Spawner.http_timeout = settings["start_timeout_s"]
    for key in ("cpu_limit", "mem_limit"):  # passed on as CPU_LIMIT / MEM_LIMIT, read by the runtime
        if settings.get(key):
            setattr(c.Spawner, key, settings[key])

    c.JupyterHub.services = [{
        "name": "idle-culler",
        "command": [str(bin_ / "python"), "-m", "jupyterhub_idle_culler",
                    f"--timeout={settings['idle_timeout_s']}", f"--cull-every={settings['cull_every_s']}"],
    }]
    c.JupyterHub.load_roles = [{
        "name": "idle-culler", "services": ["idle-culler"],
        "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
    }]


def load(c, settings_path: str) -> None:
    """What STATE/jupyterhub_config.py calls."""
    configure(c, json.loads(Path(settings_path).read_text(encoding="utf-8")))
