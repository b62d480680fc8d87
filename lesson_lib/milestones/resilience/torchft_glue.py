"""The one place the course reaches torchft (``torchft==0.2.0``; chapter 10 §2–3), held to loopback.

What torchft would otherwise open beyond this machine, and how each is kept on 127.0.0.1:

* the Lighthouse: ``LighthouseServer(bind="127.0.0.1:0")``; its ``address()`` names the host by
  ``socket.gethostname()``, so replicas are given ``http://127.0.0.1:<port>`` instead;
* the Manager's server: ``Manager`` binds ``[::]:<port>`` with no option to change the address (only
  the port, ``TORCHFT_MANAGER_PORT``), so :func:`_loopback_server` replaces the ``ManagerServer``
  it builds with one bound to ``127.0.0.1:0``, and ``hostname="127.0.0.1"`` is what it advertises;
* the checkpoint transport: the default ``HTTPTransport`` serves on all interfaces at
  ``socket.gethostname()``; ``PGTransport`` sends the state over the replicas' own process group;
* each replica group's store: c10d's ``TCPStore`` binds ``::`` whatever host it is given, so it is
  handed a socket already listening on 127.0.0.1 (``master_listen_fd``);
* Gloo: ``GLOO_SOCKET_IFNAME=lo`` (set by :mod:`lesson_lib.runtime.replicas`).

Quirks that change a number: ``use_async_quorum=False`` (the default async quorum lets a replica copy
weights at step 0 while the sum still divides by 2: no longer equal to one process); DiLoCo with
``init_sync=False`` (the default first copies replica 0's weights, equal anyway here, since every
replica starts from one seed, but one more exchange to count). ``RUST_LOG=warn`` silences its logs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import time
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

from . import task as T


@contextlib.contextmanager
def lighthouse(min_replicas: int, heartbeat_timeout_ms: int = 2000, host: str = "127.0.0.1"):
    """A Lighthouse on ``host`` (loopback unless a test says otherwise); yields its address."""
    os.environ.setdefault("RUST_LOG", "warn")
    from torchft.coordination import LighthouseServer

    server = LighthouseServer(bind=f"{host}:0", min_replicas=min_replicas, join_timeout_ms=200,
                              heartbeat_timeout_ms=heartbeat_timeout_ms)
    try:
        yield f"http://{host}:" + server.address().rsplit(":", 1)[1]
    finally:
        server.shutdown()


def _bound_server(host: str):
    """The Manager's server on ``host`` only (torchft hard-codes ``[::]``)."""
    import torchft.manager as tm

    real = tm.ManagerServer
    original = getattr(real, "_course_original", real)

    def on_loopback(*args, **kwargs):
        kwargs["bind"] = f"{host}:0"
        return original(*args, **kwargs)

    on_loopback._course_original = original
    tm.ManagerServer = on_loopback


CAUGHT: list[str] = []  # in a replica's process: the errors torchft logged (and survived), in order


class _Keep(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        CAUGHT.append(_short(record.getMessage()))


def _short(message: str) -> str:
    """torchft's '[r0:<uuid>/0 - step 4] got exception waiting for work [/path/pair.cc:553] Connection
    closed by peer [127.0.0.1]:37510. This is typically ...' as 'step 4: got exception waiting for
    work: Connection closed by peer [127.0.0.1]:37510'."""
    import re

    first = message.strip().splitlines()[0] if message.strip() else ""
    step = re.match(r"\[[^\]]*- step (\d+)\]\s*", first)
    text = first[step.end():] if step else first
    text = re.sub(r"\s*\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*", ": ", text)  # gloo's source location
    text = text.split(". This is typically")[0]
    return (f"step {step.group(1)}: " if step else "") + text


def _keep_torchft_errors() -> None:
    """torchft logs each error it survives with a full traceback (logger.exception), which reached the
    notebook raw ("Connection closed by peer ... GLHF!") before the chapter's summary. Keep them
    instead (:data:`CAUGHT`): the replica returns them and the chapter prints one line each. Its
    per-step INFO and flight-recorder notes stay off (level ERROR)."""
    log = logging.getLogger("torchft")
    log.setLevel(logging.ERROR)
    if not any(isinstance(h, _Keep) for h in log.handlers):
        log.addHandler(_Keep())
    log.propagate = False


def manager(me: int, lighthouse_addr: str, model, opt, timeout_s: float = 5.0, init_sync: bool = True,
            host: str = "127.0.0.1"):
    """A replica group of one process: its store, its Gloo group and its ``Manager``, all on ``host``
    (loopback; the real-network test gives a network namespace's own address)."""
    from torchft import Manager, ProcessGroupGloo
    from torchft.checkpointing.pg_transport import PGTransport

    _keep_torchft_errors()
    warnings.filterwarnings("ignore", module="torchft")  # torch deprecations raised inside torchft 0.2.0
    _bound_server(host)
    listener = socket.socket()
    listener.bind((host, 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    store = dist.TCPStore(host, port, is_master=True, wait_for_workers=False,
                          master_listen_fd=listener.detach(), use_libuv=True)
    timeout = timedelta(seconds=timeout_s)
    pg = ProcessGroupGloo(timeout=timeout)
    mgr = Manager(
        pg=pg, min_replica_size=1, use_async_quorum=False, rank=0, world_size=1,
        store_addr=host, store_port=port, lighthouse_addr=lighthouse_addr, replica_id=f"r{me}",
        hostname=host, timeout=timeout, init_sync=init_sync, quorum_timeout=timedelta(seconds=30),
        load_state_dict=lambda s: (model.load_state_dict(s["model"]), opt.load_state_dict(s["opt"])),
        state_dict=lambda: {"model": model.state_dict(), "opt": opt.state_dict()},
        checkpoint_transport=PGTransport(pg, timeout=timeout, device=torch.device("cpu")))
    return mgr, store


def replica(me: int, n: int, store_path: str, task: T.Task, lighthouse_addr: str,
            kill: tuple[int, int] | None = None, host: str = "127.0.0.1") -> dict:
    """Our task under torchft: ``Manager.allreduce`` on the flat gradient, commit if ``should_commit``.
    ``kill = (replica, step)``: that replica SIGKILLs itself after its gradient, before the exchange."""
    marks = dist.FileStore(store_path, -1)
    fresh = marks.add(f"hello/{me}", 1) > 1
    train, _ = T.data(task)
    model, opt = T.build(task)
    mgr, store = manager(me, lighthouse_addr, model, opt, host=host)
    log, times = [], []
    try:
        while mgr.current_step() < task.steps:
            t0 = time.monotonic()
            mgr.start_quorum()
            step = mgr.current_step()
            if fresh:
                log.append({"healed_at": step})
                fresh = False
            grad = T.gradient(model, T.batch(task, train, step, me))
            if kill == (me, step) and marks.add(f"killed/{me}", 1) == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            mgr.allreduce(grad).wait()  # an average over the quorum's participants
            if mgr.should_commit():
                T.set_gradient(model, grad)
                opt.step()
                log.append({"step": step, "members": mgr.num_participants()})
            else:
                log.append({"discarded": step})
            times.append({"step": step, "t": time.monotonic(), "s": time.monotonic() - t0})
    finally:
        mgr.shutdown()
    return {"params": T.flat_params(model), "log": log, "times": times, "replica": me,
            "torchft_errors": list(CAUGHT)}


def diloco(me: int, n: int, store_path: str, task: T.Task, lighthouse_addr: str, h: int,
           outer_lr: float, outer_momentum: float, fragments: int = 1, delay: int = 0,
           alpha: float = 0.0) -> dict:
    """Our task under ``torchft.local_sgd.DiLoCo``: ``task.steps`` inner SGD steps, an outer Nesterov
    step every ``h``; the floats each replica all-reduced, counted. With ``fragments`` > 1, Streaming
    DiLoCo: the model's layers as fragments, one synced every h / fragments steps, its all-reduce
    started ``delay`` steps before it is applied, local and global mixed by ``alpha``; one outer
    optimizer per fragment."""
    from torchft.local_sgd import DiLoCo

    train, held = T.data(task)
    model, inner = T.build(task)
    parts = [model] if fragments == 1 else T.fragments(model, fragments)
    outer = [torch.optim.SGD(m.parameters(), lr=outer_lr, momentum=outer_momentum, nesterov=True)
             for m in parts]
    mgr, store = manager(me, lighthouse_addr, model, inner, init_sync=False)
    sent, real = [0], mgr.allreduce

    def counted(t, *args, **kwargs):
        sent[0] += t.numel()
        return real(t, *args, **kwargs)

    mgr.allreduce = counted
    try:
        with DiLoCo(mgr, parts, inner, outer if fragments > 1 else outer[0], sync_every=h,
                    fragment_sync_delay=delay, fragment_update_alpha=alpha):
            for step in range(task.steps):
                T.set_gradient(model, T.gradient(model, T.batch(task, train, step, me)))
                inner.step()
    finally:
        mgr.shutdown()
    return {"params": T.flat_params(model), "floats_sent": sent[0], "held_out": T.held_out_loss(model, held)}
