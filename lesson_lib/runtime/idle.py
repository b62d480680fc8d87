"""Warm clusters give their memory back when idle.

Each warm rank holds 300–500 MB with torch loaded; a learner who has opened every chapter keeps
one kernel per chapter, each with its warm clusters. A daemon thread in the kernel closes a warm
cluster that has run no job for :func:`idle_seconds` (10 minutes by default), and closes them
sooner, after :data:`HANDOVER_S` idle, once another kernel of the same user has started a warm
cluster: the learner has moved on to another chapter. The next run starts fresh workers (a few
seconds). ``LESSON_LIB_IDLE_S`` sets the idle time; ``off`` keeps clusters for the kernel's life.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time

HANDOVER_S = 30.0  # another chapter started a cluster: ours go once idle this long
POLL_S = 2.0
_THREAD: threading.Thread | None = None


def idle_seconds() -> float | None:
    """Seconds without a job after which a warm cluster is closed; ``None`` when switched off."""
    raw = os.environ.get("LESSON_LIB_IDLE_S", "").strip().lower()
    if raw in ("off", "none", "never"):
        return None
    try:
        value = float(raw) if raw else 600.0
    except ValueError:
        raise ValueError(f"LESSON_LIB_IDLE_S must be a number of seconds or 'off', got {raw!r}") from None
    if not value > 0:
        raise ValueError(f"LESSON_LIB_IDLE_S must be a positive number of seconds or 'off', got {raw!r}")
    return value


def _marker() -> str | None:
    """This user's file naming the kernel that started a warm cluster last, in a folder only the
    user may enter (``None`` when that folder is someone else's: then the rule is skipped)."""
    folder = os.path.join(tempfile.gettempdir(), f"lesson_lib_u{os.getuid()}")
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    st = os.lstat(folder)
    if st.st_uid != os.getuid() or not os.path.isdir(folder) or os.path.islink(folder):
        return None
    return os.path.join(folder, "last-warm-start")


def announce() -> None:
    """Say that this kernel just started a warm cluster (other kernels of this user hand over)."""
    path = _marker()
    if path is None:
        return
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(f"{os.getpid()} {time.time()}")
    os.replace(tmp, path)


def _last_start_elsewhere() -> float | None:
    """When another kernel of this user last started a warm cluster (epoch seconds), or ``None``."""
    path = _marker()
    try:
        with open(path) as f:
            pid, when = f.read().split()
    except (OSError, TypeError, ValueError):
        return None
    return None if int(pid) == os.getpid() else float(when)


def reap(clusters, now: float | None = None) -> list:
    """Close the idle clusters among ``clusters`` (``Cluster`` objects); return those closed. A
    cluster in the middle of a job is never touched: its lock is held for the whole job."""
    now = time.monotonic() if now is None else now
    limit = idle_seconds()
    if limit is None:  # switched off: clusters stay for the kernel's life
        return []
    elsewhere = _last_start_elsewhere()
    closed = []
    for cluster in clusters:
        if not cluster.running or not cluster._use.acquire(blocking=False):
            continue
        try:
            idle = now - cluster.last_used
            handed_over = (elsewhere is not None and elsewhere > cluster.last_used_epoch
                           and idle >= HANDOVER_S)
            if cluster.running and (idle >= limit or handed_over):
                cluster.close()
                closed.append(cluster)
        finally:
            cluster._use.release()
    return closed


def watch(get_clusters) -> None:
    """Start the kernel's reaper thread once (a daemon: it never keeps the kernel alive)."""
    global _THREAD
    if _THREAD is not None and _THREAD.is_alive():
        return

    def loop():
        while True:
            time.sleep(POLL_S)
            try:
                reap(get_clusters())
            except Exception:  # a reaper must never take the kernel down
                pass

    _THREAD = threading.Thread(target=loop, name="lesson_lib-idle-reaper", daemon=True)
    _THREAD.start()
