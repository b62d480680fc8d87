"""Chapter 0's seeding lesson on real ranks: one seed on every rank draws the same numbers, a seed per
rank different ones, and no seed set in one job reaches the next."""

import pytest

from lesson_lib.chapters import ch00
from lesson_lib.chapters.ch00_seeds import draws_job

pytestmark = pytest.mark.ch0


@pytest.mark.parametrize("world_size", [2, 3])
def test_one_seed_draws_the_same_on_every_rank_and_a_seed_per_rank_does_not(clusters, world_size, capsys):
    out = ch00.seeding(base=7, n=3, cluster=clusters(world_size))
    assert out["same"] == {"not seeded": False, "torch.manual_seed(base) on every rank": True,
                           "torch.manual_seed(base + rank)": False}
    shared, per_rank = out["draws"]["torch.manual_seed(base) on every rank"], \
        out["draws"]["torch.manual_seed(base + rank)"]
    assert len(shared) == world_size and all(len(d) == 3 for d in shared)
    assert per_rank[0] == shared[0]  # rank 0's base + 0 is base
    assert len({tuple(d) for d in per_rank}) == world_size  # every rank its own numbers
    assert not out["carried_over"] and len({tuple(d) for d in out["next_job"]}) == world_size
    printed = capsys.readouterr().out
    assert "the same on every rank" in printed and "no seed carries from one job to the next" in printed


def test_the_job_seeds_as_a_single_process_would(clusters):
    import torch

    torch.manual_seed(5)
    want = torch.rand(2).tolist()
    assert clusters(2).run(draws_job, 5, False, 2) == [want, want]
    assert clusters(2).run(draws_job, 4, True, 2)[1] == want  # rank 1 seeded 4 + 1
