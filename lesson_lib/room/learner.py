"""The learner's side: ``room.join(name)`` makes this kernel one rank of the room.

The rank is the learner's kernel process itself, in a background thread: the learner's code runs
where their notebook runs, with their files and their Unix user, and the notebook stays free
between and during rounds. (A child process per rank would survive its kernel unless it watched
it, and would need the learner's functions pickled over; a thread dies with the kernel, which is
what a laptop lid closing or a SIGKILL should do to a rank.) A learner's exception is caught in
the thread, sent to the instructor with the learner's name and line, and printed here; the thread
then waits for the next round. See docs/room.md.
"""

from __future__ import annotations

import getpass
import os
import threading
import time
from typing import Callable

from . import place, ring, server, steps
from .rank import RankContext, describe, end_world, say_error, start_world

POLL_S = 0.05
LEARNER_SIDE = {"ring": ring.learner, "server": server.worker, "steps": steps.learner}


class Learner:
    """This kernel in a room. ``submit(activity, fn)`` hands the room your code for an activity;
    ``log`` lists what happened to you, round by round."""

    def __init__(self, room: str, name: str | None = None, work: int = 1, base=None, quiet: bool = False):
        self.room = place.check_name("room", room)
        self.name = place.check_name("name", name or getpass.getuser())
        self.folder = place.find_folder(room, base)
        self.store = place.store(self.folder)
        self._opening = place.opening(self.folder)
        self.submitted: dict[str, Callable] = {}
        self.mine: dict = {"work": work}
        self.log: list[str] = []
        self.quiet, self._stop = quiet, threading.Event()
        index = self.store.add("joins", 1)
        place.put(self.store, f"join/{index}", {"name": self.name, "pid": os.getpid(), "uid": os.getuid(),
                                                "at": time.time()})
        place.put(self.store, f"busy/{self.name}", -1)  # a rejoin starts idle, whatever it was before
        self._idle(-1)
        self._thread = threading.Thread(target=self._loop, name=f"room {room}: {self.name}", daemon=True)
        self._thread.start()
        self._say(f"joined room {room!r} as {self.name}: you take part from the instructor's next round")

    def submit(self, activity: str, fn: Callable) -> None:
        if activity not in LEARNER_SIDE:
            raise ValueError(f"no activity {activity!r}: one of {sorted(LEARNER_SIDE)}")
        if not callable(fn):
            raise TypeError("submit a function, e.g. me.submit('ring', my_step)")
        self.submitted[activity] = fn
        self._say(f"your {activity} code is in: it runs in the next {activity} round")

    def leave(self) -> None:
        """Stop taking part: the instructor sees you as left, and rounds go on without you."""
        self._stop.set()
        self._thread.join(timeout=30)
        place.put(self.store, f"idle/{self.name}", {"pid": os.getpid(), "round": -1, "left": True})
        self._say("you left the room")

    def _say(self, text: str) -> None:
        self.log.append(text)
        if not self.quiet:
            print(f"[room {self.room}] {text}", flush=True)

    def _idle(self, last: int) -> None:
        place.put(self.store, f"idle/{self.name}", {"pid": os.getpid(), "round": last})

    def _loop(self) -> None:
        seen, judged = -1, []  # judged: rounds played whose verdict the instructor has not written yet
        while not self._stop.is_set():
            try:
                if place.opening(self.folder) != self._opening:
                    raise FileNotFoundError("opened again since you joined: join again")
                for n in list(judged):  # the room's verdict on a round you played, as the instructor reads it
                    verdict = place.get(self.store, f"r{n}/verdict")
                    if verdict is not None:
                        judged.remove(n)
                        self._say(verdict["verdict"])
                if place.get(self.store, "closed"):
                    self._say("the instructor closed the room")
                    return
                current = place.get(self.store, "current", -1)
            except Exception as e:  # the folder is gone: the room was closed (or opened afresh)
                self._say(f"the room is gone ({type(e).__name__}: {e})")
                return
            if current > seen:
                seen = current
                plan = place.get(self.store, f"round/{current}")
                mine = plan and self.name in plan["members"] and (
                    plan["pids"][plan["members"].index(self.name)] == os.getpid())
                if mine:
                    place.put(self.store, f"busy/{self.name}", current)
                    self._play(plan)
                    self._idle(current)
                    judged.append(current)
                elif plan:
                    self._say(f"round {current} ({plan['activity']}) started without you: "
                              "you are in the next one")
            self._stop.wait(POLL_S)

    def _play(self, plan: dict) -> None:
        n, names = plan["round"], plan["names"]
        ctx = RankContext(round=n, rank=names.index(self.name), names=names, opts=plan["opts"],
                          store=self.store, me=self.name, submitted=self.submitted, mine=self.mine)
        activity = plan["activity"]
        own = self.submitted.get(activity)
        try:
            ctx.status("starting")
            start_world(ctx, plan["opts"].get("timeout_s", 20))
            result = {"ok": True, **LEARNER_SIDE[activity](ctx)}
        except Exception as error:
            e = describe(error, own)
            result = {"ok": False, "error": e}
            ctx.status("failed", error=e)
            said = say_error("your code", e) if e["own"] else f"{e['type']}: {e['message']}"
            self._say(f"round {n}: {said}")
        finally:
            end_world()  # closes our connections: a neighbour waiting on us fails now, not at its timeout
        place.put(self.store, f"r{n}/done/{self.name}", result)
        if result["ok"]:
            self._say(f"round {n} ({activity}): done")


def join(name: str, *, as_name: str | None = None, work: int = 1, base=None, quiet: bool = False) -> Learner:
    """Join room ``name`` from this kernel (as your Unix user name, or ``as_name``). ``work`` > 1
    makes this rank compute its gradients that many times over: a straggler, for rehearsal."""
    return Learner(name, as_name, work=work, base=base, quiet=quiet)
