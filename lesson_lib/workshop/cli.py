"""``python -m lesson_lib workshop serve|reset|remove``: a JupyterHub for a room (docs/workshop.md).

Nothing here imports jupyterhub: the hub's own packages (``pip install .[workshop]``) are needed in the
shared install that ``serve`` builds, never on a learner's laptop.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from . import accounts

USAGE = """\
usage: python -m lesson_lib workshop COMMAND [options]     (as root; docs/workshop.md)

commands:
  serve NAMES|--learners FILE   install the course once, make a Unix user per learner, run the hub
  reset NAME                    give learner NAME a clean copy of the notebooks (the old one kept)
  remove NAMES|--learners FILE  delete learners' Unix users and homes, their work with them (--yes)
"""
CHECKOUT = Path(__file__).resolve().parents[2]  # the course's source (pyproject.toml, notebooks/)
DEFAULT_PREFIX, DEFAULT_STATE = "/opt/lesson-workshop", "/var/lib/lesson-workshop"


def _names(args) -> list[str]:
    text = Path(args.learners).read_text(encoding="utf-8") if args.learners else " ".join(args.names)
    return accounts.parse_names(text)


def _password(args) -> str:
    """From --password-file, else WORKSHOP_PASSWORD, else the default (loopback only)."""
    if args.password_file:
        return Path(args.password_file).read_text(encoding="utf-8").strip()
    return os.environ.get("WORKSHOP_PASSWORD") or accounts.DEFAULT_PASSWORD


def _parser(cmd: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m lesson_lib workshop {cmd}")
    if cmd in ("serve", "remove"):
        p.add_argument("names", nargs="*", help="learner names (or --learners FILE, one a line)")
        p.add_argument("--learners", metavar="FILE", help="a file of learner names, one a line")
    if cmd == "reset":
        p.add_argument("name", help="the learner")
        p.add_argument("--stop", action="store_true", help="stop the learner's server and kernels first")
    p.add_argument("--prefix", default=DEFAULT_PREFIX, help=f"the shared install (default {DEFAULT_PREFIX})")
    if cmd == "serve":
        p.add_argument("--ip", default="127.0.0.1",
                       help="the address to listen on (default 127.0.0.1; another opens it to the room)")
        p.add_argument("--port", type=int, default=8000)
        p.add_argument("--password-file", metavar="FILE",
                       help="the workshop password (else $WORKSHOP_PASSWORD, else a default that only "
                            "127.0.0.1 accepts)")
        p.add_argument("--state", default=DEFAULT_STATE,
                       help=f"the hub's own files (default {DEFAULT_STATE})")
        p.add_argument("--wheelhouse", metavar="DIR", help="install from this folder only (make wheelhouse)")
        p.add_argument("--idle-timeout", type=int, default=3600, metavar="S",
                       help="stop a learner's server idle this long (jupyterhub-idle-culler; default 3600)")
        p.add_argument("--kernel-idle-timeout", type=int, default=1200, metavar="S",
                       help="shut a kernel idle this long down, its ranks with it (default 1200)")
        p.add_argument("--no-limits", action="store_true",
                       help="do not pass each learner a share of the cores and memory (CPU_LIMIT/MEM_LIMIT)")
    if cmd == "remove":
        p.add_argument("--yes", action="store_true", help="yes, delete their homes and work")
    return p


def cmd_serve(argv: list[str]) -> int:
    from .serve import serve

    args = _parser("serve").parse_args(argv)
    try:
        names = _names(args)
        return serve(names, _password(args), ip=args.ip, port=args.port, prefix=Path(args.prefix),
                     state=Path(args.state), src=CHECKOUT, wheelhouse=args.wheelhouse,
                     idle_timeout_s=args.idle_timeout, kernel_idle_s=args.kernel_idle_timeout,
                     limits=not args.no_limits)
    except (ValueError, OSError) as e:
        print(f"workshop serve: {e}", file=sys.stderr)
        return 2


def cmd_reset(argv: list[str]) -> int:
    from .serve import run_as

    args = _parser("reset").parse_args(argv)
    if not accounts.is_learner(args.name):
        print(f"workshop reset: {args.name!r} is not a workshop learner on this machine", file=sys.stderr)
        return 2
    import pwd

    running = accounts.pids_of(pwd.getpwnam(args.name).pw_uid)
    if running and not args.stop:
        print(f"workshop reset: {args.name}'s server is running ({len(running)} processes): their open "
              f"notebooks would save over the clean copy. Stop it from the hub's admin page, or pass "
              f"--stop", file=sys.stderr)
        return 2
    if running:
        accounts.stop_processes(args.name)
    prefix = Path(args.prefix).resolve()
    print(run_as(args.name, prefix / "venv", prefix / "course", "--reset"))
    return 0


def cmd_remove(argv: list[str]) -> int:
    args = _parser("remove").parse_args(argv)
    names = _names(args)
    if not args.yes:
        print(f"workshop remove: this deletes {', '.join(names)} and their homes; add --yes", file=sys.stderr)
        return 2
    accounts.remove_users(names)
    print(f"removed {', '.join(names)}")
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, end="", file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    commands = {"serve": cmd_serve, "reset": cmd_reset, "remove": cmd_remove}
    if argv[0] not in commands:
        print(f"unknown workshop command {argv[0]!r} (choose one of: {', '.join(commands)})", file=sys.stderr)
        return 2
    return commands[argv[0]](argv[1:])
