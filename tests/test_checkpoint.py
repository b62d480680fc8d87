"""Chapter 4, section 9: FSDP2 with sharded DCP checkpoints survives a SIGKILLed rank.

One killed-and-resumed run on 2 real ranks (Gloo) is checked against an uninterrupted run on the
same world size; the checkpoints' files and folders are checked on disk.
"""

import os
import tempfile

import pytest

from lesson_lib.milestones import zero
from lesson_lib.milestones.zero import checkpoint
from lesson_lib.runtime import folders

pytestmark = pytest.mark.ch4

CFG = zero.Config.tiny(stage=3, world_size=2, steps=8)
PLAN = checkpoint.Plan(every=3, kill_step=7, kill_rank=1)  # checkpoints after steps 3 and 6


@pytest.fixture(scope="module")
def survived(clusters):
    return checkpoint.survive(CFG, PLAN, cluster=clusters(2))


def test_the_kill_surfaces_as_the_runtimes_error_naming_the_killed_rank(survived):
    # bug caught: the SIGKILL not delivered (the run finishes) or blamed on the rank that saw it
    assert survived["failed_rank"] == PLAN.kill_rank
    error = survived["error"]
    assert error.startswith("rank 1: worker process was killed (signal SIGKILL)"), error


def test_the_resumed_run_equals_the_uninterrupted_one_bit_for_bit_from_the_restored_step(survived):
    # bug caught: the optimizer state, a model shard or the step counter not restored (the losses
    # drift from the first resumed step), or the newest checkpoint not the one loaded
    base, restored = survived["uninterrupted"], survived["restored_step"]
    assert restored == 6
    assert list(survived["resumed"]) == list(range(restored, CFG.steps))
    # Same world size, same shards, same order of every sum: no rounding difference can arise, so
    # the comparison is exact (and the optimizer state skipped on load makes it fail).
    assert list(survived["resumed"].values()) == base[restored:]
    assert list(survived["killed"].values()) == base[:PLAN.kill_step]
    assert survived["redone_steps"] == PLAN.kill_step - restored


def test_each_rank_wrote_its_own_shard_of_every_tensor(survived):
    # bug caught: a full (unsharded) state dict written by one rank, or every rank writing it all
    keys, elements = survived["shards"]["keys"], survived["shards"]["elements"]
    assert set(keys) == {"__0_0.distcp", "__1_0.distcp"}, keys  # DCP's metadata: one file per rank
    weights = {f"model.{i}.weight" for i in range(0, 2 * CFG.depth + 1, 2)}
    moments = {f"optim.state.{i}.weight.exp_avg" for i in range(0, 2 * CFG.depth + 1, 2)}
    for f in keys:
        assert weights | moments <= set(keys[f]), keys[f]
    # Every layer's dims divide by 2: each file holds exactly half of the parameters and of Adam's
    # two moments, beside Adam's step counters (one scalar per parameter tensor), which DCP keeps once.
    half, scalars = 3 * zero.param_count(CFG) // 2, 2 * (CFG.depth + 1)
    assert all(half <= e <= half + scalars for e in elements.values()), (elements, half)
    assert sum(elements.values()) == 2 * half + scalars, elements


def test_no_checkpoint_folder_outlives_its_run(survived):
    # bug caught: a checkpoint folder left in the temporary directory after the run
    assert len(survived["folders"]) == 2
    for path in survived["folders"]:
        assert os.path.basename(path).startswith(f"{folders.PREFIX}{os.getpid()}_ckpt_"), path
        assert os.path.dirname(path) == tempfile.gettempdir()
        assert not os.path.exists(path), path


def test_the_figure_marks_the_kill_and_the_restore_and_draws_each_run_where_it_ran(survived):
    # bug caught: the resumed curve drawn from step 0, or the kill and the restore left unmarked
    from lesson_lib import plots

    fig = plots.checkpoint.resumed_loss(survived, "t")
    xs = {t.name: list(t.x) for t in fig.data}
    assert xs == {"uninterrupted": list(range(CFG.steps)), "rank 1 killed": list(range(PLAN.kill_step)),
                  "resumed on fresh processes": list(range(6, CFG.steps))}, xs
    lines = {s.x0 for s in fig.layout.shapes}
    assert {PLAN.kill_step, 6} <= lines and {2.5, 5.5} <= lines, lines  # and a line per checkpoint
    assert any("SIGKILL" in a.text for a in fig.layout.annotations)


def test_a_checkpoint_the_failure_interrupted_is_never_loaded(clusters):
    # bug caught: a folder without DCP's .metadata (a save cut short) taken as the newest checkpoint
    cfg = CFG.replace(steps=4)
    with tempfile.TemporaryDirectory() as folder:
        first = clusters(2).run(checkpoint.train, cfg, checkpoint.Plan(every=2), folder)
        os.remove(os.path.join(folder, "step-00004", checkpoint.DONE))
        again = clusters(2).run(checkpoint.train, CFG.replace(steps=5), checkpoint.Plan(every=5), folder)
    assert first[0]["start"] == 0 and again[0]["start"] == 2
    assert again[0]["losses"][:2] == first[0]["losses"][2:]


@pytest.mark.parametrize("change, name", [
    ({"every": 0}, "every"), ({"every": -2}, "every"), ({"every": 9}, "every"), ({"every": 2.0}, "every"),
    ({"kill_step": 8}, "kill_step"), ({"kill_step": -2}, "kill_step"),
    ({"kill_rank": 2}, "kill_rank"), ({"kill_rank": -1}, "kill_rank"),
])
def test_a_bad_plan_raises_naming_the_parameter(change, name):
    # bug caught: a run started with a checkpoint interval of 0 (never saves) or a kill past the run
    plan = checkpoint.Plan(**{"every": 3, "kill_step": 5, "kill_rank": 1, **change})
    with pytest.raises(ValueError, match=rf"^{name} must"):
        checkpoint.survive(CFG, plan)


def test_survive_needs_a_kill_and_a_matching_cluster():
    with pytest.raises(ValueError, match="^kill_step must"):
        checkpoint.survive(CFG, checkpoint.Plan(every=3))
    one_rank = type("Cluster", (), {"world_size": 1})()  # checked before anything runs
    with pytest.raises(ValueError, match="cluster has 1 ranks"):
        checkpoint.survive(CFG, PLAN, cluster=one_rank)


def test_youngs_interval():
    assert checkpoint.young_interval(2.0, 3600.0) == pytest.approx(120.0)
    with pytest.raises(ValueError, match="write_s and mtbf_s"):
        checkpoint.young_interval(0.0, 3600.0)


def test_the_error_counts_the_ranks_that_failed_after_the_killed_one():
    # bug caught: "(ranks 0 failed after it)" printed under section 9's kill
    from lesson_lib.runtime import WorkerError

    assert str(WorkerError(1, "killed", others=(0,))) == "rank 1: killed (rank 0 failed after it)"
    assert str(WorkerError(0, "x", others=(1, 2))) == "rank 0: x (ranks 1, 2 failed after it)"


@pytest.mark.numerics
def test_a_checkpoint_of_2_ranks_resumes_on_1_rank_equal_to_float_rounding(clusters):
    # bug caught: shards placed by rank on load instead of by their offsets in each tensor (DCP
    # reshards by the metadata): on another world size the resumed losses jump
    from lesson_lib import numerics

    cfg, every = CFG.replace(steps=6), 3
    with tempfile.TemporaryDirectory() as whole, tempfile.TemporaryDirectory() as cut:
        base = clusters(2).run(checkpoint.train, cfg, checkpoint.Plan(every=every), whole)[0]["losses"]
        clusters(2).run(checkpoint.train, cfg.replace(steps=every), checkpoint.Plan(every=every), cut)
        plan = checkpoint.Plan(every=every)
        one = clusters(1).run(checkpoint.train, cfg.replace(world_size=1), plan, cut)[0]
    assert one["start"] == every
    # One rank sums each gradient in another order than two: equal to rounding, as numerics.adam_drift
    # bounds it for this model (relative to the loss); a lost shard or a misplaced one is far above it.
    tol = numerics.adam_drift(cfg)["loss_rel"] * max(map(abs, base))
    gap = numerics.max_gap(one["losses"], base[every:])
    print(f"resumed on 1 rank: largest loss gap {gap:.1e}, rounding allows {tol:.1e}")
    assert gap <= tol, (one["losses"], base[every:], tol)
