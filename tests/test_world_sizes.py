"""Every checker that runs a learner's code on ranks judges it at two world sizes at least:
a wrong answer that is right at one world size (an average divided by 2, a ring that only works for
N = 2) must not pass. Each reference is submitted with Cluster.run recorded (and chapter 10's replica
launcher, whose replica groups are processes that may die); the world sizes its checker used are
counted, from the runs themselves, not from the checker's code."""

import pytest
from test_solutions import CASES, CHAPTERS

from lesson_lib import close_all
from lesson_lib.runtime import cluster as cluster_module
from lesson_lib.runtime import replicas as replicas_module

pytestmark = pytest.mark.slow  # every checker once, as test_solutions does


# Checkers whose question names its world size: a number or layout confirmed by a run at that size, or
# an exchange that is two ranks by definition. Each says why; any other checker on ranks needs two.
ONE_SIZE_BY_DESIGN = {
    ("01", "divergence"): "a number, confirmed by the run the question describes (4 workers, 1 server)",
    ("03", "smallest_m"): "a number of micro-batches for the question's 4 stages, confirmed by a run",
    ("05", "scaling"): "a warm-up length, confirmed by the question's 2-rank runs",
    ("06", "crossover"): "a formula, confirmed by the question's 2-rank runs",
    ("07", "pingpong"): "a ping-pong is two ranks by definition",
    ("08", "layout"): "the question is a layout of 8 ranks",
}


@pytest.fixture(scope="module", autouse=True)
def _close_clusters():
    yield
    close_all()


@pytest.fixture
def world_sizes(monkeypatch):
    seen: list[int] = []
    run = cluster_module.Cluster.run

    def recording(self, *args, **kwargs):
        seen.append(self.world_size)
        return run(self, *args, **kwargs)

    monkeypatch.setattr(cluster_module.Cluster, "run", recording)
    launch = replicas_module.run

    def recording_replicas(job, n, *args, **kwargs):
        seen.append(n)
        return launch(job, n, *args, **kwargs)

    monkeypatch.setattr(replicas_module, "run", recording_replicas)
    return seen


@pytest.mark.parametrize("chapter, key", CASES, ids=[f"{c}-{k}" for c, k in CASES])
def test_a_checker_on_ranks_uses_two_world_sizes(chapter, key, world_sizes):
    ex = CHAPTERS[chapter]()[key]
    verdict = ex.submit(ex.reference())
    assert verdict, verdict.message
    if world_sizes and (chapter, key) not in ONE_SIZE_BY_DESIGN:  # a formula alone runs on no ranks
        assert len(set(world_sizes)) >= 2, f"{chapter} {key}: judged only at world size {set(world_sizes)}"


def test_every_one_size_exemption_is_a_real_checker():
    assert set(ONE_SIZE_BY_DESIGN) <= set(CASES)
