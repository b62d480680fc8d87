"""Each rank's collective calls, posted in shared memory where its peers and the parent read them.

A rank posts every call it makes through a ``ProcessGroup`` just before making it (:mod:`.checked`):
the op, the element counts, the dtype, the root, the reduction, and the lines that called it. Calls meet on a
*channel* — a process group, or one direction of a point-to-point link with its tag — where each
rank's k-th call must match the others' k-th. No lock: a rank writes only its own entries, the
sequence number last, and a reader keeps an entry only if its number did not change while read.
After a crash the parent reads each rank's last call (:meth:`Ledger.postmortem`).
"""

from __future__ import annotations

import ctypes
import linecache
import os
import struct
from typing import NamedTuple

import torch

from .errors import UNMATCHED

SLOTS = 64  # channels, by hash of their name; two names on one slot are told apart by the hash
RING = 4  # a rank's latest calls kept per channel: asynchronous calls may run ahead of a peer's
TEXT = 256  # bytes for the lines that made one call, NUL-terminated
SEP = "\x1f"  # between a frame's file, line and function
MAX_VEC = 16  # split sizes kept (all_to_all checked pair by pair) in worlds up to this size
SEQ, JOB, KEY, OP, DTYPE, NUMEL, ROOT, PEER, GRANK, REDOP, NVEC = range(11)
FIELDS = 11
OPS = ("?", "all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "gather",
       "scatter", "barrier", "send", "recv")
REDOPS = ("?", "SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM")  # c10d's order
DTYPES = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)
DTYPE_CODES = {d: i + 1 for i, d in enumerate(DTYPES)}  # 0: unknown
ENV = "LESSON_LIB_CHECK_COLLECTIVES"  # "0": off (benchmarks), "record": for a post-mortem only, else on
LIBRARY_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def mode() -> str:
    """How this process's next clusters treat collectives (:data:`ENV`): "on", "record" or "off"."""
    value = os.environ.get(ENV, "1").strip().lower()
    return "off" if value in ("0", "off", "false", "no") else "record" if value == "record" else "on"


_INT, _HEAD, _TEXT = (struct.Struct(f) for f in ("q", f"{PEER + 1}q", f"{TEXT}s"))


class Call(NamedTuple):
    """One posted call, decoded. ``numel`` -1 and ``dtype`` None: unknown (never a mismatch)."""

    rank: int
    seq: int
    job: int
    key: int
    op: str
    dtype: torch.dtype | None
    numel: int
    root: int
    peer: int
    grank: int  # the poster's rank in the group (all_to_all's splits are indexed by it)
    redop: str | None  # the reduction (SUM, MAX, ...) of a reducing collective, else None
    sends: tuple  # all_to_all: elements to each rank of the group; reduce_scatter: the chunks
    receives: tuple  # all_to_all: elements from each rank of the group
    where: str  # "file␟line␟function" (SEP) of the innermost library frame, then of the learner's


class Ledger:
    """Shared memory for ``world_size`` ranks; made by the parent, handed to each worker.
    ``check``: compare calls as they are made (else only record them for a post-mortem)."""

    def __init__(self, world_size: int, ctx, check: bool = True):
        self.world, self.check = world_size, check
        self.vec = world_size if world_size <= MAX_VEC else 0
        self.width = FIELDS + 2 * self.vec
        self.entries = SLOTS * world_size * RING
        self.done_at = self.entries * self.width
        self.last_at = self.done_at + world_size
        self.ints = ctx.Array("q", self.last_at + world_size, lock=False)
        self.text = ctx.Array("c", self.entries * TEXT, lock=False)
        for r in range(world_size):
            self.ints[self.last_at + r] = -1
        self._structs()

    def _structs(self) -> None:
        self._fields = struct.Struct(f"{self.width - 1}q")
        self._entry = struct.Struct(f"{self.width}q")
        self._zeros = (0,) * (2 * self.vec)

    def __getstate__(self) -> dict:  # to a worker: the shared arrays, not the (unpicklable) formats
        return {k: v for k, v in vars(self).items() if k not in ("_fields", "_entry")}

    def __setstate__(self, state: dict) -> None:
        vars(self).update(state)
        self._structs()

    def entry(self, slot: int, rank: int, seq: int) -> int:
        return (slot * self.world + rank) * RING + seq % RING

    # -- writing (a rank, its own entries only)
    def post(self, slot: int, rank: int, seq: int, fields: tuple, where: bytes) -> tuple:
        """Write call number ``seq`` of ``rank`` on ``slot``: ``fields`` are JOB … NVEC and the
        vectors (:meth:`fields`); returns the entry as a reader sees it."""
        e = self.entry(slot, rank, seq)
        at = 8 * e * self.width
        _INT.pack_into(self.ints, at, -1)  # being written
        self._fields.pack_into(self.ints, at + 8, *fields)
        _TEXT.pack_into(self.text, e * TEXT, where[:TEXT - 1])
        _INT.pack_into(self.ints, at, seq)
        _INT.pack_into(self.ints, 8 * (self.last_at + rank), e)
        return (seq, *fields)

    def fields(self, job: int, key: int, op: int, dtype: int, numel: int, root: int, peer: int, grank: int,
               redop: int = 0, sends=(), receives=()) -> tuple:
        head = (job, key, op, dtype, numel, root, peer, grank, redop)
        if not (self.vec and (sends or receives)):
            return (*head, 0) + self._zeros
        return (*head, 1, *_padded(sends, self.vec), *_padded(receives, self.vec))

    def finish(self, rank: int, job: int) -> None:
        """``rank`` returned from job ``job``'s function."""
        self.ints[self.done_at + rank] = job

    # -- reading (any rank, the parent)
    def raw(self, slot: int, rank: int, seq: int) -> tuple | None:
        """Call ``seq`` of ``rank`` on ``slot`` as ints, if it is there (not overwritten, nor being
        written)."""
        at = 8 * self.entry(slot, rank, seq) * self.width
        v = self._entry.unpack_from(self.ints, at)
        return v if v[SEQ] == seq and _INT.unpack_from(self.ints, at)[0] == seq else None

    def read(self, slot: int, rank: int, seq: int) -> Call | None:
        v = self.raw(slot, rank, seq)
        return None if v is None else self.decode(v, rank, self.entry(slot, rank, seq))

    def decode(self, v: tuple, rank: int, e: int) -> Call:
        sends = receives = ()
        if self.vec and v[NVEC]:
            sends, receives = tuple(v[FIELDS:FIELDS + self.vec]), tuple(v[FIELDS + self.vec:])
        where = ctypes.string_at(ctypes.addressof(self.text) + e * TEXT).decode(errors="replace")
        return Call(rank, v[SEQ], v[JOB], v[KEY], OPS[v[OP]], DTYPES[v[DTYPE] - 1] if v[DTYPE] else None,
                    v[NUMEL], v[ROOT], v[PEER], v[GRANK], REDOPS[v[REDOP]] if v[REDOP] else None, sends,
                    receives, where)

    def count(self, slot: int, rank: int, job: int, key: int) -> int | None:
        """How many calls ``rank`` made on channel ``key`` in ``job``, as its entries show; None when
        another channel on the same slot hides them."""
        seqs, other = [0], False
        for e in range(self.entry(slot, rank, 0), self.entry(slot, rank, 0) + RING):
            v = _HEAD.unpack_from(self.ints, 8 * e * self.width)
            if v[JOB] == job:
                seqs.append(v[SEQ]) if v[KEY] == key else None
                other = other or v[KEY] != key
        return None if other else max(seqs)

    def heads(self, job: int):
        """(slot, rank, key, seq, op code, peer) of every entry of ``job`` (a rank's end-of-job check)."""
        for e in range(self.entries):
            v = _HEAD.unpack_from(self.ints, 8 * e * self.width)
            if v[JOB] == job and v[SEQ] > 0:
                slot, rank = divmod(e // RING, self.world)
                yield slot, rank, v[KEY], v[SEQ], v[OP], v[PEER]

    def done(self, rank: int) -> int:
        return self.ints[self.done_at + rank]

    def last(self, rank: int) -> Call | None:
        e = self.ints[self.last_at + rank]
        if e < 0:
            return None
        v = self._entry.unpack_from(self.ints, 8 * e * self.width)
        return self.decode(v, rank, e) if v[SEQ] > 0 else None

    def postmortem(self) -> str:
        """Each rank's last call, and which of them disagree: for a rank that died (Gloo aborts a
        rank whose receive does not match what was sent to it)."""
        last = {r: c for r in range(self.world) if (c := self.last(r)) is not None}
        if not last:
            return ""
        lines = [f"rank {r}'s last call: {describe(c)}" for r, c in sorted(last.items())]
        lines += [_clash(a, b) for a in last.values() for b in last.values() if a.rank < b.rank
                  and (a.job, a.key, a.seq) == (b.job, b.key, b.seq) and disagreement(a, b)]
        return "".join(f"\n  {line}" for line in lines)


def _padded(values, n: int) -> list[int]:
    values = list(values or ())[:n]
    return values + [0] * (n - len(values))


def _clash(a: Call, b: Call) -> str:
    return (f"ranks {a.rank} and {b.rank} disagree on their {ordinal(a.seq)} call on the same "
            f"{'link' if a.op in ('send', 'recv') else 'group'}: {disagreement(a, b)}")


def disagreement(a: Call, b: Call) -> str | None:
    """Why ``a`` and ``b``, the same call number on one channel, cannot pair up; None if they can."""
    if "send" in (a.op, b.op):  # a point-to-point message: what is sent against what is expected
        sent, got = (a, b) if a.op == "send" else (b, a)
        if sent.dtype is not None and got.dtype is not None and sent.dtype != got.dtype:
            return f"rank {sent.rank} sends {_dtype(sent.dtype)}, rank {got.rank} expects {_dtype(got.dtype)}"
        if sent.numel >= 0 and got.numel >= 0 and sent.numel != got.numel:
            return f"rank {sent.rank} sends {_n(sent.numel)}, rank {got.rank} expects {_n(got.numel)}"
        return None
    if a.op != b.op:
        return f"rank {a.rank} calls {a.op}, rank {b.rank} calls {b.op}"
    if a.dtype is not None and b.dtype is not None and a.dtype != b.dtype:
        return f"rank {a.rank}'s tensor is {_dtype(a.dtype)}, rank {b.rank}'s {_dtype(b.dtype)}"
    if a.op == "all_to_all" and a.sends and b.sends:
        for x, y in ((a, b), (b, a)):
            if x.sends[y.grank] != y.receives[x.grank]:
                return (f"rank {x.rank} sends rank {y.rank} {_n(x.sends[y.grank])}, where rank {y.rank} "
                        f"expects {_n(y.receives[x.grank])} from it")
        return None
    if a.numel >= 0 and b.numel >= 0 and a.numel != b.numel:
        return f"rank {a.rank} passes {_n(a.numel)}, rank {b.rank} {_n(b.numel)}"
    if a.numel >= 0 and b.numel >= 0 and a.sends != b.sends:  # the same total, cut differently
        return (f"rank {a.rank} passes {_n(a.numel)} in chunks {list(a.sends)}, rank {b.rank} the same "
                f"total in chunks {list(b.sends)}")
    if a.redop and b.redop and a.redop != b.redop:
        return f"rank {a.rank} reduces with {a.redop}, rank {b.rank} with {b.redop}"
    if a.root != b.root:
        return f"rank {a.rank} names rank {a.root} as the root, rank {b.rank} rank {b.root}"
    return None


def describe(c: Call) -> str:
    """'all_reduce of 1,056 float32 elements — Cell In[4], line 5, in f: dist.all_reduce(g)'."""
    what = {"barrier": "barrier", "send": f"send to rank {c.peer}", "recv": f"recv from rank {c.peer}"}
    text = what.get(c.op, c.op + (f" with root {c.root}" if c.root >= 0 else ""))
    if c.op == "all_to_all" and c.sends:
        text += f" sending {list(c.sends)} and receiving {list(c.receives)} elements"
    elif c.op != "barrier" and c.numel >= 0:
        text += f" of {_n(c.numel)}" + (f" in chunks {list(c.sends)}" if c.sends else "")
    if c.redop and c.redop != "SUM":
        text += f" with {c.redop}"
    if c.dtype is not None:
        text += f" ({_dtype(c.dtype)})"
    return f"{text} — {where_text(c.where)}"


def where_text(raw: str) -> str:
    """The calling lines: the learner's, and the library function it called if there is one."""
    parts = raw.split(SEP)
    frames = [parts[i:i + 3] for i in range(0, len(parts) - 2, 3)]
    if not frames:
        return "from an unknown line"
    said = [_frame(*f) for f in frames]
    return said[0] if len(said) == 1 else f"{said[0]}, called from {said[1]}"


def _frame(filename: str, lineno: str, name: str) -> str:
    line = linecache.getline(filename, int(lineno)).strip()
    if os.path.abspath(filename).startswith(LIBRARY_ROOT + os.sep) and os.path.exists(filename):
        at = f"{os.path.relpath(filename, LIBRARY_ROOT)}, line {lineno}"  # a library file, short
    else:
        at = f'File "{filename}", line {lineno}'  # as a traceback writes it: a notebook relabels cells
    return f"{at}, in {name}" + (f": {line}" if line else "")


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _n(numel: int) -> str:
    return f"{numel:,} element{'s' if numel != 1 else ''}"


def ordinal(k: int) -> str:
    return f"{k}{'th' if 10 <= k % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


def mismatch_message(channel: str, seq: int, a: Call, b: Call, why: str) -> str:
    """What a rank raises when its call and a peer's do not pair up (:mod:`.checked`)."""
    calls = f"\n  rank {a.rank}: {describe(a)}\n  rank {b.rank}: {describe(b)}\n"
    if "send" in (a.op, b.op):
        return (f"message mismatch on {channel}: its {ordinal(seq)} message does not fit the receive "
                f"({why}){calls}"
                "A receive must name the rank that sends, with a tensor of the size and dtype sent: sends "
                "and receives between two ranks pair up in order. Stopped before Gloo could abort a rank.")
    return (f"collective mismatch on {channel}: the ranks' {ordinal(seq)} calls there do not pair up "
            f"({why}){calls}"
            "Every rank must make the same collective calls in the same order, with the same sizes and "
            "dtypes: a call made on some ranks only meets the others' next call. Stopped before Gloo could "
            "abort a rank.")


def returned_message(channel: str, waiting: Call | None, gone: int, made: int, last: Call | None) -> str:
    """What a rank raises when it waits on a call a peer that returned never made (:mod:`.checked`)."""
    who = f"rank {waiting.rank}" if waiting is not None else "a rank"
    after = f"after {made} call{'s' if made != 1 else ''} there"
    after += f"; its last: {describe(last)}" if last else ""
    return (f"{UNMATCHED}{channel}: {who} makes a call that rank {gone} never makes (rank {gone} returned "
            f"from the function {after}), so {who} would wait for it until the timeout:\n"
            f"  {who}: {describe(waiting) if waiting is not None else 'a call'}\n"
            "Is this call made on some ranks only? Every rank must make its side of it.")
