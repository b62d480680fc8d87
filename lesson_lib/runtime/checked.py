"""Collectives checked against the peers' before they start: a mismatch is named, not aborted.

Gloo aborts a rank (SIGABRT, no Python traceback) whose receive does not match what a peer sent:
an all-reduce of another size, an ``all_to_all_single`` whose splits disagree, a collective made on
some ranks only, which meets the others' next one. In a worker every ``ProcessGroup`` method is
wrapped: it posts its call to the :class:`~.ledger.Ledger` and compares it with the same call of
the peers that have posted theirs. Of two ranks that disagree, the later raises
:class:`~.errors.CollectiveMismatch` naming both calls, their sizes and lines, before making it, so
Gloo never sees the pair. A rank that returns from the job while a peer waits on a call it never
made says so too. Functional collectives (DTensor's) bypass these methods and are not checked.
Cost per call: ``bench collectives``; ``LESSON_LIB_CHECK_COLLECTIVES=0`` turns it off.
"""

from __future__ import annotations

import os
import sys
import threading
import zlib

import torch
import torch.distributed as dist

from .errors import CollectiveMismatch
from .ledger import (
    DTYPE,
    DTYPE_CODES,
    JOB,
    KEY,
    OP,
    OPS,
    PEER,
    REDOP,
    ROOT,
    SEP,
    SLOTS,
    Ledger,
    disagreement,
    mismatch_message,
    returned_message,
)

# a process group's method -> what it is (also what exercises.observe records)
PG_OPS = {
    **dict.fromkeys(("allreduce", "allreduce_coalesced"), "all_reduce"),
    **dict.fromkeys(("reduce_scatter", "_reduce_scatter_base", "reduce_scatter_single",
                     "reduce_scatter_tensor_coalesced", "reduce_scatter_single_coalesced"), "reduce_scatter"),
    **dict.fromkeys(("allgather", "_allgather_base", "all_gather_single", "allgather_coalesced",
                     "allgather_into_tensor_coalesced", "all_gather_single_coalesced"), "all_gather"),
    **dict.fromkeys(("alltoall", "alltoall_base", "all_to_all_single"), "all_to_all"),
    "broadcast": "broadcast", "reduce": "reduce", "gather": "gather", "scatter": "scatter",
    "send": "send", "recv": "recv", "recv_anysource": "recv", "barrier": "barrier",
    "monitored_barrier": "barrier",
}
UNCHECKED = ("recv_anysource", "monitored_barrier")  # no partner known in advance; not a Gloo collective
_INPUT_SECOND = {"allgather", "allgather_coalesced", "allgather_into_tensor_coalesced", "all_gather_single",
                 "_allgather_base", "all_gather_single_coalesced", "gather", "reduce_scatter_single",
                 "_reduce_scatter_base", "reduce_scatter_tensor_coalesced", "reduce_scatter_single_coalesced"}
_RUNTIME = os.path.dirname(os.path.abspath(__file__))
_TORCH = os.path.dirname(os.path.abspath(torch.__file__))
_OBSERVE = os.path.join(os.path.dirname(_RUNTIME), "exercises", "observe.py")
_LOCK = threading.Lock()  # one post and one call at a time: calls reach Gloo in the order counted
_S: dict = {"ledger": None, "rank": 0, "job": 0, "counts": {}}
_GROUPS: dict = {}  # process group -> its channel, ranks and this rank's rank in it
_KINDS: dict[str, str] = {}  # file name -> "torch", "runtime", "library" or "mine"
_CRCS: dict[str, int] = {}  # channel -> its hash


def install(ledger: Ledger, rank: int) -> None:
    """In a worker, once: wrap every ``ProcessGroup`` method that pairs ranks up."""
    _S.update(ledger=ledger, rank=rank)
    group = dist.ProcessGroup
    for name in PG_OPS:
        if name in vars(group) and name not in UNCHECKED:
            setattr(group, name, _checked(getattr(group, name), name))
    if "recv_anysource" in vars(group):
        group.recv_anysource = _any_source(group.recv_anysource)


def _any_source(method):
    """A receive from any rank cannot be paired in advance, and the messages it takes leave this
    rank's count of each link behind its senders': point-to-point checks stop here for the job."""
    def recv_anysource(group, *args, **kwargs):
        _S["p2p_off"] = True
        return method(group, *args, **kwargs)

    recv_anysource.__doc__ = method.__doc__
    return recv_anysource


def begin(job: int) -> None:
    with _LOCK:
        _S.update(job=job, counts={}, p2p_off=False)


def end() -> None:
    """The job's function returned on this rank: raise if a peer waits on a call this rank never
    made (it would wait for the collective timeout)."""
    ledger, me, job = _S["ledger"], _S["rank"], _S["job"]
    _S["job"] = 0
    if ledger is None or not job:
        return
    ledger.finish(me, job)
    if not ledger.check:
        return
    mine, counts = _my_groups(), _S["counts"]
    for slot, q, key, seq, op, peer in ledger.heads(job):
        if q == me or seq <= counts.get(key, 0) or not (key in mine or (OPS[op] == "recv" and peer == me)):
            continue
        if _S.get("p2p_off") and OPS[op] in ("send", "recv"):  # this rank received from any source
            continue
        channel = mine.get(key) or f"the link from rank {me} to rank {q}"
        made = counts.get(key, 0)
        raise CollectiveMismatch(returned_message(channel, ledger.read(slot, q, seq), me, made,
                                                  ledger.read(slot, me, made) if made else None))


def _checked(method, name: str):
    kind = PG_OPS[name]
    code = OPS.index(kind)

    def checked(group, *args, **kwargs):
        if kind in ("send", "recv"):
            _peer_exists(kind, group, args, kwargs)
        ledger = _S["ledger"]
        if ledger is None or not _S["job"] or (_S.get("p2p_off") and kind in ("send", "recv")):
            return method(group, *args, **kwargs)
        try:
            key, parties, sig = _signature(name, kind, group, args, kwargs)
        except Exception:  # a spelling not foreseen, the same on every rank: left unchecked
            return method(group, *args, **kwargs)
        where = _where()
        with _LOCK:  # held while Gloo enqueues the call (it does not wait for it)
            _post_and_compare(ledger, key, parties, code, sig, where, group)
            return method(group, *args, **kwargs)

    checked.__name__ = checked.__qualname__ = name
    checked.__doc__ = method.__doc__
    return checked


def _peer_exists(kind: str, group, args: tuple, kwargs: dict) -> None:
    """Gloo crashes the process (SIGSEGV) on a send or receive to a rank the group does not have:
    the last stage of a pipeline sending on to rank P, say. Refuse it with the reason."""
    a = (*args, *kwargs.values()) if kwargs else args
    try:
        peer, n = int(a[1]), group.size()
    except Exception:  # a spelling not foreseen: left to torch
        return
    if not 0 <= peer < n:
        to = "dst" if kind == "send" else "src"
        raise ValueError(f"dist.{kind}(..., {to}={peer}): there is no rank {peer}; the ranks of this "
                         f"group are 0 to {n - 1}. (Is it the last rank sending on, or the first "
                         "receiving from before it?)")


def _post_and_compare(ledger: Ledger, key: str, parties, code: int, sig: tuple, where: bytes, group) -> None:
    """Post this call, then compare it with the same call of each peer that has posted it, or, for a
    peer that returned from the job without it, say so."""
    me, job, kind = _S["rank"], _S["job"], OPS[code]
    crc = _CRCS.get(key) or _CRCS.setdefault(key, zlib.crc32(key.encode()))
    slot = crc % SLOTS
    counts = _S["counts"]
    seq = counts[crc] = counts.get(crc, 0) + 1
    mine = ledger.post(slot, me, seq, ledger.fields(job, crc, code, *sig), where)
    if not ledger.check:
        return
    p2p = kind in ("send", "recv")
    for q in parties:
        if q == me:
            continue
        theirs = ledger.raw(slot, q, seq)
        if theirs is not None and theirs[JOB] == job and theirs[KEY] == crc:
            if (theirs[DTYPE:ROOT] != mine[DTYPE:ROOT] if p2p else  # the common case, equal calls,
                    theirs[OP:PEER] != mine[OP:PEER] or theirs[REDOP:] != mine[REDOP:]):  # stays on ints
                a, b = ledger.read(slot, min(me, q), seq), ledger.read(slot, max(me, q), seq)  # by rank
                why = disagreement(a, b) if a is not None and b is not None else None
                if why:
                    raise CollectiveMismatch(mismatch_message(_channel(key, group), seq, a, b, why))
        elif kind != "send" and ledger.done(q) == job:  # q returned: has it made this call?
            made = ledger.count(slot, q, job, crc)
            if made is not None and made < seq:
                waiting, last = ledger.read(slot, me, seq), ledger.read(slot, q, made) if made else None
                raise CollectiveMismatch(returned_message(_channel(key, group), waiting, q, made, last))


def _signature(name: str, kind: str, group, args: tuple, kwargs: dict):
    """(channel, its ranks, (dtype code, elements, root, peer, group rank, reduction, sends, receives))."""
    a = (*args, *kwargs.values()) if kwargs else args
    key, ranks, grank = _GROUPS.get(group) or _GROUPS.setdefault(group, _group(group))
    root = next((int(x.rootRank) for x in a if hasattr(x, "rootRank")), -1)
    red = next((x.reduceOp for x in a if hasattr(x, "reduceOp")), None)
    redop = int(red.op) + 1 if red is not None else 0  # REDOPS: 0 none, then c10d's order
    sends = receives = ()
    peer = -1
    if kind in ("send", "recv"):
        me = _S["rank"]
        peer, tag = ranks[int(a[1])], int(a[2]) if len(a) > 2 else 0
        src, dst = (me, peer) if kind == "send" else (peer, me)
        key, ranks = f"p{src}>{dst}t{tag}@{key}", (src, dst)  # each group is a channel of its own
        tensors = _tensors(a[0])
    elif kind == "all_to_all":
        if name == "alltoall":
            receives, sends, tensors = [t.numel() for t in a[0]], [t.numel() for t in a[1]], _tensors(a[1])
        else:
            n = len(ranks)
            receives, sends, tensors = _elements(a[0], a[2], n), _elements(a[1], a[3], n), [a[1]]
    elif name == "reduce_scatter":
        sends, tensors = [t.numel() for t in a[1][0]], _tensors(a[1])
    else:
        tensors = _tensors(a[1] if name in _INPUT_SECOND else a[0]) if a else []
    dtype = DTYPE_CODES.get(tensors[0].dtype, 0) if tensors else 0
    numel = tensors[0].numel() if len(tensors) == 1 else sum(t.numel() for t in tensors)
    return key, ranks, (dtype, numel, root, peer, grank, redop, sends, receives)


def _group(group) -> tuple[str, list[int], int]:
    """The group's channel, its ranks as the world numbers them (by group rank), this rank's rank in it."""
    ranks = dist.get_process_group_ranks(group)
    return "g" + group.group_name, ranks, ranks.index(_S["rank"]) if _S["rank"] in ranks else -1


def _my_groups() -> dict[int, str]:
    """The channels of every group this rank is in: hash -> how a message names it."""
    groups = dist.distributed_c10d._world.pg_group_ranks
    return {zlib.crc32(("g" + pg.group_name).encode()): _channel("g" + pg.group_name, pg)
            for pg, ranks in groups.items() if _S["rank"] in ranks}


def _tensors(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if not isinstance(x, (list, tuple)):
        return []
    return list(x) if len(x) == 1 and isinstance(x[0], torch.Tensor) else [t for i in x for t in _tensors(i)]


def _elements(t: torch.Tensor, splits, n: int) -> list[int]:
    """all_to_all_single's split sizes (rows of dim 0) as elements per rank; none given: even."""
    splits = list(splits)
    if not splits:
        return [t.numel() // n] * n
    row = t.numel() // t.shape[0] if t.dim() and t.shape[0] else 1
    return [int(s) * row for s in splits]


def _where() -> bytes:
    """The learner's frame that made the call and, below it, the library function it called (if
    any): the innermost frames outside torch, up to the job loop."""
    frame, inner = sys._getframe(2), ""
    while frame is not None:
        filename = frame.f_code.co_filename
        kind = _KINDS.get(filename) or _KINDS.setdefault(filename, _kind(filename))
        if kind == "runtime":
            break
        if kind != "torch":
            here = f"{filename}{SEP}{frame.f_lineno}{SEP}{frame.f_code.co_name}"
            if kind == "mine":
                return (f"{inner}{SEP}{here}" if inner else here).encode()
            inner = inner or here
        frame = frame.f_back
    return inner.encode()


def _kind(filename: str) -> str:
    path = os.path.abspath(filename)
    if path.startswith(_TORCH + os.sep) or path == _OBSERVE:  # torch's, or a wrapper that records calls
        return "torch"
    if path.startswith(_RUNTIME + os.sep):
        return "runtime"
    return "library" if path.startswith(os.path.dirname(_RUNTIME) + os.sep) else "mine"


def _channel(key: str, group) -> str:
    if key.startswith("p"):
        src, rest = key[1:].split(">", 1)
        dst, rest = rest.split("t", 1)
        tag, _, _ = rest.partition("@")
        world = group is None or group == dist.group.WORLD
        return (f"the link from rank {src} to rank {dst}" + (f" (tag {tag})" if tag != "0" else "")
                + ("" if world else f" in the group of ranks {dist.get_process_group_ranks(group)}"))
    if group is None or group == dist.group.WORLD:
        return "the default group"
    return f"the group of ranks {dist.get_process_group_ranks(group)}"
