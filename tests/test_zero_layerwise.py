"""LARS and LAMB under ZeRO (chapters 4 and 5): every stage equals single-process training, and the
norms' extra traffic is counted and equals its formula."""

import pytest

from lesson_lib import run
from lesson_lib.milestones import zero
from lesson_lib.milestones.zero.layerwise import norm_traffic

pytestmark = [pytest.mark.ch4, pytest.mark.ch5]


@pytest.mark.numerics
@pytest.mark.parametrize("optimizer", ["lamb", "lars"])
def test_every_stage_equals_single_process_training(clusters, optimizer):
    cfg = zero.Config(world_size=4, optimizer=optimizer, lr=0.01, weight_decay=1e-3, steps=6, hidden=32)
    ref = zero.layerwise_reference(cfg)  # = a loop written out: test_single_process_references
    # LAMB/LARS move each layer by about lr·‖w‖ per step, so after `steps` steps a real error (a
    # wrong norm, a missed shard) shows at ~lr·steps·‖w‖ ≈ 1e-2 of the weights; float32 rounding of
    # sums taken in another order stays below 1e-5 of the weights over these few steps.
    tol = 1e-3 * cfg.lr * cfg.steps
    for stage in (0, 1, 2, 3):
        r = run("zero", cfg.replace(stage=stage), cluster=clusters(4))
        gap = max(abs(a - b) for a, b in zip(r["final_params"], ref["params"]))
        assert gap <= tol, (stage, gap, tol)
        assert max(abs(a - b) for a, b in zip(r.losses, ref["losses"])) <= 1e-5 * max(ref["losses"])
        assert r["norm_traffic_per_step"] == r["norm_traffic_formula"], stage
        assert (sum(r["norm_traffic_per_step"]) > 0) == (stage > 0)  # stage 0 holds whole layers


def test_a_wrong_norm_is_caught_by_the_tolerance(clusters):
    """Each rank's slice alone instead of the all-reduced norm must fail the comparison above."""
    cfg = zero.Config(world_size=2, optimizer="lamb", lr=0.01, steps=6, hidden=32, stage=1)
    ref = zero.layerwise_reference(cfg)
    clusters(2).run(_local_norms, True)  # the workers' module, patched for one run
    try:
        r = run("zero", cfg, cluster=clusters(2))
    finally:
        clusters(2).run(_local_norms, False)
    gap = max(abs(a - b) for a, b in zip(r["final_params"], ref["params"]))
    assert gap > 1e-3 * cfg.lr * cfg.steps, gap


def _local_norms(on: bool) -> None:
    from lesson_lib.milestones.zero import layerwise as zl

    if on:
        zl._saved, zl.sharded_norm = zl.sharded_norm, lambda t: t.float().norm()
    else:
        zl.sharded_norm = zl._saved


def test_norm_traffic_formula_by_hand():
    # one float32 over a ring of 2: a rank sends the one chunk that holds it once (4 bytes) per norm
    assert norm_traffic(8, 2, 0) == 2 * 8 * 4
    assert norm_traffic(8, 1, 0) == 0


def test_bad_optimizer_and_decay_name_the_parameter():
    with pytest.raises(ValueError, match="optimizer"):
        zero.Config(optimizer="adagrad").validate()
    with pytest.raises(ValueError, match="weight_decay"):
        zero.Config(optimizer="lamb", weight_decay=-1).validate()
