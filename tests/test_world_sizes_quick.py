"""The quick loop's version of test_world_sizes.py (issue 58), which runs every checker on real ranks
and is slow: here no rank starts. Every chapter's reference is submitted with the runtime's clusters
and chapter 10's replica launcher replaced by recorders that note the world size asked for and stop
that case; ``judge`` goes on to the next case, so every world size a checker would run shows. A
checker that runs a learner's code on ranks must ask for two world sizes at least, unless its
question names one (test_world_sizes.ONE_SIZE_BY_DESIGN, which says why for each)."""

import importlib
import sys

import pytest
from test_solutions import CASES, CHAPTERS
from test_world_sizes import ONE_SIZE_BY_DESIGN

from lesson_lib.exercises import Verdict
from lesson_lib.milestones import parameter_server
from lesson_lib.runtime import cluster as cluster_module
from lesson_lib.runtime import idle, pool
from lesson_lib.runtime import replicas as replicas_module


class _Asked(BaseException):  # not an Exception: no checker's own `except Exception` swallows it
    pass


@pytest.fixture
def asked(monkeypatch):
    seen: list[int] = []

    def init(self, world_size, *args, **kwargs):
        self.world_size = world_size

    def run(self, *args, **kwargs):
        seen.append(self.world_size)
        raise _Asked

    def replicas_run(job, n, *args, **kwargs):
        seen.append(n)
        raise _Asked

    monkeypatch.setattr(pool, "_WARM", {})  # the fakes never join the real pool of warm clusters
    monkeypatch.setattr(idle, "announce", lambda: None)  # nor tell other kernels that one started
    monkeypatch.setattr(cluster_module.Cluster, "__init__", init)
    monkeypatch.setattr(cluster_module.Cluster, "running", property(lambda self: False))
    monkeypatch.setattr(cluster_module.Cluster, "close", lambda self, *a, **k: None)
    monkeypatch.setattr(cluster_module.Cluster, "run", run)
    monkeypatch.setattr(replicas_module, "run", replicas_run)
    # chapter 1's worker-step checker trains its single-process reference before any case (11 s)
    monkeypatch.setattr(parameter_server, "reference", lambda cfg: [])
    judge_module = importlib.import_module("lesson_lib.exercises.judge")
    original = judge_module.judge

    def every_case(cases, properties, done=""):
        for _, case in cases:
            try:
                case()
            except _Asked:
                pass
        return Verdict(True, "world sizes recorded")

    for name, module in list(sys.modules.items()):
        if name.startswith("lesson_lib") and getattr(module, "judge", None) is original:
            monkeypatch.setattr(module, "judge", every_case)
    monkeypatch.setattr(judge_module, "judge", every_case)
    return seen


def _sizes(chapter, key, asked) -> set[int]:
    ex = CHAPTERS[chapter]()[key]
    try:
        ex.check(ex.reference())
    except _Asked:  # a checker that runs ranks outside judge: the first world size it asked for
        pass
    except (IndexError, KeyError):  # one that reads, after judge, results the recorders never made
        pass
    return set(asked)


@pytest.mark.parametrize("chapter, key", CASES, ids=[f"{c}-{k}" for c, k in CASES])
def test_a_checker_on_ranks_asks_for_two_world_sizes(chapter, key, asked):
    sizes = _sizes(chapter, key, asked)
    if sizes and (chapter, key) not in ONE_SIZE_BY_DESIGN:  # a formula alone runs on no ranks
        assert len(sizes) >= 2, f"{chapter} {key}: judged only at world size {sizes}"


def test_the_recorders_see_the_checkers_on_ranks(asked):
    # not vacuous: chapter 10's exchange (replica launcher) and outer step (clusters) are seen, each
    # at the sizes its prompt states
    assert _sizes("10", "exchange", asked) == {2, 3}
    asked.clear()
    assert _sizes("10", "outer", asked) == {2, 4}
