"""Output says a thing once: exercise verdicts, the start-up progress line."""

import IPython.display
import pytest
import torch.distributed as dist
from IPython.core.formatters import DisplayFormatter

from lesson_lib.exercises import Exercise, Verdict
from lesson_lib.runtime.output import StartProgress


def _exercise():
    return Exercise(key="k", title="T", prompt="p", check=lambda a: Verdict(a == 1, "m"), hint="h",
                    solution="s")


def test_a_cell_ending_in_submit_shows_the_verdict_once(capsys, monkeypatch):
    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda *a, **k: shown.append(a))
    ex = _exercise()
    for answer, ok in ((1, True), (2, False), (..., False)):
        verdict = ex.submit(answer)
        assert isinstance(verdict, Verdict) and bool(verdict) is ok  # tests still read the object
        data, _ = DisplayFormatter().format(verdict)  # what a notebook's Out[] would carry
        assert data == {} and shown == []
        assert len(capsys.readouterr().out.strip().splitlines()) == 1  # the printed line alone
    # A Verdict nobody printed still shows itself.
    DisplayFormatter().format(Verdict(True, "direct"))
    assert shown and "direct" in str(shown[0])


def test_start_progress_final_line_covers_the_longest_progress_line(capsys):
    p = StartProgress(4, quiet=False)
    p.t0 -= 12.0  # started 12 s ago: "(12 s)" is longer than the final line's tail
    p(0)
    p.done()
    segments = capsys.readouterr().out.rstrip("\n").split("\r")[1:]
    assert segments[-1].startswith("lesson_lib: 4 ranks started in")
    assert len(segments[-1]) >= max(len(s) for s in segments[:-1])  # no stray ")" left on screen


def test_start_progress_counts_processes_as_they_come_up(capsys):
    # catches: "0/64 ready" for a minute while the processes import torch one by one (the group
    # forms only when all are up, so "ready" alone jumps from 0 to 64)
    p = StartProgress(64, quiet=False)
    p(0, 40)
    line = capsys.readouterr().out
    assert "40/64 processes up, 0/64 in the process group" in line, line


def test_the_start_counts_each_process_up_before_the_group_forms():
    # catches: STARTED messages not counted, so a big start shows "0/64" until the group forms. The
    # parent's collect loop is fed a start-up as it arrives (each message a little later than the
    # last), with no real processes: a real 2-rank start forms its group too fast to watch.
    import queue
    import time
    from types import SimpleNamespace

    from lesson_lib.runtime import Cluster
    from lesson_lib.runtime.messages import Kind, Message

    class Slow(queue.Queue):
        def get(self, timeout=None):
            time.sleep(0.06)  # past the loop's 50 ms poll, so every message is seen by a poll
            return super().get(block=False)

    q = Slow()
    for m in (Message(Kind.STARTED, 0, 0), Message(Kind.STARTED, 1, 0), Message(Kind.READY, 0, 0),
              Message(Kind.READY, 1, 0)):
        q.put(m)
    c = Cluster.__new__(Cluster)
    alive = SimpleNamespace(exitcode=None)
    c.world_size, c.backend, c._procs, c._out_q = 2, "gloo", [alive] * 2, q
    c._tmp = c._report = c._native = c._ledger = None
    seen = []
    c._collect(0, kinds=(Kind.READY,), on_ready=lambda ready, started: seen.append((ready, started)))
    assert (0, 2) in seen and all(s >= r for r, s in seen), seen


def _gloo_size_mismatch():
    import torch
    import torch.distributed as dist

    if dist.get_rank() == 0:
        dist.send(torch.ones(4), 1)
    else:
        dist.recv(torch.empty(3), 0)  # another size than was sent: Gloo aborts the process


def _writes_below_python():
    import os

    os.write(2, b"native hello\n")  # as a C++ library does, around sys.stderr
    return 1


@pytest.mark.slow
def test_a_rank_gloo_aborts_is_named_with_its_last_words_and_nothing_leaks(capfd, monkeypatch):
    # catches: "terminate called after throwing an instance of 'gloo::EnforceNotMet'" spilled unmarked
    # into the cell beside the runtime's own message. The collective check would name the mismatch
    # before Gloo sees it (test_collective_mismatch.py): recorded only, Gloo aborts as it would.
    from lesson_lib.runtime import Cluster, WorkerError, ledger

    monkeypatch.setenv(ledger.ENV, "record")
    with Cluster(2, quiet=True) as c:
        with pytest.raises(WorkerError) as e:
            c.run(_gloo_size_mismatch, timeout_s=20)
    said = str(e.value)
    assert "SIGABRT" in said and "last words" in said and "gloo" in said.lower(), said
    err = capfd.readouterr().err
    assert "terminate called" not in err, err


@pytest.mark.slow
def test_what_a_rank_writes_below_python_reaches_the_cell_marked(capfd):
    from lesson_lib.runtime import Cluster

    with Cluster(2, quiet=True) as c:
        assert c.run(_writes_below_python) == [1, 1]
        err = capfd.readouterr().err
    assert "[rank 0] native hello" in err and "[rank 1] native hello" in err, err


def _warns_like_torch():
    import warnings

    warnings.warn("this collective is deprecated", FutureWarning, stacklevel=1)
    return dist.get_rank()


def test_a_warning_from_every_rank_is_shown_once_per_kernel(clusters, capfd):
    # bug caught: 8-16 lines of the same FutureWarning, one per rank and job
    from lesson_lib.runtime import output

    output._WARNED.clear()
    for _ in range(2):
        assert clusters(2).run(_warns_like_torch) == [0, 1]
    err = capfd.readouterr().err
    assert err.count("FutureWarning: this collective is deprecated") == 1, err
    assert "[rank" not in err.split("this collective is deprecated")[0].splitlines()[-1], err


def _says_hello():
    print(f"hello from {dist.get_rank()}")
    return dist.get_rank()


def test_a_verdict_follows_the_banners_of_the_clusters_its_checker_started_whole(capsys):
    # catches: each cluster's banner printed where it started, among the ranks' output of the
    # checker's cases, instead of once, together, ahead of the verdict
    from lesson_lib.runtime import Cluster

    def check(answer):
        for n in (2, 1):  # two cases, each on a cluster started for it
            with Cluster(n) as c:
                c.run(_says_hello)
        return Verdict(False, "the first line of the verdict\nand its second line")

    ex = Exercise(key="k", title="T", prompt="p", check=check, hint="h", solution="s")
    assert not ex.submit(1)
    lines = capsys.readouterr().out.strip().splitlines()
    banners = [i for i, line in enumerate(lines) if line.startswith("lesson_lib: ")]
    verdict = lines.index("[T] ✗ not yet — the first line of the verdict")
    assert lines[verdict:] == ["[T] ✗ not yet — the first line of the verdict", "and its second line"]
    assert [lines[i].split(" — ")[0] for i in banners] == ["lesson_lib: 2 rank(s)", "lesson_lib: 1 rank(s)"]
    said = lines[banners[0]:verdict]  # the banners (a warning line may follow one), then the verdict
    assert all(line.startswith(("lesson_lib: ", "  warning: ")) for line in said), lines
    assert sum(line.startswith("[rank ") for line in lines[:banners[0]]) == 3, lines  # the ranks first


def test_a_notice_is_said_once_per_cell(capsys, monkeypatch):
    from lesson_lib.runtime import output

    cell = ["cell", 1]
    monkeypatch.setattr(output, "_scope", lambda: tuple(cell))
    for _ in range(2):
        output.notice("lesson_lib: 2 rank(s) — Gloo on CPU")
    cell[1] = 2
    output.notice("lesson_lib: 2 rank(s) — Gloo on CPU")
    assert capsys.readouterr().out.count("lesson_lib: 2 rank(s)") == 2  # once in each cell


def test_in_a_notebook_notices_go_to_the_place_kept_ahead_of_the_figure(capsys, monkeypatch):
    # catches: a banner printed between a live plot and its caption, when the runs it shows start a
    # cluster after the plot is on screen
    from lesson_lib.runtime import output

    shown = []

    class Handle:
        def update(self, obj, **kwargs):
            shown.append(obj["text/plain"])

    monkeypatch.setattr(output, "_shell", lambda: object())
    monkeypatch.setattr(output, "_scope", lambda: ("cell", 7))
    monkeypatch.setattr(output, "_NOTICES", {"said": set(), "held": None, "block": None, "scope": None})
    monkeypatch.setattr(IPython.display, "display", lambda *a, **k: Handle())
    output.reserve()  # the live plot is about to be shown
    print("the figure, then its caption")
    output.notice("lesson_lib: 4 rank(s) — Gloo on CPU\n  warning: 4 ranks on 2 CPU cores")
    output.notice("lesson_lib: 2 rank(s) — Gloo on CPU")
    assert capsys.readouterr().out == "the figure, then its caption\n"
    assert shown[-1] == ("lesson_lib: 4 rank(s) — Gloo on CPU\n  warning: 4 ranks on 2 CPU cores\n"
                         "lesson_lib: 2 rank(s) — Gloo on CPU")
