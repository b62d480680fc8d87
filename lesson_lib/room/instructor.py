"""The instructor's side: ``room.open(name)`` opens a room, and each ``room.run(activity)`` is one round.

Rounds are chapter 10's quorum: whoever has joined and is idle when the instructor starts a round
takes part; a learner who joins later waits for the next one. The instructor's kernel watches the
round from its main thread (and, for the parameter server, is rank 0 in a thread of its own): it
reads each member's status from the store, checks every member's process every 0.1 s, and ends the
round when all have reported, when one has left (their process is gone: named at once, the round
discarded), or at the round's deadline, naming whom it waited for and what they were doing.
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass, field

from . import place, ring, server, steps
from .rank import RankContext, describe, end_world, say_error, start_world

POLL_S = 0.1
SETTLE_S = 5.0  # how long a round waits for the last one's members to report idle
START_MARGIN_S = 15.0  # a round's deadline: the collective timeout plus this for starting worlds
ACTIVITIES = {"ring": "learners only", "server": "instructor is rank 0", "steps": "learners only"}
MIN_MEMBERS = {"ring": 2, "server": 1, "steps": 1}


@dataclass
class Round:
    """One round: who took part, what each did, and the room's verdict."""

    n: int
    activity: str
    members: list[str]
    names: list[str]
    opts: dict
    started: float = field(default_factory=time.time)
    seconds: float = 0.0
    statuses: dict = field(default_factory=dict)
    results: dict = field(default_factory=dict)
    left: dict = field(default_factory=dict)  # learner -> seconds into the round when it was seen gone
    errors: list[str] = field(default_factory=list)
    waited_for: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    verdict: str = ""
    ok: bool = False
    discarded: bool = False
    summary: dict = field(default_factory=dict)
    running: bool = True
    deadline_s: float = 0.0


class Room:
    """An open room. ``learners()`` is who has joined; ``run(activity, ...)`` plays one round;
    ``close()`` ends it (also when this kernel exits)."""

    def __init__(self, name: str, size: int | None = None, base=None, timeout_s: float = 20.0,
                 private: bool = False):
        self.name, self.size, self.timeout_s = name, size, timeout_s
        if private:  # a rehearsal: a folder of this process's own, removed with the room
            base = place.private_base()
        self.folder = place.make_folder(name, base)
        self.store = place.store(self.folder)
        place.put(self.store, "current", -1)
        self.joined: dict[str, dict] = {}
        self.rounds: list[Round] = []
        self.accepted: list[int] = []
        self.listeners: list = []
        self._extra: dict = {"rehearsal": None, "base": base if private else None}  # close() ends these too
        self._read = 0
        self._finalizer = weakref.finalize(self, _close, self.folder, self.store, self._extra)

    # --- who is here -----------------------------------------------------------------------------
    def refresh(self) -> dict[str, dict]:
        count = self.store.add("joins", 0)
        while self._read < count:
            j = place.get(self.store, f"join/{self._read + 1}")
            if j is None:  # counted but not yet written: next time
                break
            self._read += 1
            self.joined[j["name"]] = j  # a rejoin under the same name replaces the old entry
        return self.joined

    def learners(self) -> dict[str, str]:
        """Every learner who joined and what they are: ready, in a round, or gone."""
        self.refresh()
        out = {}
        for name, j in self.joined.items():
            if not place.alive(j["pid"]):
                out[name] = "gone"
                continue
            idle = place.get(self.store, f"idle/{name}") or {}
            if idle.get("left") and idle.get("pid") == j["pid"]:
                out[name] = "left"
                continue
            busy = place.get(self.store, f"busy/{name}", -1)
            ready = idle.get("pid") == j["pid"] and idle.get("round", -1) >= busy
            out[name] = "ready" if ready else "in a round"
        return out

    def _settle(self, timeout_s: float = SETTLE_S) -> None:
        """Let the last round's members who reported finish tidying up (world closed, marked idle),
        bounded: one still busy after ``timeout_s`` sits this round out. A member stuck in their own
        code never reported, and is not waited for."""
        if not self.rounds:
            return
        reported = set(self.rounds[-1].results)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(
                self.learners().get(m) == "in a round" for m in reported):
            time.sleep(0.02)

    def ready(self) -> list[str]:
        return [n for n, s in self.learners().items() if s == "ready"]

    # --- a round ---------------------------------------------------------------------------------
    def run(self, activity: str, size: int | None = None, **opts) -> Round:
        if activity not in ACTIVITIES:
            raise ValueError(f"no activity {activity!r}: one of {sorted(ACTIVITIES)}")
        if not self._finalizer.alive:
            raise RuntimeError(f"room {self.name!r} is closed")
        self._settle()
        members = self.ready()[: size or self.size or None]
        if len(members) < MIN_MEMBERS[activity]:
            raise RuntimeError(f"{activity} needs {MIN_MEMBERS[activity]} ready learners; ready now: "
                               f"{members or 'nobody'} (joined: {self.learners() or 'nobody'})")
        n = len(self.rounds)
        names = (["instructor"] if activity == "server" else []) + members
        timeout_s = float(opts.pop("timeout_s", self.timeout_s))
        start_s = float(opts.pop("start_s", START_MARGIN_S))
        opts = {"seed": n, "timeout_s": timeout_s, "accepted": list(self.accepted), **opts}
        rnd = Round(n, activity, members, names, opts)
        self.rounds.append(rnd)
        place.put(self.store, f"round/{n}", {"round": n, "activity": activity, "members": members,
                                            "names": names, "pids": [self.joined[m]["pid"] for m in members],
                                            "opts": opts})
        place.put(self.store, "current", n)
        mine: dict = {}
        thread = None
        if activity == "server":
            thread = threading.Thread(target=self._serve, args=(rnd, mine), daemon=True,
                                      name=f"room {n} server")
            thread.start()
        deadline = time.monotonic() + timeout_s + start_s
        rnd.deadline_s = timeout_s + start_s
        start = time.monotonic()
        while True:
            self._poll(rnd, start)
            server_done = thread is None or not thread.is_alive()
            if server_done and all(m in rnd.results or m in rnd.left for m in members):
                break
            if time.monotonic() > deadline:
                rnd.waited_for = [m for m in members if m not in rnd.results and m not in rnd.left]
                if thread is not None and thread.is_alive():
                    rnd.waited_for.insert(0, "instructor (the server)")
                break
            self._notify(rnd)
            time.sleep(POLL_S)
        if thread is not None:
            thread.join(timeout=timeout_s)
        rnd.seconds, rnd.running = time.monotonic() - start, False
        self._judge(rnd, mine)
        place.put(self.store, f"r{n}/verdict", {"ok": rnd.ok, "verdict": rnd.verdict})  # members read it
        self._notify(rnd)
        return rnd

    def _serve(self, rnd: Round, out: dict) -> None:
        ctx = RankContext(round=rnd.n, rank=0, names=rnd.names, opts=rnd.opts, store=self.store,
                          me="instructor")
        try:
            start_world(ctx, rnd.opts["timeout_s"])
            out["result"] = server.server(ctx)
        except Exception as error:
            out["error"] = describe(error)
        finally:
            end_world()

    def _poll(self, rnd: Round, start: float) -> None:
        for m in rnd.names:
            s = place.get(self.store, f"r{rnd.n}/s/{m}")
            if s is not None:
                rnd.statuses[m] = s
            if m in rnd.members and m not in rnd.results:
                done = place.get(self.store, f"r{rnd.n}/done/{m}")
                if done is not None:
                    rnd.results[m] = done
                elif m not in rnd.left and not place.alive(self.joined[m]["pid"]):
                    rnd.left[m] = time.monotonic() - start
                    rnd.statuses[m] = {"state": "left"}
                    rnd.events.append(f"{m} left the room {rnd.left[m]:.1f} s into round {rnd.n}: "
                                      "their kernel stopped")

    def _judge(self, rnd: Round, mine: dict) -> None:
        for m, r in rnd.results.items():
            if not r["ok"] and r["error"]["own"]:
                rnd.errors.append(say_error(m, r["error"]))
        if "error" in mine and not rnd.left:
            rnd.errors.append(say_error("instructor (the server)", mine["error"]))
        failed = [m for m, r in rnd.results.items() if not r["ok"]]
        if rnd.left or rnd.errors or failed or rnd.waited_for:
            rnd.discarded, rnd.ok = True, False
            parts = []
            if rnd.left:
                parts.append("left mid-round: " + ", ".join(f"{m} (seen {t:.1f} s in)"
                                                              for m, t in rnd.left.items()))
            if rnd.errors:
                parts.append("raised: " + "; ".join(rnd.errors))
            if rnd.waited_for:
                what = ", ".join(f"{m} ({_doing(rnd.statuses.get(m.split()[0]))})" for m in rnd.waited_for)
                parts.append(f"the room waited {rnd.deadline_s:.0f} s for {what}")
            hit = [m for m in failed if not rnd.results[m]["error"]["own"]]
            if hit:
                parts.append("their peers' collectives failed with them: " + ", ".join(hit))
            rnd.verdict = f"round {rnd.n} ({rnd.activity}) discarded: " + "; ".join(parts)
            return
        if rnd.activity == "ring":
            rnd.summary = ring.check(rnd.members, rnd.results)
        elif rnd.activity == "server":
            rnd.summary = server.summarize(rnd.members, mine["result"], rnd.results)
        else:
            rnd.summary = steps.summarize(rnd.members, rnd.results)
            if rnd.summary["ok"]:
                self.accepted.append(rnd.n)
        rnd.ok, rnd.verdict = rnd.summary["ok"], f"round {rnd.n} ({rnd.activity}): {rnd.summary['verdict']}"

    def _notify(self, rnd: Round) -> None:
        for fn in self.listeners:
            fn(self, rnd)

    # --- the end ---------------------------------------------------------------------------------
    def rehearse(self, **kw):
        """Start learner processes of this room's own (lesson_lib.room.rehearsal): see there."""
        from .rehearsal import Rehearsal

        if self._extra["rehearsal"] is not None:
            self._extra["rehearsal"].stop()
        self._extra["rehearsal"] = Rehearsal(self, **kw)
        return self._extra["rehearsal"]

    def close(self) -> None:
        """Tell every learner the room is closed, stop rehearsal learners, remove the room's folder."""
        self._finalizer.detach()
        _close(self.folder, self.store, self._extra)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _doing(status: dict | None) -> str:
    if not status:
        return "never started"
    s = status.get("state", "?")
    if status.get("for"):
        s += f" for {status['for']}"
    if status.get("hop") is not None:
        s += f", hop {status['hop']}"
    if status.get("step") is not None:
        s += f", step {status['step']}"
    return s


def _close(folder, store, extra: dict) -> None:
    try:
        place.put(store, "closed", True)
    except Exception:  # the folder may already be gone
        pass
    if extra.get("rehearsal") is not None:
        extra["rehearsal"].stop()
    place.remove_folder(folder)
    if extra.get("base"):
        place.remove_folder(extra["base"])


def open_room(name: str, size: int | None = None, base=None, timeout_s: float = 20.0,
              private: bool = False) -> Room:
    """Open room ``name`` on this server (instructor). ``size`` caps how many take part in a round;
    ``private`` puts it in a temporary folder of this process's own (a rehearsal)."""
    return Room(name, size=size, base=base, timeout_s=timeout_s, private=private)


__all__ = ["ACTIVITIES", "Room", "Round", "open_room"]
