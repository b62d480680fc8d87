"""The room's parts that need no process: the ring's judge, the error a learner's mistake becomes,
and the room's folder (docs/room.md). The room played by real kernels is tests/test_room_kernels.py.

The ring's judge is checked against a ring simulated here by hand (one loop, no code of the
room's), at two world sizes, with a step that is right at N = 2 and wrong at N = 3 and 4.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest
import torch

from lesson_lib.room import place, rank, ring

pytestmark = pytest.mark.ch11
NAMES = ["ada", "bob", "cy", "dee"]


def right(r, n, s):
    return (r - s) % n, (r - s - 1) % n


def right_only_at_two(r, n, s):
    return (r - s) % n, (r + 1) % n  # (r − 1) and (r + 1) are the same rank when n = 2


def simulate(steps: dict, n: int, seed: int = 3) -> dict:
    """A ring done by hand: every rank's chunks, each step's messages taken before any is added."""
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randint(-9, 10, (n, ring.CHUNK), generator=g).float() for _ in range(n)]
    held = [x.clone() for x in xs]
    hops: dict[int, list] = {r: [] for r in range(n)}
    for s in range(n - 1):
        plan = [steps[r](r, n, s) for r in range(n)]
        sent = [held[r][plan[r][0]].clone() for r in range(n)]
        for r in range(n):
            hops[r].append({"s": s, "to": (r + 1) % n, "from": (r - 1) % n, "send_i": plan[r][0],
                            "into_i": plan[r][1], "sent": sent[r].tolist(),
                            "received": sent[(r - 1) % n].tolist(), "seconds": 0.001, "bytes": 16})
        for r in range(n):
            held[r][plan[r][1]] += sent[(r - 1) % n]
    return {NAMES[r]: {"x": xs[r].flatten().tolist(), "final": held[r].tolist(), "hops": hops[r]}
            for r in range(n)}


@pytest.mark.parametrize("n", [2, 3, 4])
def test_a_right_ring_is_right(n):
    verdict = ring.check(NAMES[:n], simulate({r: right for r in range(n)}, n))
    assert verdict["ok"], verdict["verdict"]
    assert len(verdict["hops"]) == n * (n - 1)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_a_wrong_step_is_named_by_learner(n):
    culprit = 1
    steps = {r: (right_only_at_two if r == culprit else right) for r in range(n)}
    verdict = ring.check(NAMES[:n], simulate(steps, n))
    if n == 2:
        assert verdict["ok"], verdict["verdict"]  # right at N = 2: the judge must not blame it
        return
    assert not verdict["ok"] and verdict["wrong"]["learner"] == NAMES[culprit], verdict["verdict"]
    # bob adds into the wrong chunk at step 0, so his step-1 message is the first wrong one
    assert verdict["wrong"]["step"] == 1 and f"came from {NAMES[culprit]}" in verdict["verdict"]


def test_a_wrong_last_step_is_named_from_what_each_learner_holds():
    n = 3

    def slips_at_the_end(r, n, s):
        return (r - s) % n, ((r - s - 1) % n if s < n - 2 else (r - s) % n)

    verdict = ring.check(NAMES[:n], simulate({0: right, 1: right, 2: slips_at_the_end}, n))
    assert not verdict["ok"] and verdict["wrong"]["learner"] == "cy", verdict["verdict"]
    assert "ends without chunk 0" in verdict["verdict"]


def test_a_learners_error_names_their_line_and_a_peers_failure_is_not_theirs():
    def my_step(r, n, s):
        return [0, 1][n]

    try:
        my_step(0, 4, 0)
    except IndexError as error:
        e = rank.describe(error, my_step)
    assert e["own"] and e["where"]["function"] == "my_step" and e["where"]["code"] == "return [0, 1][n]"
    assert rank.say_error("bob", e).startswith("bob: IndexError: list index out of range, in my_step line ")
    peer = rank.describe(RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:4242"))
    assert peer["peer"] and not peer["own"]


def test_a_rooms_folder_is_private_and_names_are_checked(tmp_path):
    folder = place.make_folder("tuesday", tmp_path)
    mode = stat.S_IMODE(folder.stat().st_mode)
    assert mode in (0o700, 0o2770) and not mode & stat.S_IRWXO  # the instructor's, or the workshop group's
    assert not stat.S_IMODE((folder / place.STORE_FILE).stat().st_mode) & stat.S_IRWXO
    with pytest.raises(FileExistsError, match="already open"):
        place.make_folder("tuesday", tmp_path)
    (folder / "instructor.pid").write_text(f"{2**22 + 7} abc")  # its instructor's kernel is gone
    assert place.make_folder("tuesday", tmp_path) == folder  # opened afresh
    assert place.opening(folder).split()[0] == str(os.getpid())
    assert place.find_folder("tuesday", tmp_path) == folder
    with pytest.raises(FileNotFoundError, match="no room 'monday' is open"):
        place.find_folder("monday", tmp_path)
    with pytest.raises(ValueError, match="lowercase"):
        place.check_name("room", "../etc")
    assert place.alive(os.getpid()) and not place.alive(2**22 + 7)


def test_a_room_in_one_process_plays_a_round_and_a_leaver_is_left_out():
    """The whole path with no process started: this process's thread joins as a learner and plays
    one steps round alone (a world of one), is told its verdict, then leaves; the room then refuses
    to start a round."""
    from lesson_lib import room as rooms

    room = rooms.open("solo", private=True, timeout_s=10)
    folder = room.folder
    try:
        me = rooms.join("solo", as_name="ada", base=folder.parent, quiet=True)
        assert room.learners() == {"ada": "ready"}
        rnd = room.run("steps", steps=2)
        assert rnd.ok and rnd.members == ["ada"] and rnd.summary["end_step"] == 2, rnd.verdict
        deadline = time.monotonic() + 5  # the learner is told the room's verdict on their round
        while rnd.verdict not in me.log and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rnd.verdict in me.log, f"ada was not told the verdict within 5 s: {me.log}"
        me.leave()
        assert room.learners() == {"ada": "left"}
        with pytest.raises(RuntimeError, match="steps needs 1 ready learners; ready now: nobody"):
            room.run("steps")
    finally:
        room.close()
    assert not folder.exists() and not folder.parent.exists()


def test_a_round_past_its_deadline_names_whom_it_waited_for():
    """A learner whose rank never answers (here: one written into the store with this live process's
    id and no rank behind it, as a kernel stuck in its own code looks): the round ends at its
    deadline, discarded, naming them and what they were last seen doing."""
    from lesson_lib import room as rooms
    from lesson_lib.room import place as p

    room = rooms.open("ghost", private=True, timeout_s=0.5)
    try:
        index = room.store.add("joins", 1)
        p.put(room.store, f"join/{index}", {"name": "gus", "pid": os.getpid(), "uid": os.getuid(), "at": 0})
        p.put(room.store, "idle/gus", {"pid": os.getpid(), "round": -1})
        rnd = room.run("steps", start_s=0.5)
        assert rnd.discarded and rnd.waited_for == ["gus"], rnd.verdict
        assert "the room waited 1 s for gus (never started)" in rnd.verdict
        assert rnd.seconds < 5
    finally:
        room.close()


def test_a_rehearsals_folder_left_by_a_killed_kernel_is_removed_by_the_next(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    stale, live = tmp_path / "lesson-room-old", tmp_path / "lesson-room-live"
    for folder, pid in ((stale, 2**22 + 7), (live, os.getpid())):
        folder.mkdir()
        (folder / "pid").write_text(str(pid))
    base = place.private_base()
    assert not stale.exists() and live.exists() and (Path(base) / "pid").read_text() == str(os.getpid())



def _ring_figure(names, ms):
    """The dashboard's figure after a ring round in which ``names[i]`` sent to the next name in
    ``ms[i]`` milliseconds (a room and a round faked with just what the dashboard reads)."""
    from types import SimpleNamespace

    from lesson_lib.room.dashboard import Dashboard

    who = dict.fromkeys(names, "done")
    hops = [{"s": 0, "learner": m, "to_learner": names[(i + 1) % len(names)], "seconds": ms[i] / 1e3,
             "bytes": 16} for i, m in enumerate(names)]
    rnd = SimpleNamespace(names=names, members=names, statuses={}, n=0, activity="ring", running=False,
                          ok=True, summary={"hops": hops}, verdict="", events=[])
    return Dashboard(SimpleNamespace(name="ring", rounds=[rnd], listeners=[], learners=lambda: who)).fig


def test_two_learners_ring_arrows_lie_side_by_side_not_on_one_line():
    # the room's browser test drew two learners' hops as one arrow: the two, opposite, lay on one line
    arrows = [a for a in _ring_figure(["ann", "bob"], [1, 2]).layout.annotations if a.showarrow]
    assert sorted(a.text for a in arrows) == ["1.0 ms", "2.0 ms"]
    ann, bob = sorted(arrows, key=lambda a: a.text)  # ann at the top (0, 1), bob at the bottom (0, -1)
    assert ann.ay > ann.y and bob.ay < bob.y  # ann's points down to bob, bob's up to ann
    assert abs(ann.x - ann.ax) < 1e-9 and abs(bob.x - bob.ax) < 1e-9  # both upright, parallel,
    assert abs(ann.x - bob.x) >= 0.2  # and apart


def test_every_learners_ring_arrow_is_drawn_not_only_the_last():
    # each add_annotation inside the dashboard's batch_update started again from the annotations
    # before the batch: with three learners only the last hop's arrow stayed in the figure
    fig = _ring_figure(["ann", "bob", "cy"], [1, 2, 3])
    assert sorted(a.text for a in fig.layout.annotations if a.showarrow) == ["1.0 ms", "2.0 ms", "3.0 ms"]
    assert {a.text for a in fig.layout.annotations if not a.showarrow} == {"the room, live", "the last round"}
